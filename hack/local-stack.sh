#!/usr/bin/env bash
# A local Kubernetes cluster on this machine, for `make demo` and the
# end-to-end suite: the control plane as processes, and one real node: a
# kubelet with containerd and runc that runs the project's images (built
# offline by `make images`) as containers.
#
#   local-stack.sh up       build what is missing, start everything, wait until it works
#   local-stack.sh down     stop everything and remove the state
#   local-stack.sh status   what runs, and whether it answers
#   local-stack.sh env      shell exports for using the stack: eval "$(hack/local-stack.sh env)"
#   local-stack.sh images [ARCHIVE...]
#                           build the project's images for this machine's platform
#                           (make images) and import them into the node's containerd;
#                           with ARCHIVEs, import those only
#   local-stack.sh kill NAMESPACE/POD CONTAINER [SIGNAL]
#                           signal a container's first process (default KILL), like a crash
#   local-stack.sh oom NAMESPACE/POD CONTAINER
#                           drive a container over its memory limit: the kernel OOM-kills it
#   local-stack.sh pid NAMESPACE/POD CONTAINER
#                           the host pid of a container's first process
#   local-stack.sh freeze PROCESS SECONDS
#                           SIGSTOP a stack process (kube-apiserver, kubelet, etcd, ...),
#                           SIGCONT after SECONDS or when the command is ended (TERM, INT)
#   local-stack.sh pause NAMESPACE/POD CONTAINER SECONDS
#                           SIGSTOP a container's first process, SIGCONT after SECONDS or
#                           when the command is ended (the kubelet's probes still run)
#   local-stack.sh cut-api NAMESPACE/POD SECONDS
#                           cut a pod off from the API server (its Service and its real
#                           address, established connections too) and nothing else, for
#                           SECONDS or until the command is ended; then heal
#   local-stack.sh ctr ARGS...
#                           containerd's ctr on the node (namespace k8s.io)
#   local-stack.sh crictl ARGS...
#                           crictl on the node: crictl ps, crictl pods, crictl logs
#
# What runs (all on this machine, state in $HCP_STACK_DIR):
#   etcd                     127.0.0.1:$HCP_ETCD_PORT
#   kube-apiserver           https://127.0.0.1:$HCP_APISERVER_PORT, also on the node's address
#                            (certificates from openssl; RBAC + Node authorization, NodeRestriction)
#   kube-controller-manager  deployments, replicasets, GC, namespaces, service accounts and tokens, ...
#   kube-scheduler           binds Pods to the node
#   the node "hcp-local"     kubelet, containerd, runc, CNI bridge $HCP_POD_BRIDGE ($HCP_POD_CIDR;
#                            the node is its first address), kube-proxy (iptables),
#                            NetworkPolicy enforced by kube-router's policy controller
#                            (hack/lib/netpol.sh; HCP_STACK_NETPOL=0: none);
#                            configuration in hack/node/, see hack/lib/node.sh. Pods
#                            reach the API server through the kubernetes Service and
#                            RabbitMQ at <node address>:5672 (translated to 127.0.0.1:5672).
#   RabbitMQ                 ensured by hack/testbed-rabbitmq.sh (management on :15672)
#   messaging-topology-operator  built and run by hack/testbed-mto.sh, with its CRDs and
#                            cluster-operator's RabbitmqCluster CRD installed
#
# Binaries: kube-apiserver, etcd, kube-controller-manager and kubectl from
# hack/testbed-k8s.sh; kube-scheduler, kubelet and kube-proxy are built here
# the same way (same Kubernetes version, a copy of that throw-away module).
# Cold builds take minutes; progress is printed as packages compile.
#
# Needs root (a kubelet, network namespaces, iptables), openssl, curl, ip
# (iproute2); installs containerd, runc, containernetworking-plugins and
# iptables from Debian's packages when missing.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/hcp-operator
stack=${HCP_STACK_DIR:-$cache/stack}
etcd_port=${HCP_ETCD_PORT:-12379}
etcd_peer_port=${HCP_ETCD_PEER_PORT:-12380}
api_port=${HCP_APISERVER_PORT:-16443}
kcm_port=${HCP_KCM_PORT:-10357}
sched_port=${HCP_SCHEDULER_PORT:-10359}
kubelet_port=${HCP_KUBELET_PORT:-10250}
kubelet_healthz_port=${HCP_KUBELET_HEALTHZ_PORT:-10248}
kube_proxy_healthz_port=${HCP_KUBE_PROXY_HEALTHZ_PORT:-10256}
kube_proxy_metrics_port=${HCP_KUBE_PROXY_METRICS_PORT:-10249}
mto_probe_port=${HCP_MTO_PROBE_PORT:-18081}
bridge=${HCP_POD_BRIDGE:-hcp0}
pod_cidr=${HCP_POD_CIDR:-10.250.0.0/16}
service_cidr=${HCP_SERVICE_CIDR:-10.251.0.0/16}
node_name=${HCP_NODE_NAME:-hcp-local}
# The sandbox image of every pod, built by `make images` (hack/imagebuild).
pause_image=localhost/hcp-local/pause:1
crictl_version=v1.37.0
mto_namespace=rabbitmq-system
wait_s=${HCP_STACK_WAIT_SECONDS:-120}
# kube-controller-manager's client rate (its garbage collector's too); its
# own defaults unless set.
kcm_qps=${HCP_KCM_API_QPS:-20}
kcm_burst=${HCP_KCM_API_BURST:-30}

