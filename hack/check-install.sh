#!/usr/bin/env bash
# Checks the install paths end to end, without a cluster or a container
# runtime (`make check-install`):
#
#   1. helm lint --strict and helm template of the chart, for several value
#      sets; value combinations the chart must refuse are refused.
#   2. RBAC, statically: no wildcard anywhere in the rendered rules.
#   3. A throw-away etcd + kube-apiserver (binaries from hack/testbed-k8s.sh,
#      RBAC and OwnerReferencesPermissionEnforcement on, like a strict real
#      cluster). The CRDs (the chart's, the topology operator's, the
#      Prometheus Operator's ServiceMonitor) are applied first.
#   4. Server-side dry-run of every rendering of the chart, of
#      `kubectl kustomize config/default` (and with ../prometheus added, as
#      its comment tells users), and of config/samples. Namespaces carry
#      pod-security warn=restricted: a PodSecurity warning fails the check.
#   5. GitOps: the chart's rendering, its CRDs and config/default are applied
#      server-side twice; the second apply must change nothing (equal
#      resourceVersions) and `kubectl diff --server-side` must be empty.
#   6. Least privilege, as the manager's ServiceAccount: `kubectl auth can-i`
#      on what it must and must not do, and creating every object the
#      operator makes for the samples (hack/installcheck, built by the
#      operator's own code): allowed in a watched namespace (so the chart's
#      RBAC covers the manager, including granting the sidecar's Role and
#      setting blocking owner references), forbidden in an unwatched one
#      when watchNamespaces is set.
#   7. hack/check-dockerfile.sh.
#
# Env: HELM (helm binary; default bin/helm-$HELM_VERSION via `make helm`),
# KEEP=1 keeps the temp dir and the API server running for inspection.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
chart=charts/hcp-operator
PROMETHEUS_OPERATOR_VERSION=${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}

