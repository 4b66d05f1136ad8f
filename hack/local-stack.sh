#!/usr/bin/env bash
# A local Kubernetes control plane and node, as processes, for `make demo` and
# the end-to-end suite. No container runtime is needed: Pods run as local
# processes under hack/podrunner (see its package documentation).
#
#   local-stack.sh up       build what is missing, start everything, wait until it works
#   local-stack.sh down     stop everything and remove the state
#   local-stack.sh status   what runs, and whether it answers
#   local-stack.sh env      shell exports for using the stack: eval "$(hack/local-stack.sh env)"
#   local-stack.sh exec NAMESPACE/POD [-c CONTAINER] -- COMMAND...
#                           run a command inside a pod's namespaces (network,
#                           mounts, hostname), like kubectl exec
#   local-stack.sh netns NAMESPACE/POD
#                           print the pod's network namespace (for ip netns exec)
#   local-stack.sh kill NAMESPACE/POD CONTAINER [SIGNAL]
#                           signal a container's processes (default KILL), like a crash
#   local-stack.sh freeze PROCESS SECONDS
#                           SIGSTOP a stack process (e.g. kube-apiserver), SIGCONT after
#
# What runs (all on this machine, state in $HCP_STACK_DIR):
#   etcd                     127.0.0.1:$HCP_ETCD_PORT
#   kube-apiserver           https://127.0.0.1:$HCP_APISERVER_PORT (certificates from openssl;
#                            RBAC + Node authorization, NodeRestriction)
#   kube-controller-manager  deployments, replicasets, GC, namespaces, service accounts and tokens, ...
#   kube-scheduler           binds Pods to the node
#   podrunner                the node "hcp-local": runs Pods as processes, one network
#                            namespace each, on bridge $HCP_POD_BRIDGE ($HCP_POD_CIDR; the node
#                            is its first address). Pods reach the API server through the
#                            kubernetes Service's ClusterIP and RabbitMQ at
#                            <node address>:5672 (relayed to 127.0.0.1:5672).
#   RabbitMQ                 ensured by hack/testbed-rabbitmq.sh (management on :15672)
#   messaging-topology-operator  built and run by hack/testbed-mto.sh, with its CRDs and
#                            cluster-operator's RabbitmqCluster CRD installed
#
# Binaries: kube-apiserver, etcd, kube-controller-manager and kubectl from
# hack/testbed-k8s.sh; kube-scheduler is built here the same way (same
# Kubernetes version, a copy of that throw-away module). Cold builds take
# minutes; progress is printed as packages compile.
#
# Needs root (network namespaces, mounts), openssl, curl, ip (iproute2) and nsenter.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/hcp-operator
stack=${HCP_STACK_DIR:-$cache/stack}
etcd_port=${HCP_ETCD_PORT:-12379}
etcd_peer_port=${HCP_ETCD_PEER_PORT:-12380}
api_port=${HCP_APISERVER_PORT:-16443}
kcm_port=${HCP_KCM_PORT:-10357}
sched_port=${HCP_SCHEDULER_PORT:-10359}
kubelet_port=${HCP_KUBELET_PORT:-10350}
mto_probe_port=${HCP_MTO_PROBE_PORT:-18081}
bridge=${HCP_POD_BRIDGE:-hcp0}
pod_cidr=${HCP_POD_CIDR:-10.250.0.0/16}
service_cidr=${HCP_SERVICE_CIDR:-10.251.0.0/16}
node_name=${HCP_NODE_NAME:-hcp-local}
node_cpu=${HCP_NODE_CPU:-16}
mto_namespace=rabbitmq-system
wait_s=${HCP_STACK_WAIT_SECONDS:-120}

