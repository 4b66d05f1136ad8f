#!/usr/bin/env bash
# Renders docs/api-reference.md from the Go types in api/v1alpha1 with
# crd-ref-docs (its doc comments and kubebuilder markers: required/optional,
# defaults, bounds, patterns, enums, CEL rules, printer columns).
#
#   hack/gen-api-docs.sh           write docs/api-reference.md
#   hack/gen-api-docs.sh --check   fail if docs/api-reference.md is out of date
#
# crd-ref-docs is installed at a pinned version into bin/ on first use
# (through the Go module proxy); CRD_REF_DOCS names another binary.
# Configuration and templates: hack/api-docs/. Deterministic: the same types
# give a byte-identical file.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

version=${CRD_REF_DOCS_VERSION:-v0.3.0}
bin=${CRD_REF_DOCS:-$root/bin/crd-ref-docs-$version}
out=docs/api-reference.md

if [ ! -x "$bin" ]; then
  echo "gen-api-docs: installing crd-ref-docs $version into bin/" >&2
  mkdir -p "$root/bin"
  tmp=$(mktemp -d)
  GOBIN=$tmp go install "github.com/elastic/crd-ref-docs@$version"
  mv "$tmp/crd-ref-docs" "$bin"
  rm -rf "$tmp"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" \
  --source-path=./api \
  --config=hack/api-docs/config.yaml \
  --renderer=markdown \
  --templates-dir=hack/api-docs/templates/markdown \
  --output-mode=single \
  --log-level=ERROR \
  --output-path="$work/out.md" >&2
# Squeeze the blank lines the templates leave; drop trailing spaces.
cat -s "$work/out.md" | sed -e 's/[[:space:]]*$//' >"$work/api-reference.md"

if [ "${1:-}" = "--check" ]; then
  if ! diff -u "$out" "$work/api-reference.md"; then
    echo "gen-api-docs: $out is out of date; run hack/gen-api-docs.sh" >&2
    exit 1
  fi
  echo "gen-api-docs: $out is up to date" >&2
  exit 0
fi
mkdir -p docs
cp "$work/api-reference.md" "$out"
echo "gen-api-docs: wrote $out" >&2
