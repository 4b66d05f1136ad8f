#!/usr/bin/env bash
# `make demo`: the whole thing on this machine, from nothing, in one command.
#
#   hack/demo.sh [up]      local stack (hack/local-stack.sh) → build the binaries →
#                          the hcp-operator manager as a Pod from the rendered
#                          config/default (plus --default-connection-secret) →
#                          the samples (Callee lab-cvd, Caller alpha, CapabilityPolicy
#                          materials-lab) → a task that completes, watched with
#                          `kubectl get hcpsessions -w` → a task that is rejected →
#                          how to use the stack. Idempotent: running it again is the
#                          warm path (pods running an older build are replaced).
#   hack/demo.sh submit [FLAGS]
#                          submit another task through the caller pod's sidecar
#                          (sample-caller submit inside the pod's namespaces; FLAGS
#                          are sample-caller's, after the defaults --callee lab-cvd ...)
#   hack/demo.sh down      stop everything and remove the state (make demo-down)
#
# The Pods run as containers on the stack's node (a kubelet with containerd
# and runc), from the project's own images built offline by `make images`.
#
# Environment: HCP_DEMO_NAMESPACE (default "default"), HCP_DEMO_WAIT_SECONDS
# (bound of each wait, default 240), and hack/local-stack.sh's settings.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
ns=${HCP_DEMO_NAMESPACE:-default}
wait_s=${HCP_DEMO_WAIT_SECONDS:-240}
manager_ns=hcp-system
manager_deploy=hcp-operator-controller-manager
broker_secret=hcp-broker
vhost=/hcp
mgmt_url=${RABBITMQ_MANAGEMENT_URL:-http://127.0.0.1:15672}
mgmt_user=${RABBITMQ_USERNAME:-guest}
mgmt_pass=${RABBITMQ_PASSWORD:-guest}
t0=$SECONDS

log() { echo "[demo] $*" >&2; }
die() {
  echo "[demo] ERROR: $*" >&2
  if [ -n "${HCP_STACK_LOGS:-}" ]; then
    echo "[demo] the stack's own logs are in $HCP_STACK_LOGS; the containers' in ${HCP_STACK_POD_LOGS:-its node/pod-logs} (kubectl logs)" >&2
  fi
  exit 1
}
# shellcheck source=hack/lib/progress.sh
source "$root/hack/lib/progress.sh"

step_n=0
step() {
  step_n=$((step_n + 1))
  printf '\n\033[1m==> %d/7 %s\033[0m  (%ds)\n' "$step_n" "$*" "$((SECONDS - t0))"
}

stack_env() {
  eval "$("$root/hack/local-stack.sh" env)" || die "the local stack is not up"
}

# caller_pod: a running, ready pod of the Caller alpha's harness.
caller_pod() {
  kubectl get pods -n "$ns" -l hcp.io/caller=alpha \
    -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.conditions[?(@.type=="Ready")].status}{" "}{.metadata.deletionTimestamp}{"\n"}{end}' |
    awk '$2 == "True" && $3 == "" {print $1; exit}'
}

# submit ARGS...: sample-caller submit in the caller pod's app container
# (kubectl exec), talking to its sidecar on 127.0.0.1:9090 as the app would.
submit() {
  local pod; pod=$(caller_pod)
  [ -n "$pod" ] || die "no ready pod of Caller alpha in namespace $ns (kubectl get pods -n $ns)"
  kubectl exec -n "$ns" "$pod" -c harness -- \
    /sample-caller submit --sidecar http://127.0.0.1:9090 --callee lab-cvd "$@"
}

# wait_for WHAT CMD...: polls CMD (quietly) every 2 s, reporting every 10 s.
wait_for() {
  local what=$1; shift
  local start=$SECONDS next=$((SECONDS + 10))
  until "$@" >/dev/null 2>&1; do
    [ $((SECONDS - start)) -lt "$wait_s" ] || return 1
    if [ $SECONDS -ge $next ]; then
      log "waiting for $what ($((SECONDS - start))s)"
      next=$((SECONDS + 10))
    fi
    sleep 2
  done
}

# replace_stale_pods: a pod that runs an image the last import changed
# (hack/local-stack.sh lists them in $HCP_STACK_DIR/images-changed) is
# replaced, as a new image tag would roll it.
replace_stale_pods() {
  local changed=$HCP_STACK_DIR/images-changed namespace pod images
  [ -s "$changed" ] || return 0
  while read -r namespace pod images; do
    for image in $images; do
      if grep -qxF "$image" "$changed" || grep -qxF "docker.io/$image" "$changed"; then
        log "pod $namespace/$pod runs an image rebuilt just now ($image): replacing it"
        kubectl delete pod -n "$namespace" "$pod" --wait=false >/dev/null
        break
      fi
    done
  done < <(kubectl get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace}{" "}{.metadata.name}{" "}{range .spec.initContainers[*]}{.image}{" "}{end}{range .spec.containers[*]}{.image}{" "}{end}{"\n"}{end}')
}

