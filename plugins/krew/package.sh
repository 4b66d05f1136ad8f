#!/usr/bin/env bash
# Builds the krew archives of kubectl-hcp for one version and renders the
# krew manifest (plugins/krew/hcp.yaml, krew-release-bot's template form)
# with their real sha256s:
#   plugins/krew/package.sh VERSION [OUT_DIR]      (default OUT_DIR: dist/krew)
# OUT_DIR then holds kubectl-hcp_VERSION_<os>_<arch>.tar.gz (the binary and
# LICENSE; deterministic: sorted, mtime 0, owner 0) and hcp.yaml. Install a
# local build with
#   kubectl krew install --manifest=OUT_DIR/hcp.yaml --archive=OUT_DIR/kubectl-hcp_VERSION_linux_amd64.tar.gz
# PLATFORMS overrides the list (default: the manifest's five).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
version=${1:-}
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || { echo "usage: $0 vMAJOR.MINOR.PATCH [OUT_DIR]" >&2; exit 2; }
out=${2:-$root/dist/krew}
platforms=${PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

declare -A sums
for p in $platforms; do
  os=${p%/*} arch=${p#*/}
  bin=kubectl-hcp
  [ "$os" = windows ] && bin=kubectl-hcp.exe
  dir="$work/$os-$arch"
  mkdir -p "$dir"
  (cd "$root" && CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags='-s -w' -o "$dir/$bin" ./cmd/kubectl-hcp)
  cp "$root/LICENSE" "$dir/LICENSE"
  archive="kubectl-hcp_${version}_${os}_${arch}.tar.gz"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir" -cf - "$bin" LICENSE | gzip -n >"$out/$archive"
  sums[$archive]=$(sha256sum "$out/$archive" | cut -d' ' -f1)
  echo "[krew] $archive ${sums[$archive]}" >&2
done

# Render the template: {{ .TagName }} → version; each addURIAndSha line →
# uri and sha256 (a platform not built here is left out of the manifest).
VERSION=$version SUMS="$(for k in "${!sums[@]}"; do echo "$k ${sums[$k]}"; done)" perl -e '
  my %sum = map { split / / } split /\n/, $ENV{SUMS};
  my @lines = <STDIN>;
  my @out; my $skip = 0;
  for (my $i = 0; $i < @lines; $i++) {
    my $l = $lines[$i];
    next if $l =~ /^#/;
    $l =~ s/\{\{ \.TagName \}\}/$ENV{VERSION}/g;
    if ($l =~ /^(\s*)\{\{addURIAndSha "([^"]+)" \.TagName \}\}/) {
      my ($ind, $uri) = ($1, $2);
      (my $file = $uri) =~ s{.*/}{};
      if (!exists $sum{$file}) {
        # drop this platform: the "- selector" item started 4 lines up
        splice(@out, -4); $i++;   # and its bin: line
        next;
      }
      push @out, "${ind}uri: $uri\n", "${ind}sha256: $sum{$file}\n";
      next;
    }
    push @out, $l;
  }
  print @out;
' <"$root/plugins/krew/hcp.yaml" >"$out/hcp.yaml"
echo "[krew] $out/hcp.yaml" >&2
