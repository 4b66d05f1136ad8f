#!/usr/bin/env bash
# Regenerates the Helm chart's generated parts from config/, so the chart
# never carries hand-edited copies. `make manifests` runs it after
# controller-gen; `make verify` fails when the result differs from git.
#
#   charts/hcp-operator/crds/*.yaml                 <- config/crd/bases (controller-gen)
#   charts/hcp-operator/templates/manager-rbac.yaml <- config/rbac/role.yaml (kubebuilder RBAC markers)
#   charts/hcp-operator/README.md                   <- values.yaml "# --" comments + README.md.gotmpl (helm-docs)
#
# Deterministic: the same inputs give byte-identical outputs.
# HELM_DOCS names the helm-docs binary (the Makefile passes its pinned one);
# without it the README step installs it through `make helm-docs`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
chart="$root/charts/hcp-operator"
[ -d "$chart" ] || exit 0
cd "$root"

# CRDs. Helm installs crds/ before the templates and never deletes them on
# uninstall (deleting a CRD deletes every Callee, Caller and HCPSession).
mkdir -p "$chart/crds"
rm -f "$chart"/crds/*.yaml
cp config/crd/bases/*.yaml "$chart/crds/"

# RBAC.
[ -f config/rbac/role.yaml ] || { echo "sync-chart: config/rbac/role.yaml is missing; run make manifests" >&2; exit 1; }
go run ./hack/chartrbac config/rbac/role.yaml "$chart/templates/manager-rbac.yaml"

# README: the values table. A value without a "# --" comment fails.
if [ -z "${HELM_DOCS:-}" ]; then
  make -s --no-print-directory -C "$root" helm-docs >&2
  HELM_DOCS="$root/bin/helm-docs-$(sed -n 's/^HELM_DOCS_VERSION ?= *//p' "$root/Makefile")"
fi
"$HELM_DOCS" --log-level warning --chart-search-root "$chart" \
  --template-files README.md.gotmpl --output-file README.md >/dev/null
# helm-docs lists an undocumented value with an empty description. (Its
# --documentation-strict-mode only logs a warning and skips the chart.)
undocumented=$(awk -F'|' '/^## Values/{v=1} v && /^\| [^-K]/ && $5 ~ /^ *$/ {print $2}' "$chart/README.md")
if [ -n "$undocumented" ]; then
  echo "sync-chart: values without a \"# --\" comment in charts/hcp-operator/values.yaml: ${undocumented//$'\n'/ }" >&2
  exit 1
fi
