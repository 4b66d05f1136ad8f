#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kubectl and etcd from Go modules
# at the Kubernetes version matching k8s.io/api in go.mod, into setup-envtest's
# layout outside the repo, so KUBEBUILDER_ASSETS works for envtest and the local stack.
# Idempotent: skips the build when the binaries are already there.
# Prints the asset directory on the last line of stdout.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
minor_api=$(cd "$root" && go list -m -f '{{.Version}}' k8s.io/api)   # v0.36.3
k8s_version="v1.${minor_api#v0.}"                                      # v1.36.3
k8s_version=${K8S_VERSION:-$k8s_version}
ver=${k8s_version#v}
assets_root=${ENVTEST_ASSETS_ROOT:-${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest/k8s}
dest="$assets_root/${ver}-linux-amd64"

log() { echo "[testbed-k8s] $*" >&2; }

if [ -x "$dest/kube-apiserver" ] && [ -x "$dest/etcd" ] && [ -x "$dest/kubectl" ] && [ -x "$dest/kube-controller-manager" ]; then
  log "binaries for $k8s_version already in $dest"
  echo "$dest"
  exit 0
fi

work=${TESTBED_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hcp-operator/k8s-build-$ver}
mkdir -p "$work" "$dest"
cd "$work"
log "building Kubernetes $k8s_version from Go modules in $work (cold: ~9 min on 2 cores; warm: seconds)"

if [ ! -f go.mod ]; then
  go mod init hcp-testbed-k8s >/dev/null 2>&1
fi
go mod edit -require="k8s.io/kubernetes@$k8s_version"
log "downloading k8s.io/kubernetes@$k8s_version"
go mod download k8s.io/kubernetes@"$k8s_version"
kmod=$(go mod download -json k8s.io/kubernetes@"$k8s_version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
staging_version="v0.${ver#1.}"
# Every staging module in kubernetes' replace block points at a path inside the
# repo; replace it with the published module at the matching v0.Y.Z.
for m in $(awk '/^replace \(/{f=1;next} f&&/^\)/{f=0} f&&/=>/{print $1}' "$kmod"); do
  go mod edit -replace="$m=$m@$staging_version"
done
etcd_version=$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2}' "$kmod")
go mod edit -require="go.etcd.io/etcd/server/v3@$etcd_version"
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
log "resolving modules"
go mod tidy -e >/dev/null 2>&1 || true
major=${ver%%.*}; rest=${ver#*.}; minor=${rest%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor"
for cmd in kube-apiserver kube-controller-manager kubectl; do
  log "go build $cmd"
  go build -ldflags "$ldflags" -o "$dest/$cmd" "k8s.io/kubernetes/cmd/$cmd"
done
log "go build etcd $etcd_version"
go build -ldflags "-s -w" -o "$dest/etcd" go.etcd.io/etcd/server/v3
log "done: $("$dest/kube-apiserver" --version) in $dest"
echo "$dest"