ready_cond() { [ "$(kubectl get "$1" -n "$ns" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
samples_ready() { ready_cond callee/lab-cvd && ready_cond caller/alpha && [ -n "$(caller_pod)" ]; }

explain_not_ready() {
  kubectl get callees,callers,capabilitypolicies -n "$ns" -o wide || true
  for o in callee/lab-cvd caller/alpha; do
    echo "--- $o conditions"
    kubectl get "$o" -n "$ns" -o jsonpath='{range .status.conditions[*]}  {.type}={.status} {.reason}: {.message}{"\n"}{end}' || true
  done
  kubectl get pods -n "$ns" -o wide || true
  # The logs of the pods that exist now.
  local pod c
  for pod in $(kubectl get pods -n "$ns" -o name | cut -d/ -f2) $(kubectl get pods -n "$manager_ns" -o name | cut -d/ -f2); do
    for f in "$HCP_STACK_POD_LOGS"/*_"$pod"_*/*/*.log; do
      [ -f "$f" ] || continue
      c=$(basename "$(dirname "$f")")
      echo "--- $pod/$c (last 8 lines of $f)"; tail -n 8 "$f" | cut -c1-400
    done
  done
}

# watch_sessions: `kubectl get hcpsessions -w` for new events, live and
# indented; consecutive lines that differ only in AGE are folded (the callee
# and the caller sidecar each write the status: progress, then the caller's
# acknowledged sequence). Its pid is in watch_pid.
watch_sessions() {
  kubectl get hcpsessions -n "$ns" --watch-only > >(awk '{ k = $0; sub(/[^ ]+ *$/, "", k); if (k != prev) { print "    " $0; fflush() } prev = k }') 2>&1 &
  watch_pid=$!
  sleep 1
}
stop_watch() {
  sleep 2
  kill "$watch_pid" 2>/dev/null || true
  wait "$watch_pid" 2>/dev/null || true
  sleep 0.2
}

up() {
  step "Local stack: etcd, kube-apiserver, controller-manager, scheduler, a node (kubelet, containerd, runc), RabbitMQ, the topology operator"
  "$root/hack/local-stack.sh" up
  stack_env

  step "The images: built offline (make images) and imported into the node's containerd by the stack's start"
  "$root/hack/local-stack.sh" ctr images list | awk 'NR == 1 || $1 ~ /hcp-io/ {print "    " $1, $3, $4, $5}'
  replace_stale_pods

  step "The broker: connection Secret $ns/$broker_secret (the manager's default) and vhost $vhost"
  kubectl create secret generic "$broker_secret" -n "$ns" \
    --from-literal=uri="$mgmt_url" --from-literal=username="$mgmt_user" --from-literal=password="$mgmt_pass" \
    --from-literal=amqpURL="$HCP_STACK_AMQP_URL" --dry-run=client -o yaml |
    kubectl label --local -f - rabbitmq.com/topology-operator=true -o yaml |
    kubectl apply --server-side --field-manager=hcp-demo -f - >/dev/null
  echo "    uri=$mgmt_url (the topology operator, on this machine), amqpURL=$HCP_STACK_AMQP_URL (the sidecars, from their pods)"
  # The samples use an existing vhost (spec.broker.createVhost is not set).
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' -u "$mgmt_user:$mgmt_pass" "$mgmt_url/api/vhosts/%2Fhcp")
  if [ "$code" != 200 ]; then
    code=$(curl -s -o /dev/null -w '%{http_code}' -u "$mgmt_user:$mgmt_pass" -X PUT "$mgmt_url/api/vhosts/%2Fhcp")
    case "$code" in 201|204) echo "    created vhost $vhost on the broker" ;; *) die "creating vhost $vhost failed: HTTP $code" ;; esac
    # make demo-down removes what the demo created, and only that.
    touch "$HCP_STACK_DIR/demo-created-vhost"
  else
    echo "    vhost $vhost exists"
  fi

  step "The hcp-operator manager: kubectl kustomize config/default (+ --default-connection-secret=$broker_secret) | kubectl apply"
  kubectl kustomize "$root/hack/demo" | kubectl apply --server-side --force-conflicts --field-manager=hcp-demo -f - | sed 's/^/    /' | grep -v 'serverside-applied$' || true
  echo "    applied $(kubectl kustomize "$root/hack/demo" | grep -c '^kind:') objects (CRDs, RBAC, Namespace, Deployment, Service)"
  kubectl -n "$manager_ns" rollout status "deploy/$manager_deploy" --timeout="${wait_s}s" | sed 's/^/    /' ||
    { kubectl get pods -n "$manager_ns" -o wide; kubectl logs -n "$manager_ns" "deploy/$manager_deploy" --tail=30 2>/dev/null; die "the manager did not become available"; }
  kubectl get pods -n "$manager_ns" -o wide | sed 's/^/    /'

  step "The samples: kubectl apply -k config/samples -n $ns"
  kubectl apply -k "$root/config/samples" -n "$ns" | sed 's/^/    /'
  if ! wait_for "Callee lab-cvd and Caller alpha to be Ready (topology declared, harness pods running)" samples_ready; then
    explain_not_ready
    die "the samples did not become Ready within ${wait_s}s"
  fi
  kubectl get callees,callers,capabilitypolicies -n "$ns" | sed 's/^/    /'
  echo
  kubectl get pods -n "$ns" -o wide | sed 's/^/    /'

  local pod; pod=$(caller_pod)
  step "A task: sample-caller submit in pod $pod (its sidecar's API, 127.0.0.1:9090); kubectl get hcpsessions -w"
  local out; out=$(mktemp)
  watch_sessions
  if ! submit --capability cvd.run-synthesis --intent "Grow graphene on copper foil" \
    --inputs '{"recipe":"s3://lab/recipes/graphene-cu-01.yaml","substrate":"Cu foil","steps":8,"step_ms":1000,"checkpoint_every":4}' \
    --data-class T2 --max-duration PT10M --timeout 3m >"$out" 2>&1; then
    stop_watch
    cat "$out"
    die "the task did not complete"
  fi
  stop_watch
  echo "    --- what the caller app saw (sample-caller):"
  sed 's/^/    /' "$out"

  step "A task the policy rejects: confidential data (T3) where materials-lab admits T1 and T2"
  watch_sessions
  if submit --capability cvd.run-synthesis --intent "Run the confidential recipe" \
    --inputs '{"recipe":"s3://lab/recipes/confidential.yaml"}' --data-class T3 --timeout 2m >"$out" 2>&1; then
    stop_watch
    cat "$out"
    die "the task was not rejected"
  fi
  stop_watch
  echo "    --- what the caller app saw (sample-caller):"
  sed 's/^/    /' "$out"
  rm -f "$out"

  printf '\n\033[1m==> Done in %ds\033[0m\n' "$((SECONDS - t0))"
  kubectl get hcpsessions -n "$ns" | sed 's/^/    /'
  cat <<EOF

The stack keeps running. Use it:

  export KUBECONFIG=$KUBECONFIG        # or: eval "\$(hack/local-stack.sh env)"
  kubectl get callees,callers,capabilitypolicies,hcpsessions -n $ns
  kubectl get pods -A -o wide
  kubectl logs -n $ns deploy/hcp-callee-lab-cvd -c hcp-sidecar
  hack/local-stack.sh ctr containers list                          # the node's containers (containerd)

  RabbitMQ management UI: $mgmt_url  (guest / guest; vhost $vhost, queues hcp.cmd.lab-cvd and hcp.evt.alpha)

  Submit another task (sample-caller inside the caller pod, against its sidecar):
    hack/demo.sh submit --capability cvd.run-synthesis --data-class T2 \\
      --inputs '{"recipe":"s3://lab/recipes/long.yaml","steps":120,"step_ms":1000}' --watch=false
  Watch it, then abort it:
    kubectl get hcpsessions -n $ns -w
    kubectl patch hcps <session-id> -n $ns --type merge -p '{"spec":{"abortRequested":true}}'
  The same from your shell, with the kubectl plugin (make kubectl-hcp; port-forward to the sidecar):
    kubectl hcp submit -n $ns --caller alpha --callee lab-cvd --capability cvd.run-synthesis --data-class T2 --inputs '{"steps":5}'

Stop everything and remove the state:  make demo-down
EOF
}

# down: the samples go first, so that the operator and the topology operator
# remove their queues, users and permissions from the broker (which outlives
# the stack); then the vhost if the demo created it; then the stack.
down() {
  if "$root/hack/local-stack.sh" env >/dev/null 2>&1; then
    stack_env
    if kubectl get --raw /readyz >/dev/null 2>&1 && kubectl get crd callees.hcp.io >/dev/null 2>&1; then
      log "deleting the samples (their topology and broker users go with them)"
      kubectl delete -k "$root/config/samples" -n "$ns" --ignore-not-found --cascade=foreground --wait --timeout=90s >/dev/null 2>&1 ||
        log "the samples were not deleted within 90s; their queues may remain in vhost $vhost"
    fi
    if [ -f "$HCP_STACK_DIR/demo-created-vhost" ]; then
      log "deleting vhost $vhost (created by the demo) from the broker"
      curl -s -o /dev/null -u "$mgmt_user:$mgmt_pass" -X DELETE "$mgmt_url/api/vhosts/%2Fhcp" || true
    fi
  fi
  "$root/hack/local-stack.sh" down
}

cmd=${1:-up}
[ $# -gt 0 ] && shift
case "$cmd" in
  up) up ;;
  submit) stack_env; submit "$@" ;;
  down) down ;;
  *) die "usage: $0 [up|submit [sample-caller submit flags]|down]" ;;
esac
