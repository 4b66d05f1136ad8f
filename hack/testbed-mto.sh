#!/usr/bin/env bash
# The RabbitMQ messaging-topology-operator (MTO) for the test bed, built from its
# Go module (no images here), and the CRDs it needs.
#
#   testbed-mto.sh [build]   build the binary (idempotent: skipped when the
#                            version-stamped binary exists); prints its path on
#                            the last line of stdout
#   testbed-mto.sh crds      prints the directories holding the CRD YAMLs, one per
#                            line: MTO's config/crd/bases, then cluster-operator's
#                            (RabbitmqCluster: MTO needs it even when only
#                            connection Secrets are used)
#   testbed-mto.sh run --kubeconfig FILE --namespace NS
#                      [--health-probe-bind-address ADDR] [--metrics-bind-address ADDR]
#                      [-- EXTRA_MTO_FLAGS...]
#                            builds if needed, then execs the operator against FILE
#                            with ENABLE_WEBHOOKS=false OPERATOR_NAMESPACE=NS.
#                            Probes default to a free port, metrics are off
#                            ("0"), leader election is off (MTO's default), so
#                            several instances can run side by side.
#
# Versions come from go.mod (github.com/rabbitmq/messaging-topology-operator and
# github.com/rabbitmq/cluster-operator/v2); override with MTO_VERSION and
# CLUSTER_OPERATOR_VERSION. Cache: ${XDG_CACHE_HOME:-~/.cache}/hcp-operator.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "[testbed-mto] $*" >&2; }
die() { echo "[testbed-mto] ERROR: $*" >&2; exit 1; }

mto_mod=github.com/rabbitmq/messaging-topology-operator
co_mod=github.com/rabbitmq/cluster-operator/v2
mod_version() { (cd "$root" && go list -m -f '{{.Version}}' "$1" 2>/dev/null) || true; }
mto_version=${MTO_VERSION:-$(mod_version $mto_mod)}
mto_version=${mto_version:-v1.20.1}
# MTO v1.20.1 requires cluster-operator v2.22.3, whose archive the proxy does not serve.
co_version=${CLUSTER_OPERATOR_VERSION:-$(mod_version $co_mod)}
co_version=${co_version:-v2.22.4}

cache=${XDG_CACHE_HOME:-$HOME/.cache}/hcp-operator
work="$cache/mto-build-$mto_version"
bin="$cache/bin/messaging-topology-operator-$mto_version"

build() {
  if [ -x "$bin" ]; then
    log "messaging-topology-operator $mto_version already built"
    return
  fi
  # Test packages run in parallel and may all ask for the build: one builds, the others wait.
  mkdir -p "$cache"
  exec 9>"$cache/mto-build.lock"
  if command -v flock >/dev/null && ! flock -w 900 9; then
    die "another build still holds $cache/mto-build.lock after 15 min"
  fi
  if [ -x "$bin" ]; then
    log "messaging-topology-operator $mto_version built by another process"
    return
  fi
  log "building messaging-topology-operator $mto_version (cluster-operator $co_version) in $work (cold: a few minutes)"
  mkdir -p "$work" "$(dirname "$bin")"
  cd "$work"
  # fd 9 (the lock) is closed for go commands: a helper they leave running
  # (telemetry upload) must not keep the lock.
  [ -f go.mod ] || go mod init hcp-testbed-mto >/dev/null 2>&1 9>&-
  go mod edit -require="$mto_mod@$mto_version" -require="$co_mod@$co_version" 9>&-
  cat >tools.go <<GO
//go:build tools

package tools

import _ "$mto_mod/cmd"
GO
  log "resolving modules"
  go mod tidy >&2 9>&-
  local start=$SECONDS
  log "go build $mto_mod/cmd"
  # Build to a temporary name and rename, so an interrupted build never looks done.
  go build -trimpath -ldflags "-s -w" -o "$bin.tmp" "$mto_mod/cmd" 9>&-
  mv "$bin.tmp" "$bin"
  log "built $bin in $((SECONDS - start))s"
}

# module_dir MOD VERSION: the module's directory in the module cache.
module_dir() {
  local dir
  dir=$(cd "$root" && go list -m -f '{{.Dir}}' "$1" 2>/dev/null || true)
  if [ -z "$dir" ] || [ ! -d "$dir" ] || [ "$(mod_version "$1")" != "$2" ]; then
    dir=$(go mod download -json "$1@$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  fi
  [ -d "$dir" ] || die "cannot find $1@$2 in the module cache"
  echo "$dir"
}

crds() {
  local mto co
  mto=$(module_dir $mto_mod "$mto_version")/config/crd/bases
  co=$(module_dir $co_mod "$co_version")/config/crd/bases
  [ -f "$mto/rabbitmq.com_queues.yaml" ] || die "no MTO CRDs in $mto"
  [ -f "$co/rabbitmq.com_rabbitmqclusters.yaml" ] || die "no RabbitmqCluster CRD in $co"
  echo "$mto"
  echo "$co"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + RANDOM % 20000))
}

run() {
  local kubeconfig="" namespace="" probe="" metrics=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --kubeconfig) kubeconfig=$2; shift 2 ;;
      --kubeconfig=*) kubeconfig=${1#*=}; shift ;;
      --namespace) namespace=$2; shift 2 ;;
      --namespace=*) namespace=${1#*=}; shift ;;
      --health-probe-bind-address) probe=$2; shift 2 ;;
      --health-probe-bind-address=*) probe=${1#*=}; shift ;;
      --metrics-bind-address) metrics=$2; shift 2 ;;
      --metrics-bind-address=*) metrics=${1#*=}; shift ;;
      --) shift; break ;;
      *) die "run: unknown argument $1 (usage: $0 run --kubeconfig FILE --namespace NS [-- MTO flags])" ;;
    esac
  done
  [ -n "$kubeconfig" ] && [ -f "$kubeconfig" ] || die "run: --kubeconfig FILE is required and must exist"
  [ -n "$namespace" ] || die "run: --namespace NS is required"
  probe=${probe:-127.0.0.1:$(free_port)}
  (build)
  log "running $bin (namespace $namespace, probes on $probe, metrics $metrics)"
  # KUBECONFIG is what ctrl.GetConfigOrDie reads besides --kubeconfig; set both.
  # Webhooks need certificates and a Service: off. OPERATOR_NAMESPACE replaces
  # the in-cluster service-account namespace file.
  KUBECONFIG="$kubeconfig" ENABLE_WEBHOOKS=false OPERATOR_NAMESPACE="$namespace" \
    exec "$bin" --kubeconfig="$kubeconfig" --health-probe-bind-address="$probe" \
    --metrics-bind-address="$metrics" --leader-elect=false "$@"
}

cmd=${1:-build}
[ $# -gt 0 ] && shift
case "$cmd" in
  build) (build); echo "$bin" ;;
  crds) crds ;;
  run) run "$@" ;;
  path) echo "$bin" ;;
  *) die "usage: $0 [build|crds|path|run --kubeconfig FILE --namespace NS]" ;;
esac