# First addresses of the ranges: the node (bridge) and the kubernetes Service.
first_ip() { local net=${1%/*}; echo "${net%.*}.$(( ${net##*.} + 1 ))"; }
node_ip=$(first_ip "$pod_cidr")
kubernetes_svc_ip=$(first_ip "$service_cidr")

pki=$stack/pki
run=$stack/run
logs=$stack/logs
kubeconfig=$stack/kubeconfig

log() { echo "[local-stack] $*" >&2; }
die() { echo "[local-stack] ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------- builds

# shellcheck source=hack/lib/progress.sh
source "$root/hack/lib/progress.sh"

k8s_assets() {
  local out
  out=$(with_progress kubernetes "$root/hack/testbed-k8s.sh") || die "hack/testbed-k8s.sh failed"
  assets=$(echo "$out" | tail -n1)
  [ -x "$assets/kube-apiserver" ] || die "no kube-apiserver in $assets"
  k8s_version=v$(basename "$assets" | sed 's/-linux-amd64$//')
}

# kube-scheduler: hack/testbed-k8s.sh builds only what envtest needs, so build
# it here with the same recipe, in a copy of that script's throw-away module
# (the copy keeps concurrent runs of the script undisturbed).
build_scheduler() {
  scheduler=$cache/bin/kube-scheduler-$k8s_version
  [ -x "$scheduler" ] && return
  local ver=${k8s_version#v} work=$cache/scheduler-build-${k8s_version#v}
  local src=${TESTBED_BUILD_DIR:-$cache/k8s-build-$ver}
  [ -f "$src/go.mod" ] || die "no $src/go.mod: hack/testbed-k8s.sh did not leave its build module (set TESTBED_BUILD_DIR?)"
  log "building kube-scheduler $k8s_version in $work (warm Go cache: under a minute; cold: several)"
  mkdir -p "$work" "$cache/bin"
  cp "$src/go.mod" "$src/go.sum" "$work/"
  (cd "$work" && go mod edit -module=hcp-testbed-scheduler)
  local major=${ver%%.*} rest=${ver#*.}; local minor=${rest%%.*}
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor"
  (cd "$work" && with_progress kube-scheduler go build -ldflags "$ldflags" -o "$scheduler.tmp" k8s.io/kubernetes/cmd/kube-scheduler) ||
    die "building kube-scheduler failed"
  mv "$scheduler.tmp" "$scheduler"
}

build_podrunner() {
  podrunner=$stack/bin/podrunner
  mkdir -p "$stack/bin"
  log "building the pod runner (hack/podrunner, a Go module of its own)"
  (cd "$root/hack/podrunner" && GOWORK=off CGO_ENABLED=0 with_progress podrunner go build -o "$podrunner" .) || die "building hack/podrunner failed"
}

build_all() {
  k8s_assets
  build_scheduler
  build_podrunner
  with_progress topology-operator "$root/hack/testbed-mto.sh" build >/dev/null || die "hack/testbed-mto.sh build failed"
  kubectl=$assets/kubectl
}

# ---------------------------------------------------------------- certificates

# cert NAME CN ORG USAGE [SAN]: an EC key and a certificate signed by the stack's CA.
cert() {
  local name=$1 cn=$2 org=$3 usage=$4 san=${5:-}
  [ -f "$pki/$name.crt" ] && return
  local subj="/CN=$cn"
  if [ -n "$org" ]; then subj="/O=$org$subj"; fi
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    if [ -n "$san" ]; then echo "subjectAltName=$san"; fi
  } >"$pki/$name.ext"
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout "$pki/$name.key" \
    -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  chmod 600 "$pki/$name.key"
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}

# kubeconfig FILE CERTNAME: a kubeconfig for https://127.0.0.1:$api_port with a client certificate.
write_kubeconfig() {
  local file=$1 name=$2
  [ -f "$file" ] && return
  "$kubectl" --kubeconfig="$file" config set-cluster hcp-local --server="https://127.0.0.1:$api_port" \
    --certificate-authority="$pki/ca.crt" --embed-certs=true >/dev/null
  "$kubectl" --kubeconfig="$file" config set-credentials "$name" --client-certificate="$pki/$name.crt" \
    --client-key="$pki/$name.key" --embed-certs=true >/dev/null
  "$kubectl" --kubeconfig="$file" config set-context hcp-local --cluster=hcp-local --user="$name" >/dev/null
  "$kubectl" --kubeconfig="$file" config use-context hcp-local >/dev/null
  chmod 600 "$file"
}

make_pki() {
  mkdir -p "$pki"
  chmod 700 "$pki"
  if [ ! -f "$pki/ca.crt" ]; then
    log "creating the certificates (CA, API server, clients, service-account key) in $pki"
    openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout "$pki/ca.key" \
      -subj "/CN=hcp-local-ca" -days 3650 -out "$pki/ca.crt" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    chmod 600 "$pki/ca.key"
  fi
  if [ ! -f "$pki/sa.key" ]; then
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key" 2>/dev/null
    openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    chmod 600 "$pki/sa.key"
  fi
  cert apiserver kube-apiserver "" serverAuth \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$node_ip,IP:$kubernetes_svc_ip"
  cert admin hcp-admin system:masters clientAuth
  cert controller-manager system:kube-controller-manager "" clientAuth
  cert scheduler system:kube-scheduler "" clientAuth
  cert node "system:node:$node_name" system:nodes clientAuth
  cert kubelet "system:node:$node_name" system:nodes serverAuth "DNS:$node_name,IP:$node_ip"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
  write_kubeconfig "$kubeconfig" admin
  write_kubeconfig "$stack/controller-manager.kubeconfig" controller-manager
  write_kubeconfig "$stack/scheduler.kubeconfig" scheduler
  write_kubeconfig "$stack/node.kubeconfig" node
}

# ---------------------------------------------------------------- processes

pid_of() { cat "$run/$1.pid" 2>/dev/null || true; }

# running NAME: the recorded process is alive and is still the one we started.
running() {
  local pid; pid=$(pid_of "$1")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qE -- "$(cat "$run/$1.match")"
}

# start NAME MATCH CMD...: starts CMD in its own session, logging to
# $logs/NAME.log, unless it already runs. MATCH identifies it in /proc/PID/cmdline.
start() {
  local name=$1 match=$2; shift 2
  if running "$name"; then
    log "$name already running (pid $(pid_of "$name"))"
    return
  fi
  echo "$match" >"$run/$name.match"
  setsid "$@" >>"$logs/$name.log" 2>&1 </dev/null &
  echo $! >"$run/$name.pid"
  log "started $name (pid $!, log $logs/$name.log)"
}

stop() {
  local name=$1 grace=${2:-10} pid
  running "$name" || { rm -f "$run/$name.pid"; return 0; }
  pid=$(pid_of "$name")
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq $((grace * 5))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name did not stop within ${grace}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$run/$name.pid"
}

# wait_until WHAT NAME CMD...: polls CMD until it succeeds; fails with the
# component's log tail when NAME dies or the bound passes.
wait_until() {
  local what=$1 name=$2; shift 2
  local start=$SECONDS next=$((SECONDS + 10))
  until "$@" >/dev/null 2>&1; do
    # Checked twice: /proc/PID/cmdline reads empty for an instant while a
    # wrapper script execs the real binary (testbed-mto.sh does).
    if [ -n "$name" ] && ! running "$name" && ! { sleep 0.5; running "$name"; }; then
      tail -n 30 "$logs/$name.log" >&2 || true
      die "$name exited while waiting for: $what (log: $logs/$name.log)"
    fi
    if [ $((SECONDS - start)) -ge "$wait_s" ]; then
      [ -n "$name" ] && { tail -n 30 "$logs/$name.log" >&2 || true; }
      die "timed out after ${wait_s}s waiting for: $what${name:+ (log: $logs/$name.log)}"
    fi
    if [ $SECONDS -ge $next ]; then
      log "still waiting for: $what ($((SECONDS - start))s)"
      next=$((SECONDS + 10))
    fi
    sleep 0.5
  done
  log "$what ($((SECONDS - start))s)"
}

k() { "$kubectl" --kubeconfig="$kubeconfig" "$@"; }

api_ready() { curl -sf --max-time 3 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "https://127.0.0.1:$api_port/readyz"; }
https_healthz() { curl -skf --max-time 3 "https://127.0.0.1:$1/healthz"; }

# The image table the pod runner reads: what the project's images hold, as
# the Dockerfile builds them (hack/podrunner/images.go explains the format).
write_images() {
  cat >"$stack/images.yaml" <<EOF
# Which local binaries stand for which images (any tag). Written by
# hack/local-stack.sh; read by the pod runner at every container start.
images:
# The Dockerfile: distroless/static:nonroot, USER 65532:65532, ENTRYPOINT ["/manager"].
- repository: ghcr.io/hcp-io/hcp-operator
  entrypoint: ["/manager"]
  user: "65532:65532"
  env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"]
  files:
    /manager: $root/bin/manager
    /hcp-sidecar: $root/bin/hcp-sidecar
# The sample harnesses (cmd/sample-callee, cmd/sample-caller), same base image.
- repository: ghcr.io/hcp-io/hcp-sample-callee
  entrypoint: ["/sample-callee"]
  user: "65532:65532"
  env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
  files:
    /sample-callee: $root/bin/sample-callee
- repository: ghcr.io/hcp-io/hcp-sample-caller
  entrypoint: ["/sample-caller"]
  user: "65532:65532"
  env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
  files:
    /sample-caller: $root/bin/sample-caller
EOF
  if [ -f "${HCP_STACK_EXTRA_IMAGES:-}" ]; then
    # More images (e.g. test binaries): a file with more list items.
    sed -n '/^- /,$p' "$HCP_STACK_EXTRA_IMAGES" >>"$stack/images.yaml"
  fi
}

# ---------------------------------------------------------------- up

up() {
  [ "$(id -u)" = 0 ] || die "must run as root (pods get network namespaces and bind mounts)"
  for t in openssl curl ip nsenter go setsid; do
    command -v "$t" >/dev/null || die "$t is required"
  done
  local t0=$SECONDS
  mkdir -p "$stack" "$run" "$logs"
  log "state in $stack"

  build_all
  "$root/hack/testbed-rabbitmq.sh" >/dev/null || die "RabbitMQ is not available (hack/testbed-rabbitmq.sh)"
  make_pki
  write_images

  start etcd "$assets/etcd" "$assets/etcd" --name=hcp-local --data-dir="$stack/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="hcp-local=http://127.0.0.1:$etcd_peer_port" --unsafe-no-fsync=true
  wait_until "etcd healthy" etcd curl -sf --max-time 3 "http://127.0.0.1:$etcd_port/health"

  start kube-apiserver "$assets/kube-apiserver" "$assets/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address=127.0.0.1 --secure-port="$api_port" --advertise-address="$node_ip" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range="$service_cidr" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --allow-privileged=true --cert-dir="$stack/apiserver"
  wait_until "kube-apiserver ready at https://127.0.0.1:$api_port" kube-apiserver api_ready

  start kube-controller-manager "$assets/kube-controller-manager" "$assets/kube-controller-manager" \
    --kubeconfig="$stack/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$stack/controller-manager.kubeconfig" --authorization-kubeconfig="$stack/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$kcm_port" --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --service-cluster-ip-range="$service_cidr" --cert-dir="$stack/controller-manager"
  start kube-scheduler "$scheduler" "$scheduler" \
    --kubeconfig="$stack/scheduler.kubeconfig" \
    --authentication-kubeconfig="$stack/scheduler.kubeconfig" --authorization-kubeconfig="$stack/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$sched_port" --leader-elect=false --cert-dir="$stack/scheduler"
  wait_until "kube-controller-manager healthy" kube-controller-manager https_healthz "$kcm_port"
  wait_until "kube-scheduler healthy" kube-scheduler https_healthz "$sched_port"

  # A rebuilt runner replaces the running one (its pods restart, as on a
  # rebooted node).
  if running podrunner && [[ "$(readlink "/proc/$(pid_of podrunner)/exe")" == *" (deleted)" ]]; then
    log "the pod runner was rebuilt; restarting it"
    stop podrunner 40
  fi
  start podrunner "$podrunner" "$podrunner" --kubeconfig="$stack/node.kubeconfig" --node-name="$node_name" \
    --state-dir="$stack/podrunner" --log-dir="$logs" --images="$stack/images.yaml" \
    --bridge="$bridge" --pod-cidr="$pod_cidr" --bridge-address="$kubernetes_svc_ip" \
    --forward="$kubernetes_svc_ip:443=127.0.0.1:$api_port" \
    --forward="$node_ip:$api_port=127.0.0.1:$api_port" \
    --forward="$node_ip:5672=127.0.0.1:5672" \
    --kubelet-port="$kubelet_port" --tls-cert-file="$pki/kubelet.crt" --tls-private-key-file="$pki/kubelet.key" \
    --client-ca-file="$pki/ca.crt" --kubernetes-version="$k8s_version" --cpu="$node_cpu"
  wait_until "node $node_name Ready" podrunner k wait --for=condition=Ready "node/$node_name" --timeout=5s
  wait_until "default service account" kube-controller-manager k get serviceaccount default -n default

  log "installing the topology operator's CRDs and RabbitmqCluster's"
  local dirs
  dirs=$("$root/hack/testbed-mto.sh" crds) || die "hack/testbed-mto.sh crds failed"
  for d in $dirs; do
    k apply --server-side --force-conflicts -f "$d" >/dev/null || die "applying the CRDs in $d failed"
  done
  k wait --for=condition=Established crd --all --timeout=60s >/dev/null
  k create namespace "$mto_namespace" --dry-run=client -o yaml | k apply -f - >/dev/null
  start messaging-topology-operator "testbed-mto.sh run|messaging-topology-operator" "$root/hack/testbed-mto.sh" run \
    --kubeconfig "$kubeconfig" --namespace "$mto_namespace" --health-probe-bind-address "127.0.0.1:$mto_probe_port"
  wait_until "messaging-topology-operator ready" messaging-topology-operator curl -sf --max-time 3 "http://127.0.0.1:$mto_probe_port/readyz"

  write_env
  log "the local stack is up ($((SECONDS - t0))s): node $node_name at $node_ip, API server https://127.0.0.1:$api_port"
  log "  use it:  export KUBECONFIG=$kubeconfig   (or: eval \"\$(hack/local-stack.sh env)\")"
}

write_env() {
  cat >"$stack/env" <<EOF
export KUBECONFIG=$kubeconfig
export HCP_STACK_DIR=$stack
export HCP_STACK_NODE_IP=$node_ip
export HCP_STACK_AMQP_URL=amqp://$node_ip:5672
export HCP_STACK_MANAGEMENT_URL=http://127.0.0.1:15672
export HCP_STACK_LOGS=$logs
export PATH=$assets:\$PATH
EOF
}

# ---------------------------------------------------------------- down

down() {
  [ "$(id -u)" = 0 ] || die "must run as root"
  if [ ! -d "$stack" ]; then
    log "no stack in $stack"
  fi
  stop messaging-topology-operator 10
  # The pod runner stops every pod's processes and removes their namespaces.
  stop podrunner 40
  stop kube-scheduler 10
  stop kube-controller-manager 10
  stop kube-apiserver 15
  stop etcd 10
  # Leftovers of a runner that was killed.
  for pidfile in "$stack"/podrunner/pods/*/containers/*.pid; do
    [ -f "$pidfile" ] || continue
    read -r pid start_time <"$pidfile" || continue
    if [ -r "/proc/$pid/stat" ] && [ "$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f20)" = "$start_time" ]; then
      log "killing leftover container process $pid"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^hcp-/ {print $1}'); do
    ip netns del "$ns" 2>/dev/null || true
  done
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip link del "$bridge" || true
  fi
  # Mount points the pod runner had to create on this machine: empty ones go.
  if [ -f "$stack/podrunner/created-mountpoints" ]; then
    while read -r p; do
      if [ -d "$p" ]; then rmdir "$p" 2>/dev/null || true
      elif [ -f "$p" ] && [ ! -s "$p" ]; then rm -f "$p"
      fi
    done <"$stack/podrunner/created-mountpoints"
  fi
  rm -rf "$stack"
  log "the local stack is down; state removed"
}

# ---------------------------------------------------------------- status, env, exec

status() {
  local ok=0
  for n in etcd kube-apiserver kube-controller-manager kube-scheduler podrunner messaging-topology-operator; do
    if running "$n"; then
      printf '%-30s running (pid %s)\n' "$n" "$(pid_of "$n")"
    else
      printf '%-30s not running\n' "$n"; ok=1
    fi
  done
  if [ -f "$kubeconfig" ] && [ -n "${kubectl:-}" ]; then
    echo
    k get nodes -o wide 2>/dev/null || true
    echo
    k get pods -A -o wide 2>/dev/null || true
  fi
  return $ok
}

find_kubectl() {
  local assets
  assets=$("$root/hack/testbed-k8s.sh" 2>/dev/null | tail -n1) || true
  kubectl=$assets/kubectl
  [ -x "$kubectl" ] || die "no kubectl (run: hack/local-stack.sh up)"
}

# pod_pid NS/POD [CONTAINER]: the pid of a running container of the pod.
pod_pid() {
  local ref=$1 container=${2:-} ns pod uid f
  ns=${ref%%/*}; pod=${ref#*/}
  [ "$ns" != "$ref" ] || { ns=default; pod=$ref; }
  uid=$(k get pod -n "$ns" "$pod" -o jsonpath='{.metadata.uid}') || die "no pod $ns/$pod"
  # shellcheck disable=SC2086 # the container name (a DNS label) or a glob
  for f in "$stack/podrunner/pods/$uid/containers/"${container:-*}.pid; do
    [ -f "$f" ] || continue
    local pid; read -r pid _ <"$f"
    if kill -0 "$pid" 2>/dev/null; then echo "$pid"; return; fi
  done
  die "pod $ns/$pod has no running container${container:+ named $container}"
}