start_all=$SECONDS
step_start=$SECONDS
step() {
  if [ -n "${current_step:-}" ]; then echo "   ($((SECONDS - step_start))s)"; fi
  current_step=$*
  step_start=$SECONDS
  echo
  echo "== $*"
}
failures=0
fail() { echo "   FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "   ok:   $*"; }
die() { echo "check-install: $*" >&2; exit 1; }

if [ -z "${HELM:-}" ]; then
  make -s --no-print-directory helm >&2
  HELM="$root/bin/helm-$(sed -n 's/^HELM_VERSION ?= *//p' Makefile)"
fi
assets=$(hack/testbed-k8s.sh)
kubectl=$assets/kubectl

work=$(mktemp -d)
pids=()
cleanup() {
  if [ "${KEEP:-}" = 1 ]; then
    echo "KEEP=1: $work kept; API server: KUBECONFIG=$work/kubeconfig; stop with: kill ${pids[*]}"
    return
  fi
  # The API server first: it waits for etcd while shutting down.
  local i p
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    p=${pids[i]}
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# ---------------------------------------------------------------- 1. helm
step "helm lint and helm template ($("$HELM" version --template '{{.Version}}'))"
# Value sets: name, then --set/--values arguments. Each is linted, rendered,
# and dry-run below; "default" is also applied for real.
declare -A value_sets=(
  [default]=""
  [scoped]="--set watchNamespaces={team-a,team-b} --set defaultBroker.secret.create=true --set defaultBroker.secret.uri=http://rabbitmq.rabbitmq-system.svc:15672 --set defaultBroker.secret.username=hcp --set defaultBroker.secret.password=secret --set defaultBroker.secret.amqpURL=amqp://rabbitmq.rabbitmq-system.svc:5672"
  [existing-secret]="--set defaultBroker.existingSecret=rabbitmq-system/rabbitmq-default-user --set watchNamespaces={team-a} --set replicaCount=2"
  [monitoring]="--set metrics.serviceMonitor.enabled=true --set metrics.serviceMonitor.labels.release=prometheus --set metrics.serviceMonitor.interval=30s --set sidecarPodMonitor.enabled=true --set prometheusRule.enabled=true --set prometheusRule.labels.release=prometheus --set grafanaDashboard.enabled=true --set grafanaDashboard.annotations.grafana_folder=HCP --set image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
  [hardened]="--set networkPolicy.enabled=true --set watchNamespaces={team-a,team-b} --set networkPolicy.metricsPodSelector.matchLabels.app\.kubernetes\.io/name=prometheus --set podDisruptionBudget.enabled=true --set replicaCount=3 --set-string podDisruptionBudget.minAvailable=50%"
  [minimal]="--set metrics.enabled=false --set leaderElection.enabled=false --set serviceAccount.create=false --set serviceAccount.name=hcp --set logEncoder=console --set priorityClassName=system-cluster-critical --set podAnnotations.a=b --set nodeSelector.kubernetes\.io/os=linux --set tolerations[0].operator=Exists --set extraEnv[0].name=GOGC --set-string extraEnv[0].value=50"
)
set_names=(default scoped existing-secret monitoring hardened minimal)
for name in "${set_names[@]}"; do
  # shellcheck disable=SC2086 # the value sets are word lists
  if out=$("$HELM" lint --strict "$chart" ${value_sets[$name]} 2>&1); then
    ok "lint $name"
  else
    fail "lint $name:"$'\n'"$out"
  fi
  # shellcheck disable=SC2086
  if "$HELM" template hcp-operator "$chart" --namespace hcp-system ${value_sets[$name]} >"$work/$name.yaml" 2>"$work/$name.err"; then
    ok "template $name: $(grep -c '^kind:' "$work/$name.yaml") objects"
  else
    fail "template $name: $(cat "$work/$name.err")"
  fi
done
# What the chart must refuse.
refuse() { # reason, args...
  local reason=$1; shift
  if "$HELM" template hcp-operator "$chart" --namespace hcp-system "$@" >/dev/null 2>"$work/refuse.err"; then
    fail "rendered although $reason: $*"
  else
    # The message: helm's "execution error at (...): MSG", or the schema's
    # "- at '/key': MSG" line.
    ok "refuses $reason ($(sed -n -e 's/.*execution error at ([^)]*): //p' -e 's/^- //p' "$work/refuse.err" | head -1))"
  fi
}
refuse "two default brokers" --set defaultBroker.existingSecret=x --set defaultBroker.secret.create=true
refuse "a malformed existingSecret" --set defaultBroker.existingSecret=a/b/c
refuse "a created Secret without credentials" --set defaultBroker.secret.create=true
refuse "replicas without leader election" --set replicaCount=2 --set leaderElection.enabled=false
refuse "no ServiceAccount name" --set serviceAccount.create=false
refuse "watchNamespaces as a string (values.schema.json)" --set watchNamespaces=team-a
refuse "a misspelt value (values.schema.json)" --set watchNamespace=team-a
refuse "an extraEnv entry without a name (values.schema.json)" --set-string extraEnv[0].value=50
refuse "a harness NetworkPolicy without namespaces (the manager watches all)" --set networkPolicy.enabled=true
refuse "a PodDisruptionBudget bound that is not a number or a percentage (values.schema.json)" --set podDisruptionBudget.enabled=true --set replicaCount=2 --set-string podDisruptionBudget.minAvailable=half

# Expectations on the renderings. objects FILE: "kind name namespace" lines.
objects() {
  awk '/^---/{if(k!="")print k, n, ns; k=n=ns=""; m=0; next}
       /^kind: /{k=$2} /^metadata:/{m=1; next} /^[^ ]/{m=0}
       m && /^  name: /{n=$2} m && /^  namespace: /{ns=$2}
       END{if(k!="")print k, n, ns}' "$work/$1.yaml"
}
expect_object() { # file, description, kind, name, [namespace]
  if objects "$1" | grep -qx "$3 $4 ${5:-}"; then ok "$1: $2"; else fail "$1: $2 (no $3 $4 ${5:-})"; fi
}
expect_no_object() {
  if objects "$1" | grep -q "^$3 $4 "; then fail "$1: $2 (found $3 $4)"; else ok "$1: $2"; fi
}
expect_line() { # file, description, regex
  if grep -Eq -- "$3" "$work/$1.yaml"; then ok "$1: $2"; else fail "$1: $2 (no line matching $3)"; fi
}
expect_no_line() {
  if grep -Eq -- "$3" "$work/$1.yaml"; then fail "$1: $2 ($(grep -E -- "$3" "$work/$1.yaml" | head -1))"; else ok "$1: $2"; fi
}
expect_object default "ClusterRole for the manager" ClusterRole hcp-operator-manager
expect_line default "image tag defaults to appVersion" "image: ghcr.io/hcp-io/hcp-operator:$(sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' $chart/Chart.yaml)\$"
expect_line default "sidecar image defaults to the manager's" '--sidecar-image=ghcr.io/hcp-io/hcp-operator:'
expect_line default "leader election" '- --leader-elect$'
expect_no_object scoped "no ClusterRole grants the manager's rules" ClusterRole hcp-operator-manager
expect_object scoped "a manager Role in team-b" Role hcp-operator-manager team-b
expect_line scoped "default broker flag names the created Secret" '--default-connection-secret=hcp-system/hcp-operator-default-broker$'
expect_line scoped "created Secret is visible to the topology operator" 'rabbitmq.com/topology-operator: "true"'
expect_line scoped "created Secret is usable from the watched namespaces" 'rabbitmq.com/topology-allowed-namespaces: "team-a,team-b"'
expect_line scoped "watch namespaces flag" '--watch-namespaces=team-a,team-b$'
expect_object existing-secret "Secret reader Role in the default broker's namespace" Role hcp-operator-default-broker-reader rabbitmq-system
expect_line existing-secret "two replicas" '^  replicas: 2$'
expect_object monitoring "ServiceMonitor" ServiceMonitor hcp-operator-metrics hcp-system
expect_object monitoring "PodMonitor for the sidecars" PodMonitor hcp-operator-sidecars hcp-system
expect_object monitoring "PrometheusRule" PrometheusRule hcp-operator hcp-system
expect_object monitoring "Grafana dashboard ConfigMap" ConfigMap hcp-operator-dashboard hcp-system
expect_line monitoring "dashboard labelled for the Grafana sidecar" '^    grafana_dashboard: "1"$'
expect_no_object default "no PrometheusRule by default" PrometheusRule hcp-operator
expect_line monitoring "digest pins both images" '--sidecar-image=ghcr.io/hcp-io/hcp-operator@sha256:'
expect_no_object minimal "no metrics Service without metrics" Service hcp-operator-metrics
expect_no_object default "no NetworkPolicy by default" NetworkPolicy hcp-operator-controller-manager
expect_no_object existing-secret "no PodDisruptionBudget by default, even with two replicas" PodDisruptionBudget hcp-operator-controller-manager
expect_object hardened "the manager's NetworkPolicy" NetworkPolicy hcp-operator-controller-manager hcp-system
expect_object hardened "the harness pods' NetworkPolicy in team-a" NetworkPolicy hcp-operator-harness team-a
expect_object hardened "the harness pods' NetworkPolicy in team-b" NetworkPolicy hcp-operator-harness team-b
expect_line hardened "the sidecar's metrics port is the only one open on harness pods" '^        - port: 9091$'
expect_line hardened "scrapes only from the labelled namespace" '^              hcp.io/metrics-scraper: "true"$'
expect_line hardened "and only from the Prometheus pods there" '^              app.kubernetes.io/name: prometheus$'
expect_object hardened "the manager's PodDisruptionBudget" PodDisruptionBudget hcp-operator-controller-manager hcp-system
expect_line hardened "minAvailable replaces maxUnavailable" '^  minAvailable: 50%$'
expect_no_line hardened "no maxUnavailable beside minAvailable" '^  maxUnavailable:'
expect_line minimal "metrics off" '--metrics-bind-address=0$'
expect_line minimal "extra environment of the manager" '^            - name: GOGC$'
expect_no_line default "no env without extraEnv" '^          env:$'

# ---------------------------------------------------------------- 2. RBAC
step "RBAC rules: no wildcards"
for name in "${set_names[@]}"; do
  # A list item that is exactly "*" (quoted or not), anywhere in the rendering.
  if grep -nE "^[[:space:]]*- ['\"]?\*['\"]?[[:space:]]*$" "$work/$name.yaml"; then
    fail "$name: wildcard in a rule"
  else
    ok "$name: no wildcard"
  fi
done
if grep -nE "^[[:space:]]*- (escalate|bind|impersonate)$" "$work/default.yaml"; then
  fail "the manager's RBAC grants escalate, bind or impersonate"
else
  ok "no escalate, bind or impersonate"
fi

# ---------------------------------------------------------------- 3. API server
step "throw-away etcd + kube-apiserver from $assets"
# Ports below the kernel's ephemeral range (32768 and up by default): a port
# an outgoing connection holds answers no probe, yet cannot be bound.
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 12000))
    case " ${taken:-} " in *" $p "*) continue ;; esac
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
taken=""
etcd_port=$(free_port); taken="$taken $etcd_port"
etcd_peer=$(free_port); taken="$taken $etcd_peer"
api_port=$(free_port)
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token,check-install,check-install,system:masters" >"$work/tokens.csv"
openssl genrsa -out "$work/sa.key" 2048 2>/dev/null
"$assets/etcd" --name check-install --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "check-install=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync \
  >"$work/etcd.log" 2>&1 &
