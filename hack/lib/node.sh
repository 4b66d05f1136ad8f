# shellcheck shell=bash disable=SC2154 # the variables are local-stack.sh's
# Sourced by hack/local-stack.sh: the local stack's node. A real kubelet
# (built from k8s.io/kubernetes like the control plane), containerd and runc
# (Debian's packages), the CNI bridge, host-local, portmap and loopback
# plugins (Debian's containernetworking-plugins) and kube-proxy. The
# configuration files are hack/node/*, rendered with envsubst into
# $node_dir; everything the node keeps is under $node_dir, so `down` removes
# it all. Uses the variables and helpers of local-stack.sh.

# ensure_node_packages: containerd, runc, the CNI plugins, iptables and ipset, from
# Debian's packages when missing.
ensure_node_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  if netpol_enabled; then command -v ipset >/dev/null || missing+=(ipset); fi
  command -v envsubst >/dev/null || missing+=(gettext-base)
  [ ${#missing[@]} -eq 0 ] && return
  log "installing ${missing[*]} from Debian's packages"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >"$logs/apt.log" 2>&1 ||
    { tail -n 20 "$logs/apt.log" >&2; die "apt-get install ${missing[*]} failed (log: $logs/apt.log)"; }
}

# render FILE: hack/node/FILE with the node's settings substituted, into $node_dir.
render() {
  HCP_NODE_DIR=$node_dir HCP_STACK_DIR=$stack HCP_PKI=$pki HCP_NODE_IP=$node_ip HCP_NODE_NAME=$node_name \
    HCP_POD_BRIDGE=$bridge HCP_POD_CIDR=$pod_cidr HCP_PAUSE_IMAGE=$pause_image \
    HCP_KUBELET_PORT=$kubelet_port HCP_KUBELET_HEALTHZ_PORT=$kubelet_healthz_port \
    HCP_KUBE_PROXY_HEALTHZ_PORT=$kube_proxy_healthz_port HCP_KUBE_PROXY_METRICS_PORT=$kube_proxy_metrics_port \
    envsubst <"$root/hack/node/$1" >"$node_dir/$1"
}

# node_network: the pod bridge with the node's address, before anything
# binds to it (the API server advertises it, the kubelet serves on it). The
# CNI bridge plugin adopts the existing bridge. Its MAC address is pinned: a
# bridge whose MAC was never set takes the lowest of its ports' and changes
# when a pod's veth leaves, and the other pods' traffic to the node stalls
# until their neighbour entries expire.
node_network() {
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
    ip link set dev "$bridge" address 02:68:63:70:00:01
  fi
  ip addr replace "$node_ip/${pod_cidr#*/}" dev "$bridge"
  ip link set "$bridge" up
  sysctl -qw net.ipv4.ip_forward=1
  # RabbitMQ listens on 127.0.0.1 only (the machine's own broker): the
  # node's address:5672 is translated to it, which the kernel allows for
  # traffic arriving on the bridge only with route_localnet.
  sysctl -qw "net.ipv4.conf.$bridge.route_localnet=1"
  local r
  for r in broker_rule cluster_rule; do
    local -n rule=$r
    iptables -t nat -C PREROUTING "${rule[@]}" 2>/dev/null || iptables -t nat -A PREROUTING "${rule[@]}"
  done
}

# broker_rule: pods reach RabbitMQ (127.0.0.1:5672) at the node's address;
# cluster_rule: the same for the nodes of hack/rabbitmq-cluster.sh (5701-5703,
# when they run: make chaos).
broker_rule=(-p tcp -i "$bridge" -d "$node_ip" --dport 5672 -j DNAT --to-destination 127.0.0.1:5672
  -m comment --comment hcp-local-broker)
cluster_rule=(-p tcp -i "$bridge" -d "$node_ip" --dport 5701:5703 -j DNAT --to-destination 127.0.0.1
  -m comment --comment hcp-local-broker-cluster)

ctr_k8s() { ctr --address "$node_dir/containerd/containerd.sock" -n k8s.io "$@"; }
crictl_node() {
  printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\n' "$node_dir/containerd/containerd.sock" "$node_dir/containerd/containerd.sock" >"$node_dir/crictl.yaml"
  "$crictl" --config "$node_dir/crictl.yaml" "$@"
}

# build_crictl: crictl (cri-tools) from the Go module proxy, for `down` and
# for looking at the node (`local-stack.sh crictl ps`).
build_crictl() {
  crictl=$cache/bin/crictl-$crictl_version
  [ -x "$crictl" ] && return
  log "building crictl $crictl_version"
  mkdir -p "$cache/bin/crictl-build"
  GOBIN=$cache/bin/crictl-build with_progress crictl go install "sigs.k8s.io/cri-tools/cmd/crictl@$crictl_version" ||
    die "building crictl failed"
  mv "$cache/bin/crictl-build/crictl" "$crictl"
}

# build_images: `make images` for this machine's platform only (the node
# runs nothing else; `make release` builds every platform).
build_images() {
  (cd "$root" && with_progress images make -s images IMAGE_PLATFORMS="linux/$(go env GOARCH)") || die "make images failed"
}

# import_images [ARCHIVE...]: image archives (default: those of `make
# images`, bin/images/*.tar) into the node's containerd, under their full
# names (the CRI looks images up normalised). Importing an unchanged archive
# changes nothing. The names whose image changed go to
# $stack/images-changed, for `make demo` to replace the pods that run them.
import_images() {
  local f n=0 archives=("$@") before
  [ ${#archives[@]} -gt 0 ] || archives=("$root"/bin/images/*.tar)
  before=$(ctr_k8s images list 2>/dev/null | awk 'NR > 1 {print $1, $3}')
  for f in "${archives[@]}"; do
    [ -f "$f" ] || continue
    ctr_k8s images import "$f" >>"$logs/images.log" 2>&1 || die "importing $f into containerd failed (log: $logs/images.log)"
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || die "no image archives in $root/bin/images (make images)"
  ctr_k8s images list 2>/dev/null | awk 'NR > 1 {print $1, $3}' |
    grep -vxF -f <(echo "$before") | awk '{print $1}' >"$stack/images-changed" || true
  log "imported $n image archives into the node's containerd ($(wc -l <"$stack/images-changed") names changed)"
}

start_node() {
  mkdir -p "$node_dir/cni/net.d" "$node_dir/containerd" "$node_dir/kubelet" "$node_dir/pod-logs"
  render containerd.toml
  render kubelet-config.yaml
  render kube-proxy-config.yaml
  render cni.conflist
  mv "$node_dir/cni.conflist" "$node_dir/cni/net.d/10-hcp-local.conflist"
  start containerd "containerd --config $node_dir/containerd.toml" containerd --config "$node_dir/containerd.toml"
  wait_until "containerd serving" containerd ctr_k8s version
  import_images
  start kubelet "$kubelet --config" "$kubelet" --config="$node_dir/kubelet-config.yaml" \
    --kubeconfig="$stack/node.kubeconfig" --hostname-override="$node_name" --node-ip="$node_ip" \
    --root-dir="$node_dir/kubelet" --cert-dir="$node_dir/kubelet/pki"
  start kube-proxy "$kube_proxy --config" "$kube_proxy" --config="$node_dir/kube-proxy-config.yaml"
  wait_until "node $node_name Ready" kubelet k wait --for=condition=Ready "node/$node_name" --timeout=5s
  wait_until "kube-proxy healthy" kube-proxy curl -sf --max-time 3 "http://127.0.0.1:$kube_proxy_healthz_port/healthz"
}

# stop_node: the kubelet first (so nothing restarts), then every pod
# stopped and removed through the CRI (crictl rmp: the containers, the
# sandboxes and, through the CNI plugins, their network namespaces and
# addresses), kube-proxy's rules removed, containerd stopped, and whatever
# it still had mounted unmounted.
stop_node() {
  stop kube-proxy 10
  stop kubelet 20
  if running containerd && [ -x "${crictl:-}" ]; then
    crictl_node rmp --all --force >/dev/null 2>&1 || log "crictl rmp --all failed; the bridge's removal takes the pods' veths with it"
  fi
  stop containerd 20
  if [ -x "${kube_proxy:-}" ]; then
    "$kube_proxy" --cleanup >/dev/null 2>&1 || true
  fi
  iptables -t nat -D PREROUTING "${broker_rule[@]}" 2>/dev/null || true
  iptables -t nat -D PREROUTING "${cluster_rule[@]}" 2>/dev/null || true
  # The kubelet's own chains (kube-proxy --cleanup leaves them): its
  # firewall against connections to 127.0.0.0/8 from outside, and its canaries.
  local ipt t c
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      "$ipt" -t "$t" -D INPUT -j KUBE-FIREWALL 2>/dev/null || true
      "$ipt" -t "$t" -D OUTPUT -j KUBE-FIREWALL 2>/dev/null || true
      for c in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        "$ipt" -t "$t" -F "$c" 2>/dev/null && "$ipt" -t "$t" -X "$c" 2>/dev/null || true
      done
    done
  done
  local m
  for m in $(findmnt -rn -o TARGET | grep "^$node_dir/" | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
}

# container_pid NS/POD CONTAINER: the host pid of a running container's
# first process, from containerd (the container id is in the pod's status).
container_pid() {
  local ref=$1 container=$2 ns pod id
  ns=${ref%%/*}; pod=${ref#*/}
  [ "$ns" != "$ref" ] || { ns=default; pod=$ref; }
  id=$(k get pod -n "$ns" "$pod" -o jsonpath="{range .status.containerStatuses[?(@.name==\"$container\")]}{.containerID}{end}{range .status.initContainerStatuses[?(@.name==\"$container\")]}{.containerID}{end}") ||
    die "no pod $ns/$pod"
  id=${id#containerd://}
  [ -n "$id" ] || die "pod $ns/$pod has no container $container with an id (not started?)"
  ctr_k8s tasks list 2>/dev/null | awk -v id="$id" '$1 == id && $3 == "RUNNING" {print $2; found=1} END {exit !found}' ||
    die "container $container of pod $ns/$pod ($id) is not running"
}

# container_oom NS/POD CONTAINER: drives a container over its memory limit
# so that the kernel's OOM killer ends it, as a leak or a burst would. A
# process placed in the container's memory cgroup allocates until the
# container's first process is gone: the cgroup is charged for both, and
# the kernel kills the container's process, not the intruder, because the
# kubelet gives a Burstable or BestEffort container an oom_score_adj far
# above a host process's. The kubelet then reports the container
# OOMKilled and restarts it under the pod's restartPolicy.
container_oom() {
  local ref=${1:-} container=${2:-}
  [ -n "$ref" ] && [ -n "$container" ] || die "usage: $0 oom NAMESPACE/POD CONTAINER"
  local pid cg hog limit
  pid=$(container_pid "$ref" "$container")
  # cgroup v1's memory controller, else cgroup v2's unified hierarchy.
  cg=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print "/sys/fs/cgroup/memory" $3}' "/proc/$pid/cgroup")
  [ -n "$cg" ] || cg=$(awk -F: '$1 == "0" && $2 == "" {print "/sys/fs/cgroup" $3}' "/proc/$pid/cgroup")
  [ -n "$cg" ] && [ -f "$cg/cgroup.procs" ] || die "no memory cgroup for pid $pid ($cg)"
  limit=$(cat "$cg/memory.limit_in_bytes" 2>/dev/null || cat "$cg/memory.max")
  log "filling the memory cgroup of $ref container $container (pid $pid, limit $limit bytes)"
  # shellcheck disable=SC2016 # the scripts are perl's and sh's, not ours
  hog='my $pid = shift; my @held; while (kill(0, $pid)) { push @held, "x" x (1 << 20); select(undef, undef, undef, 0.002) }'
  HCP_HOG=$hog sh -c 'echo $$ >"$1/cgroup.procs" && exec perl -e "$HCP_HOG" "$2"' sh "$cg" "$pid" || true
  if kill -0 "$pid" 2>/dev/null; then
    die "container $container of $ref (pid $pid) survived its memory cgroup filling up"
  fi
  log "the kernel ended $ref container $container (pid $pid)"
}