pod_exec() {
  local ref=${1:-} container=""
  [ -n "$ref" ] || die "usage: $0 exec NAMESPACE/POD [-c CONTAINER] -- COMMAND..."
  shift
  if [ "${1:-}" = -c ]; then container=$2; shift 2; fi
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || die "usage: $0 exec NAMESPACE/POD [-c CONTAINER] -- COMMAND..."
  local pid; pid=$(pod_pid "$ref" "$container")
  # Network, mounts and hostname of the container; the command runs as root
  # from this machine's filesystem (the container sees it too).
  exec nsenter -t "$pid" -n -m -u -- "$@"
}

# pod_kill NS/POD CONTAINER [SIGNAL]: signals a container's process group
# (default KILL), as an OOM kill or a crash would end it; the pod runner
# restarts it under the pod's restartPolicy.
pod_kill() {
  local ref=${1:-} container=${2:-} sig=${3:-KILL}
  [ -n "$ref" ] && [ -n "$container" ] || die "usage: $0 kill NAMESPACE/POD CONTAINER [SIGNAL]"
  local pid; pid=$(pod_pid "$ref" "$container")
  kill -"$sig" -- "-$pid"
  log "sent SIG$sig to $ref container $container (process group $pid)"
}

# freeze NAME SECONDS: stops a stack process (e.g. kube-apiserver) with
# SIGSTOP and resumes it after SECONDS: it accepts connections but answers
# nothing, as a hung or partitioned server does.
freeze() {
  local name=${1:-} secs=${2:-}
  [ -n "$name" ] && [ -n "$secs" ] || die "usage: $0 freeze PROCESS SECONDS (e.g. kube-apiserver 30)"
  running "$name" || die "$name is not running"
  local pid; pid=$(pid_of "$name")
  kill -STOP "$pid"
  log "froze $name (pid $pid) for ${secs}s"
  sleep "$secs"
  kill -CONT "$pid"
  log "resumed $name"
}

pod_netns() {
  local ref=${1:-} ns pod uid
  ns=${ref%%/*}; pod=${ref#*/}
  uid=$(k get pod -n "$ns" "$pod" -o jsonpath='{.metadata.uid}') || die "no pod $ref"
  echo "hcp-$uid"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up) up ;;
  down) down ;;
  status) find_kubectl; status ;;
  env)
    [ -f "$stack/env" ] || die "the local stack is not up (hack/local-stack.sh up)"
    cat "$stack/env" ;;
  exec) find_kubectl; pod_exec "$@" ;;
  netns) find_kubectl; pod_netns "$@" ;;
  kill) find_kubectl; pod_kill "$@" ;;
  freeze) freeze "$@" ;;
  *) die "usage: $0 up|down|status|env|exec NS/POD [-c CONTAINER] -- CMD...|netns NS/POD|kill NS/POD CONTAINER [SIGNAL]|freeze PROCESS SECONDS" ;;
esac