pids+=($!)
# etcd first: the API server gives up on a storage it cannot reach.
for _ in $(seq 60); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$etcd_port") 2>/dev/null; then break; fi
  kill -0 "${pids[0]}" 2>/dev/null || { tail -20 "$work/etcd.log"; die "etcd exited"; }
  sleep 0.5
done
"$assets/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --secure-port "$api_port" --cert-dir "$work/certs" \
  --token-auth-file "$work/tokens.csv" --authorization-mode RBAC \
  --enable-admission-plugins OwnerReferencesPermissionEnforcement \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$work/sa.key" \
  --service-account-signing-key-file "$work/sa.key" --service-cluster-ip-range 10.0.0.0/24 \
  >"$work/kube-apiserver.log" 2>&1 &
pids+=($!)
export KUBECONFIG=$work/kubeconfig
"$kubectl" config set-cluster check --server "https://127.0.0.1:$api_port" --insecure-skip-tls-verify=true >/dev/null
"$kubectl" config set-credentials check --token "$token" >/dev/null
"$kubectl" config set-context check --cluster check --user check >/dev/null
"$kubectl" config use-context check >/dev/null
for _ in $(seq 120); do
  if "$kubectl" get --raw /readyz >/dev/null 2>&1; then break; fi
  kill -0 "${pids[1]}" 2>/dev/null || { tail -20 "$work/kube-apiserver.log"; die "kube-apiserver exited"; }
  sleep 0.5