# First addresses of the ranges: the node (bridge) and the kubernetes Service.
first_ip() { local net=${1%/*}; echo "${net%.*}.$(( ${net##*.} + 1 ))"; }
node_ip=$(first_ip "$pod_cidr")
kubernetes_svc_ip=$(first_ip "$service_cidr")

pki=$stack/pki
run=$stack/run
logs=$stack/logs
kubeconfig=$stack/kubeconfig
node_dir=$stack/node

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

# build_k8s_bin NAME: a Kubernetes component hack/testbed-k8s.sh does not
# build (kube-scheduler, kubelet, kube-proxy), with the same recipe, in a
# copy of that script's throw-away module (the copy keeps concurrent runs of
# the script undisturbed). Sets $NAME's path in bin_path.
build_k8s_bin() {
  local name=$1
  bin_path=$cache/bin/$name-$k8s_version
  [ -x "$bin_path" ] && return
  local ver=${k8s_version#v} work=$cache/node-build-${k8s_version#v}
  local src=${TESTBED_BUILD_DIR:-$cache/k8s-build-$ver}
  [ -f "$src/go.mod" ] || die "no $src/go.mod: hack/testbed-k8s.sh did not leave its build module (set TESTBED_BUILD_DIR?)"
  log "building $name $k8s_version in $work (warm Go cache: a minute or two; cold: several)"
  mkdir -p "$work" "$cache/bin"
  if [ ! -f "$work/tools.go" ]; then
    # The control plane's module resolved only what its commands import.
    cp "$src/go.mod" "$src/go.sum" "$work/"
    (cd "$work" && go mod edit -module=hcp-testbed-node)
    printf '//go:build tools\n\npackage tools\n\nimport (\n%s)\n' \
      "$(printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' kube-scheduler kubelet kube-proxy)" >"$work/tools.go.tmp"
    mv "$work/tools.go.tmp" "$work/tools.go"
    log "resolving the modules of kube-scheduler, kubelet and kube-proxy"
    (cd "$work" && go mod tidy -e >/dev/null 2>&1) || true
  fi
  local major=${ver%%.*} rest=${ver#*.}; local minor=${rest%%.*}
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor"
  (cd "$work" && with_progress "$name" go build -ldflags "$ldflags" -o "$bin_path.tmp" "k8s.io/kubernetes/cmd/$name") ||
    die "building $name failed"
  mv "$bin_path.tmp" "$bin_path"
}

build_all() {
  k8s_assets
  build_k8s_bin kube-scheduler; scheduler=$bin_path
  build_k8s_bin kubelet; kubelet=$bin_path
  build_k8s_bin kube-proxy; kube_proxy=$bin_path
  build_crictl
  build_kube_router
  with_progress topology-operator "$root/hack/testbed-mto.sh" build >/dev/null || die "hack/testbed-mto.sh build failed"
  build_images
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
  cert kube-proxy system:kube-proxy "" clientAuth
  cert kube-router system:kube-router "" clientAuth
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
  write_kubeconfig "$kubeconfig" admin
  write_kubeconfig "$stack/controller-manager.kubeconfig" controller-manager
  write_kubeconfig "$stack/scheduler.kubeconfig" scheduler
  write_kubeconfig "$stack/node.kubeconfig" node
  write_kubeconfig "$stack/kube-proxy.kubeconfig" kube-proxy
  write_kubeconfig "$stack/kube-router.kubeconfig" kube-router
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

# shellcheck source=hack/lib/node.sh
source "$root/hack/lib/node.sh"
# shellcheck source=hack/lib/netpol.sh
source "$root/hack/lib/netpol.sh"

# ---------------------------------------------------------------- up

up() {
  [ "$(id -u)" = 0 ] || die "must run as root (a kubelet, network namespaces, iptables)"
  for t in openssl curl ip go setsid findmnt; do
    command -v "$t" >/dev/null || die "$t is required"
  done
  local t0=$SECONDS
  mkdir -p "$stack" "$run" "$logs"
  log "state in $stack"

  ensure_node_packages
  build_all
  "$root/hack/testbed-rabbitmq.sh" >/dev/null || die "RabbitMQ is not available (hack/testbed-rabbitmq.sh)"
  make_pki
  node_network

  # etcd skips fsync by default (a demo and the tests gain seconds); the
  # chaos suite (make chaos) sets HCP_ETCD_FSYNC=1, so an API server's
  # acknowledged write is on disk as in production, and a running etcd of
  # the other mode is restarted in this one (its data stays).
  local fsync_flag=--unsafe-no-fsync=true
  if [ "${HCP_ETCD_FSYNC:-0}" = 1 ]; then fsync_flag=--unsafe-no-fsync=false; fi
  if running etcd && ! tr '\0' ' ' <"/proc/$(pid_of etcd)/cmdline" | grep -q -- "$fsync_flag"; then
    log "etcd runs in the other fsync mode; restarting it with $fsync_flag"
    stop etcd
  fi
  start etcd "$assets/etcd" "$assets/etcd" --name=hcp-local --data-dir="$stack/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="hcp-local=http://127.0.0.1:$etcd_peer_port" "$fsync_flag"
  wait_until "etcd healthy" etcd curl -sf --max-time 3 "http://127.0.0.1:$etcd_port/health"

  start kube-apiserver "$assets/kube-apiserver" "$assets/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address=0.0.0.0 --secure-port="$api_port" --advertise-address="$node_ip" \
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
    --kube-api-qps="$kcm_qps" --kube-api-burst="$kcm_burst" \
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

  k apply --server-side --force-conflicts --field-manager=hcp-local-stack -f "$root/hack/node/pull-policy.yaml" >/dev/null ||
    die "applying hack/node/pull-policy.yaml failed"
  start_node
  start_netpol
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
export HCP_STACK_POD_LOGS=$node_dir/pod-logs
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
  # The node's tools as built by `up` (down never builds).
  kube_proxy=$(find "$cache/bin" -maxdepth 1 -name 'kube-proxy-v*' 2>/dev/null | sort | tail -n1)
  crictl=$cache/bin/crictl-$crictl_version
  stop_netpol
  stop_node
  stop kube-scheduler 10
  stop kube-controller-manager 10
  stop kube-apiserver 15
  stop etcd 10
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip link del "$bridge" || true
  fi
  rm -rf "$stack"
  log "the local stack is down; state removed"
}

# ---------------------------------------------------------------- status, env, exec

status() {
  local ok=0
  for n in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy kube-router messaging-topology-operator; do
    if [ "$n" = kube-router ] && ! netpol_enabled; then continue; fi
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

# pod_kill NS/POD CONTAINER [SIGNAL]: signals a container's first process
# (default KILL), as an OOM kill or a crash would end it; the kubelet
# restarts it under the pod's restartPolicy.
pod_kill() {
  local ref=${1:-} container=${2:-} sig=${3:-KILL}
  [ -n "$ref" ] && [ -n "$container" ] || die "usage: $0 kill NAMESPACE/POD CONTAINER [SIGNAL]"
  local pid; pid=$(container_pid "$ref" "$container")
  kill -"$sig" "$pid"
  log "sent SIG$sig to $ref container $container (pid $pid)"
}

# seconds_arg WHAT VALUE: VALUE is a whole number of seconds.
seconds_arg() {
  [[ $2 =~ ^[0-9]+$ ]] || die "$1: want a whole number of seconds, got '$2'"
}

# hold SECONDS: waits SECONDS, or less if this script is ended (TERM, INT,
# HUP): bash runs a trap only between commands, and `wait` is one it
# interrupts, where a foreground `sleep` would delay it to the end.
hold() {
  sleep "$1" &
  held=$!
  wait "$held" || true
}

# on_end CMD: runs CMD once when this script ends, however (an exit, TERM,
# INT, HUP; not KILL, which nothing survives), each of its commands even
# when one fails.
on_end() {
  # shellcheck disable=SC2064 # expanded now, on purpose
  trap "trap - EXIT; set +e; [ -z \"\${held:-}\" ] || kill \"\$held\" 2>/dev/null; $1" EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  trap 'exit 129' HUP
}

# freeze NAME SECONDS: stops a stack process (e.g. kube-apiserver, kubelet)
# with SIGSTOP and resumes it after SECONDS, or as soon as this command is
# ended: it accepts connections but answers nothing, as a hung or
# partitioned server does. A frozen kubelet neither probes nor stops its
# pods' containers; they keep running. "froze NAME" on stderr says the
# process is stopped.
freeze() {
  local name=${1:-} secs=${2:-}
  [ -n "$name" ] && [ -n "$secs" ] || die "usage: $0 freeze PROCESS SECONDS (e.g. kube-apiserver 30)"
  seconds_arg freeze "$secs"
  running "$name" || die "$name is not running"
  local pid; pid=$(pid_of "$name")
  on_end "kill -CONT $pid 2>/dev/null; log 'resumed $name (pid $pid)'"
  kill -STOP "$pid"
  log "froze $name (pid $pid) for at most ${secs}s"
  hold "$secs"
}

# pause_container NS/POD CONTAINER SECONDS: stops a container's first
# process with SIGSTOP and resumes it after SECONDS, or as soon as this
# command is ended; "paused NS/POD" on stderr says it is stopped. The
# kubelet still probes the container: a liveness probe that fails its
# threshold meanwhile gets it killed and restarted (freeze the kubelet too
# to keep it).
pause_container() {
  local ref=${1:-} container=${2:-} secs=${3:-}
  [ -n "$ref" ] && [ -n "$container" ] && [ -n "$secs" ] || die "usage: $0 pause NAMESPACE/POD CONTAINER SECONDS"
  seconds_arg pause "$secs"
  local pid; pid=$(container_pid "$ref" "$container")
  on_end "kill -CONT $pid 2>/dev/null; log 'resumed $ref container $container (pid $pid)'"
  kill -STOP "$pid"
  log "paused $ref container $container (pid $pid) for at most ${secs}s"
  hold "$secs"
}

# api_server_addresses: "IP PORT" lines of everything a pod may reach the
# API server at: the kubernetes Service and its endpoints (the API
# server's own address and port).
api_server_addresses() {
  k get service kubernetes -n default -o jsonpath='{.spec.clusterIP}{" "}{.spec.ports[?(@.name=="https")].port}{"\n"}'
  k get endpointslices -n default -l kubernetes.io/service-name=kubernetes \
    -o jsonpath='{range .items[*]}{range .endpoints[*].addresses[*]}{@}{" "}{end}{"|"}{.ports[?(@.name=="https")].port}{"\n"}{end}' |
    awk -F'|' '{n = split($1, a, " "); for (i = 1; i <= n; i++) print a[i], $2}'
}

# cut_api NS/POD SECONDS: in the pod's network namespace, drops every
# packet to and from the API server (its Service address and its real
# address and port, so established connections too) and nothing else (the
# broker stays reachable), for SECONDS or until this command is ended;
# then removes the rules. "cut NS/POD" on stderr says the cut is in place:
# checked by a connection that now fails, and one to the broker that
# still works.
cut_api() {
  local ref=${1:-} secs=${2:-}
  [ -n "$ref" ] && [ -n "$secs" ] || die "usage: $0 cut-api NAMESPACE/POD SECONDS"
  seconds_arg cut-api "$secs"
  command -v nsenter >/dev/null || die "nsenter (util-linux) is required"
  [[ $ref == */* ]] || die "cut-api: want NAMESPACE/POD, got '$ref'"
  local pid addrs ip port rules=() r first
  # Any container of the pod: they share its network namespace.
  first=$(k get pod -n "${ref%%/*}" "${ref#*/}" -o jsonpath='{.spec.containers[0].name}') || die "no pod $ref"
  pid=$(container_pid "$ref" "$first")
  addrs=$(api_server_addresses) || die "cannot read the kubernetes Service and its endpoints"
  [ "$(echo "$addrs" | grep -c .)" -ge 2 ] || die "want the kubernetes Service and at least one endpoint, got: $addrs"
  while read -r ip port; do
    [ -n "$ip" ] && [ -n "$port" ] || continue
    rules+=("OUTPUT -p tcp -d $ip --dport $port -j DROP -m comment --comment hcp-cut-api")
    rules+=("INPUT -p tcp -s $ip --sport $port -j DROP -m comment --comment hcp-cut-api")
  done <<<"$addrs"
  on_end "for r in $(printf '%q ' "${rules[@]}"); do nsenter -t $pid -n iptables -w -D \$r 2>/dev/null; done; log 'healed $ref: the API server is reachable again'"
  for r in "${rules[@]}"; do
    # shellcheck disable=SC2086 # a rule is words
    nsenter -t "$pid" -n iptables -w -I ${r%% *} 1 ${r#* } || die "iptables in the network namespace of $ref (pid $pid) failed"
  done
  while read -r ip port; do
    if nsenter -t "$pid" -n curl -sk -o /dev/null --max-time 2 "https://$ip:$port/livez"; then
      die "$ref still reaches the API server at $ip:$port"
    fi
  done <<<"$addrs"
  nsenter -t "$pid" -n timeout 3 bash -c ": </dev/tcp/$node_ip/5672" || die "$ref no longer reaches the broker at $node_ip:5672"
  log "cut $ref off from the API server ($(echo "$addrs" | tr '\n' ' ' | sed 's/ $//')) for at most ${secs}s; the broker stays reachable"
  hold "$secs"
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
  images)
    if [ $# -eq 0 ]; then build_images; fi
    import_images "$@" ;;
  kill) find_kubectl; pod_kill "$@" ;;
  oom) find_kubectl; container_oom "$@" ;;
  pid) find_kubectl; container_pid "$@" ;;
  freeze) freeze "$@" ;;
  pause) find_kubectl; pause_container "$@" ;;
  cut-api) find_kubectl; cut_api "$@" ;;
  ctr) ctr_k8s "$@" ;;
  crictl) build_crictl; crictl_node "$@" ;;
  *) die "usage: $0 up|down|status|env|images [ARCHIVE...]|kill NS/POD CONTAINER [SIGNAL]|oom NS/POD CONTAINER|pid NS/POD CONTAINER|freeze PROCESS SECONDS|pause NS/POD CONTAINER SECONDS|cut-api NS/POD SECONDS|ctr ARGS...|crictl ARGS..." ;;
esac
