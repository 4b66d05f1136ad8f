# shellcheck shell=bash disable=SC2154 # the variables are local-stack.sh's
# Sourced by hack/local-stack.sh: NetworkPolicy on the local node. The CNI
# bridge plugin connects pods but enforces no NetworkPolicy, as on a
# cluster whose CNI does not. kube-router's network policy controller does,
# alone (--run-firewall; its routing, service proxy and CNI are off: the
# bridge and kube-proxy keep those jobs), with iptables and ipset on the
# bridged traffic (br_netfilter), as it does on production nodes. It reads
# Pods, Namespaces and NetworkPolicies with an identity of its own
# (hack/node/kube-router-rbac.yaml). HCP_STACK_NETPOL=0 leaves it out.
#
# kube-router v2.1.0 is the one version the module proxy serves here; it
# runs only on this test node, built from source into the cache, and is in
# no image the project ships.
kube_router_version=v2.1.0
kube_router_health_port=${HCP_KUBE_ROUTER_HEALTH_PORT:-20244}

netpol_enabled() { [ "${HCP_STACK_NETPOL:-1}" = 1 ]; }

# build_kube_router: kube-router from the Go module proxy into the cache.
build_kube_router() {
  kube_router=$cache/bin/kube-router-$kube_router_version
  netpol_enabled || return 0
  [ -x "$kube_router" ] && return
  log "building kube-router $kube_router_version (its network policy controller)"
  mkdir -p "$cache/bin/kube-router-build"
  GOBIN=$cache/bin/kube-router-build with_progress kube-router \
    go install "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$kube_router_version" ||
    die "building kube-router failed"
  mv "$cache/bin/kube-router-build/kube-router" "$kube_router"
}

# start_netpol: kube-router's network policy controller, once the node is
# registered (it reads its own Node's address).
start_netpol() {
  netpol_enabled || return 0
  k apply --server-side --force-conflicts --field-manager=hcp-local-stack -f "$root/hack/node/kube-router-rbac.yaml" >/dev/null ||
    die "applying hack/node/kube-router-rbac.yaml failed"
  start kube-router "$kube_router --run-firewall" "$kube_router" --run-firewall=true --run-router=false \
    --run-service-proxy=false --enable-cni=false --enable-ipv4=true --enable-ipv6=false \
    --kubeconfig="$stack/kube-router.kubeconfig" --hostname-override="$node_name" \
    --service-cluster-ip-range="$service_cidr" --health-port="$kube_router_health_port" --metrics-port=0
  wait_until "kube-router's network policy controller healthy" kube-router \
    curl -sf --max-time 3 "http://127.0.0.1:$kube_router_health_port/healthz"
}

# stop_netpol: kube-router stopped, and its iptables chains and ipsets
# removed. Not with `kube-router --cleanup-config`: in v2.1.0 it reports
# the policy controller's rules cleaned without removing them, then
# crashes in the service proxy's cleanup. Its rules live in the filter
# table only: jumps from INPUT, FORWARD and OUTPUT commented "kube-router
# netpol", and chains KUBE-ROUTER-*, KUBE-NWPLCY-*, KUBE-POD-FW-*; its
# ipsets are KUBE-SRC-* and KUBE-DST-*.
stop_netpol() {
  stop kube-router 10
  command -v iptables >/dev/null || return 0
  local c rule chains
  for c in INPUT FORWARD OUTPUT; do
    while rule=$(iptables -S "$c" 2>/dev/null | grep -m1 -- '--comment "kube-router netpol'); do
      eval "iptables ${rule/-A /-D }" || break
    done
  done
  chains=$(iptables -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-(ROUTER|NWPLCY|POD-FW)/ {print $2}')
  for c in $chains; do iptables -F "$c" 2>/dev/null || true; done
  for c in $chains; do iptables -X "$c" 2>/dev/null || true; done
  if command -v ipset >/dev/null; then
    for c in $(ipset list -n 2>/dev/null | grep -E '^KUBE-(SRC|DST)-' || true); do
      ipset destroy "$c" 2>/dev/null || true
    done
  fi
}