done
"$kubectl" get --raw /readyz >/dev/null || { tail -20 "$work/kube-apiserver.log"; die "kube-apiserver is not ready"; }
ok "kube-apiserver $("$kubectl" version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1) ready on 127.0.0.1:$api_port"

step "CRDs: the chart's, the topology operator's, ServiceMonitor, PodMonitor, PrometheusRule"
mto_dir=$(go list -m -f '{{.Dir}}' github.com/rabbitmq/messaging-topology-operator)
[ -n "$mto_dir" ] && [ -d "$mto_dir/config/crd/bases" ] || mto_dir=$(go mod download -json github.com/rabbitmq/messaging-topology-operator | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
prom_dir=$(go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -n "$prom_dir" ] || die "cannot download github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION for its ServiceMonitor CRD"
# The dry-runs below use the same field manager: config/default's CRDs are
# these plus a label, and must not conflict with them.
# The chart's CRDs are templates (templates/crds, generated by
# hack/sync-chart.sh); rendered alone, they are config/crd/bases plus the
# chart's labels and the keep annotation.
crd_args=()
for f in "$chart"/templates/crds/*.yaml; do crd_args+=(--show-only "templates/crds/$(basename "$f")"); done
"$HELM" template hcp-operator "$chart" "${crd_args[@]}" >"$work/chart-crds.yaml"
for f in "$work/chart-crds.yaml" "$mto_dir/config/crd/bases/" "$prom_dir/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
  "$prom_dir/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" "$prom_dir/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"; do
  "$kubectl" apply --server-side --field-manager check-install -f "$f" >/dev/null
done
"$kubectl" wait --for condition=Established --timeout 60s crd --all >/dev/null
ok "$("$kubectl" get crd -o name | wc -l) CRDs established"
if cat config/crd/bases/*.yaml | cmp -s - <(sed -e '/^# Source: /d' -e '/^    helm.sh\/resource-policy: keep$/d' -e '/^  labels:$/,/^  name:/{/^  name:/!d}' "$work/chart-crds.yaml"); then
  ok "chart templates/crds = config/crd/bases (plus labels and helm.sh/resource-policy: keep)"
else
  fail "chart templates/crds differ from config/crd/bases: run make manifests"
fi
if [ "$("$HELM" template hcp-operator "$chart" --set crds.install=false | grep -c '^kind: CustomResourceDefinition')" = 0 ]; then
  ok "crds.install=false renders no CRD"
else
  fail "crds.install=false still renders CRDs"
fi

# ---------------------------------------------------------------- 4. dry-run
# dry_run FILE [ARGS]: server-side apply dry-run; PodSecurity warnings fail.
dry_run() {
  local file=$1; shift
  if out=$("$kubectl" apply --server-side --dry-run=server --field-manager check-install -f "$file" "$@" 2>&1); then
    if grep -q "would violate PodSecurity" <<<"$out"; then
      fail "$(basename "$file"): $(grep 'would violate PodSecurity' <<<"$out")"
    else
      ok "$(basename "$file"): $(wc -l <<<"$out") objects accepted"
    fi
  else
    fail "$(basename "$file"):"$'\n'"$out"
  fi
}
ns() { # create namespaces with pod-security warn=restricted
  local n
  for n in "$@"; do
    "$kubectl" create namespace "$n" --dry-run=client -o yaml |
      "$kubectl" label --local -f - -o yaml pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/warn=restricted |
      "$kubectl" apply --server-side -f - >/dev/null
  done
}
step "server-side dry-run of the chart"
ns hcp-system team-a team-b rabbitmq-system
for name in "${set_names[@]}"; do dry_run "$work/$name.yaml"; done

step "server-side dry-run of kubectl kustomize config/default (and with ../prometheus)"
"$kubectl" kustomize config/default >"$work/kustomize-default.yaml"
# Its Namespace first, for real: the namespaced objects need it to exist.
awk 'BEGIN{RS="\n---\n"} /\nkind: Namespace\n/ || /^kind: Namespace\n/ {print "---"; print}' "$work/kustomize-default.yaml" >"$work/kustomize-namespaces.yaml"
grep -q '^kind: Namespace' "$work/kustomize-namespaces.yaml" || fail "config/default renders no Namespace"
"$kubectl" apply --server-side -f "$work/kustomize-namespaces.yaml" >/dev/null
dry_run "$work/kustomize-default.yaml"
image=$(grep -E '^ +image: ' "$work/kustomize-default.yaml" | tail -1 | awk '{print $2}')
if grep -q -- "--sidecar-image=$image\$" "$work/kustomize-default.yaml"; then ok "config/default: --sidecar-image follows the manager image ($image)"; else fail "config/default: --sidecar-image is not the manager image $image"; fi
cp -R config "$work/config"
sed -i 's|^- \.\./manager$|- ../manager\n- ../prometheus|' "$work/config/default/kustomization.yaml"
"$kubectl" kustomize "$work/config/default" >"$work/kustomize-prometheus.yaml"
grep -q '^kind: ServiceMonitor' "$work/kustomize-prometheus.yaml" || fail "config/default with ../prometheus renders no ServiceMonitor"
dry_run "$work/kustomize-prometheus.yaml"

step "server-side dry-run of config/samples"
ns samples
"$kubectl" kustomize config/samples >"$work/samples.yaml"
dry_run "$work/samples.yaml" -n samples

# ---------------------------------------------------------------- 5. GitOps
# versions FILE: kind/namespace/name resourceVersion of every object in FILE.
versions() {
  "$kubectl" get -f "$1" -o jsonpath='{range .items[*]}{.kind}/{.metadata.namespace}/{.metadata.name} {.metadata.resourceVersion}{"\n"}{end}' | sort
}
idempotent() { # what, render command...
  local what=$1 out; shift
  # Rendered afresh for each apply, as a GitOps tool does on every sync: a
  # random or time-dependent value in a template shows up here.
  "$@" >"$work/render1.yaml"
  "$@" >"$work/render2.yaml"
  if ! cmp -s "$work/render1.yaml" "$work/render2.yaml"; then
    fail "$what: two renderings differ:"$'\n'"$(diff "$work/render1.yaml" "$work/render2.yaml" | head -20)"
  fi
  # The first apply takes over fields other steps set (a GitOps tool
  # adopting objects does the same); the second must be a no-op.
  "$kubectl" apply --server-side --force-conflicts --field-manager gitops -f "$work/render1.yaml" >/dev/null
  "$kubectl" wait --for condition=Established --timeout 60s crd --all >/dev/null
  versions "$work/render1.yaml" >"$work/rv1"
  "$kubectl" apply --server-side --field-manager gitops -f "$work/render2.yaml" >"$work/apply2"
  versions "$work/render2.yaml" >"$work/rv2"
  if diff -u "$work/rv1" "$work/rv2" >"$work/rvdiff"; then
    ok "$what: second apply changed nothing ($(wc -l <"$work/rv1") objects, resourceVersions equal; kubectl says: $(awk '{print $NF}' "$work/apply2" | sort | uniq -c | xargs))"
  else
    fail "$what: the second apply changed objects:"$'\n'"$(cat "$work/rvdiff")"
  fi
  "$@" >"$work/render3.yaml"
  if out=$("$kubectl" diff --server-side --field-manager gitops -f "$work/render3.yaml" 2>&1); then
    ok "$what: kubectl diff --server-side is empty"
  else
    fail "$what: kubectl diff --server-side shows changes:"$'\n'"$out"
  fi
}
step "GitOps: render and apply twice, nothing changes"
ns hcp-gitops hcp-scoped
idempotent "chart (release gitops)" "$HELM" template gitops "$chart" --namespace hcp-gitops
idempotent "chart, watchNamespaces={team-a}, created broker Secret (release scoped)" "$HELM" template scoped "$chart" --namespace hcp-scoped \
  --set 'watchNamespaces={team-a}' --set defaultBroker.secret.create=true --set defaultBroker.secret.uri=http://rabbitmq:15672 \
  --set defaultBroker.secret.username=hcp --set defaultBroker.secret.password=secret
idempotent "kubectl kustomize config/default" "$kubectl" kustomize config/default

# ---------------------------------------------------------------- 6. RBAC
step "least privilege, as the manager's ServiceAccount"
ns apps
can() { # sa-namespace/sa-name, expectation yes|no, can-i args...
  local sa=$1 want=$2; shift 2
  local got
  got=$("$kubectl" auth can-i --as "system:serviceaccount:${sa%/*}:${sa#*/}" "$@" 2>/dev/null || true)
  if [ "$got" = "$want" ]; then ok "${sa#*/} can-i $* = $got"; else fail "${sa#*/} can-i $* = $got, want $want"; fi
}
children_as() { # sa, namespace, expectation created|forbidden
  local sa=$1 namespace=$2 want=$3 out file=$work/children-$2.yaml
  go run ./hack/installcheck children "$namespace" >"$file"
  # For real, not a dry-run: a RoleBinding's escalation check needs its Role
  # to exist. The objects run nothing (no controllers, no kubelet).
  if out=$("$kubectl" create -f "$file" --as "system:serviceaccount:${sa%/*}:${sa#*/}" 2>&1); then
    if [ "$want" = created ]; then
      ok "${sa#*/} creates the operator's $(grep -c ' created$' <<<"$out") objects for the samples in $namespace"
      if grep -q "would violate PodSecurity" <<<"$out"; then
        echo "   note: $(grep 'would violate PodSecurity' <<<"$out" | sort -u | sed 's/^Warning: //')"
      fi
    else
      fail "${sa#*/} created the operator's objects in $namespace, which it must not"
    fi
  elif [ "$want" = forbidden ] && ! grep -v -e '^Error from server (Forbidden)' -e '^Warning' <<<"$out" | grep -q .; then
    ok "${sa#*/} is forbidden all $(grep -c Forbidden <<<"$out") objects in $namespace"
  else
    fail "${sa#*/} creating the operator's objects in $namespace:"$'\n'"$out"
  fi
}
cluster_sa=hcp-gitops/gitops-hcp-operator-controller-manager
scoped_sa=hcp-scoped/scoped-hcp-operator-controller-manager
children_as "$cluster_sa" apps created
can "$cluster_sa" no delete secrets -n team-a
can "$cluster_sa" no list nodes
can "$cluster_sa" no create clusterroles
can "$cluster_sa" no escalate roles -n team-a
can "$cluster_sa" no create pods -n team-a
can "$cluster_sa" yes create leases.coordination.k8s.io -n hcp-gitops
# The sidecars keep a per-pod Lease and per-session checkpoint ConfigMaps
# (docs/durable-sessions.md); Kubernetes lets the manager grant only what it
# holds, so it may create and update those, never delete or list them.
can "$cluster_sa" yes create leases.coordination.k8s.io -n team-a
can "$cluster_sa" no delete leases.coordination.k8s.io -n team-a
can "$cluster_sa" no list configmaps -n team-a
can "$cluster_sa" no delete configmaps -n team-a
can "$cluster_sa" yes create tokenreviews.authentication.k8s.io
can "$cluster_sa" yes update callees.hcp.io/finalizers -n team-a
children_as "$scoped_sa" team-a created
children_as "$scoped_sa" team-b forbidden
can "$scoped_sa" no list secrets -n kube-system
can "$scoped_sa" no list secrets --all-namespaces
can "$scoped_sa" yes list secrets -n team-a

# ---------------------------------------------------------------- 7. Dockerfile
step "Dockerfile"
if hack/check-dockerfile.sh | sed 's/^/ /'; then :; else fail "hack/check-dockerfile.sh"; fi

echo "   ($((SECONDS - step_start))s)"
echo
if [ "$failures" -gt 0 ]; then
  echo "check-install: $failures failure(s) in $((SECONDS - start_all))s"
  exit 1
fi
echo "check-install: ok in $((SECONDS - start_all))s"
