#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this host, as users run the broker in
# production: Debian's rabbitmq-server (the same package the one-node
# testbed uses), three Erlang nodes clustered, quorum queues replicated
# across them, and pause_minority partition handling. For the chaos suite's
# broker faults (a node killed, a node partitioned from the others); the
# one-node broker on 127.0.0.1:5672 stays the default for the demo and the
# tests, and this script never touches it.
#
#   hack/rabbitmq-cluster.sh up            start (or reuse) the three nodes and cluster them
#   hack/rabbitmq-cluster.sh down          stop them and delete their state
#   hack/rabbitmq-cluster.sh status        the cluster's view of itself
#   hack/rabbitmq-cluster.sh urls          one AMQP URL per node, comma-separated
#   hack/rabbitmq-cluster.sh management    node 1's management API URL
#   hack/rabbitmq-cluster.sh kill N        SIGKILL node N (1..3)
#   hack/rabbitmq-cluster.sh start N       start node N again; it rejoins from its state (restarted if stuck)
#   hack/rabbitmq-cluster.sh restart       restart every node's rabbit app (the whole broker)
#   hack/rabbitmq-cluster.sh partition N   cut node N's Erlang distribution from the others (iptables on lo)
#   hack/rabbitmq-cluster.sh heal N        undo partition N; waits until N is a running member (restarted if stuck)
#
# Node i: name hcp-r<i>@localhost, AMQP 127.0.0.1:$((BASE+i)), management
# $((MGMT_BASE+i)), distribution $((DIST_BASE+i)). Users: guest/guest from
# localhost, as on the one-node broker. State under $HCP_RMQ_CLUSTER_DIR.
#
# Environment:
#   HCP_RMQ_CLUSTER_DIR   default ~/.cache/hcp-operator/rabbitmq-cluster
#   HCP_RMQ_AMQP_BASE     default 5700   (node i listens on BASE+i)
#   HCP_RMQ_MGMT_BASE     default 15700
#   HCP_RMQ_DIST_BASE     default 25700
set -euo pipefail

dir=${HCP_RMQ_CLUSTER_DIR:-$HOME/.cache/hcp-operator/rabbitmq-cluster}
amqp_base=${HCP_RMQ_AMQP_BASE:-5700}
mgmt_base=${HCP_RMQ_MGMT_BASE:-15700}
dist_base=${HCP_RMQ_DIST_BASE:-25700}
bin=/usr/lib/rabbitmq/bin
nodes=(1 2 3)
export PATH="$PATH:/usr/sbin:/sbin"

log() { echo "[rabbitmq-cluster] $*" >&2; }
die() { echo "[rabbitmq-cluster] ERROR: $*" >&2; exit 1; }

[ -x "$bin/rabbitmq-server" ] || die "rabbitmq-server is not installed (apt-get install rabbitmq-server; hack/testbed-rabbitmq.sh does it)"

name() { echo "hcp-r$1@localhost"; }

# with_node N CMD...: runs CMD in the environment of node N's server and
# of the CLI talking to it. HOME holds the shared Erlang cookie, so the
# nodes and the CLI agree on it without touching the system broker's.
# Node N's distribution connects from its own loopback address 127.0.0.1N,
# so a partition can tell its connections from the others' (see rule).
with_node() {
  local n=$1 d=$dir/r$1; shift
  HOME=$dir RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf \
    RABBITMQ_NODENAME=$(name "$n") RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$((amqp_base + n)) \
    RABBITMQ_DIST_PORT=$((dist_base + n)) RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log \
    RABBITMQ_CONFIG_FILE=$d/rabbitmq.conf RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins \
    RABBITMQ_PID_FILE=$d/pid ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_connect_options [{ip,{127,0,0,1$n}}]" \
    "$@"
}

ctl() { local n=$1; shift; with_node "$n" "$bin/rabbitmqctl" -n "$(name "$n")" "$@"; }
diag() { local n=$1; shift; with_node "$n" "$bin/rabbitmq-diagnostics" -n "$(name "$n")" "$@"; }

running() { diag "$1" -q ping >/dev/null 2>&1; }

prepare() {
  mkdir -p "$dir"
  if [ ! -f "$dir/.erlang.cookie" ]; then
    head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$dir/.erlang.cookie"
    chmod 400 "$dir/.erlang.cookie"
  fi
  # Not /etc/rabbitmq/rabbitmq-env.conf: it names the system node.
  echo 'ERL_EPMD_ADDRESS=127.0.0.1' >"$dir/rabbitmq-env.conf"
  echo '[rabbitmq_management].' >"$dir/enabled_plugins"
  for n in "${nodes[@]}"; do
    mkdir -p "$dir/r$n/log" "$dir/r$n/mnesia"
    cat >"$dir/r$n/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$((amqp_base + n))
management.tcp.ip = 127.0.0.1
management.tcp.port = $((mgmt_base + n))
# Three nodes: the side with fewer than two pauses, so a partitioned node
# stops serving instead of accepting writes the majority never sees.
cluster_partition_handling = pause_minority
# A lost peer is noticed in 15-20 s instead of 60-75 s.
net_ticktime = 15
# The same limit as the one-node testbed (docs/install.md).
max_message_size = 8388608
loopback_users = none
EOF
  done
}

start_node() {
  local n=$1
  if running "$n"; then return 0; fi
  log "starting $(name "$n") (AMQP 127.0.0.1:$((amqp_base + n)))"
  with_node "$n" "$bin/rabbitmq-server" -detached </dev/null >"$dir/r$n/log/start.out" 2>&1
  local deadline=$((SECONDS + 90))
  until running "$n"; do
    [ $SECONDS -lt $deadline ] || die "$(name "$n") did not answer within 90 s; see $dir/r$n/log"
    sleep 2
  done
  diag "$n" -q check_running >/dev/null 2>&1 || sleep 3
}

# members [N]: the running nodes as node N (default 1) sees them.
members() { ctl "${1:-1}" -q cluster_status --formatter json 2>/dev/null | tr -d ' \n' | grep -o '"running_nodes":\[[^]]*\]' || true; }

# member N: node N runs the rabbit app and another node counts it running.
member() {
  local other=1
  [ "$1" != 1 ] || other=2
  diag "$1" -q check_running >/dev/null 2>&1 && members "$other" | grep -q "$(name "$1")"
}

# recover N: waits until node N is a running member again. One that is not
# within 60 s is restarted, as an operator would: after a partition heals,
# Mnesia can stay split and the paused node never resumes
# (rabbitmq-server#17319); a node killed mid-write can hang at boot.
recover() {
  local n=$1 deadline=$((SECONDS + 60))
  until member "$n"; do
    if [ $SECONDS -ge $deadline ]; then
      log "$(name "$n") is not a running member 60 s on; restarting it"
      local p
      p=$(pid_of "$n") || true
      [ -z "${p:-}" ] || kill -9 "$p" 2>/dev/null || true
      sleep 2
      start_node "$n"
      deadline=$((SECONDS + 120))
      until member "$n"; do
        [ $SECONDS -lt $deadline ] || die "$(name "$n") did not rejoin the cluster after a restart; see $dir/r$n/log"
        sleep 3
      done
      break
    fi
    sleep 3
  done
  log "$(name "$n") is a running member: $(members "$n")"
}

up() {
  prepare
  for n in "${nodes[@]}"; do start_node "$n"; done
  # Reused nodes: one left stuck by an earlier fault is restarted.
  for n in "${nodes[@]}"; do
    diag "$n" -q check_running >/dev/null 2>&1 || recover "$n"
  done
  for n in 2 3; do
    if ! members | grep -q "$(name "$n")"; then
      log "joining $(name "$n") to $(name 1)"
      ctl "$n" -q stop_app
      ctl "$n" -q join_cluster "$(name 1)"
      ctl "$n" -q start_app
    fi
  done
  local m
  m=$(members)
  for n in "${nodes[@]}"; do
    echo "$m" | grep -q "$(name "$n")" || die "$(name "$n") is not a running member: $m"
  done
  # Quorum queues need the feature flag on every node.
  ctl 1 -q enable_feature_flag all >/dev/null 2>&1 || true
  log "cluster up: $m"
  urls
}

pid_of() { cat "$dir/r$1/pid" 2>/dev/null; }

# restart: the whole broker restarted, every node's rabbit app stopped, then
# started (node 1, stopped last, first: Mnesia waits for the last node down).
restart() {
  local n
  for n in 3 2 1; do ctl "$n" -q stop_app; done
  for n in 1 2 3; do ctl "$n" -q start_app & done
  wait
  for n in "${nodes[@]}"; do recover "$n"; done
}

down() {
  for n in "${nodes[@]}"; do heal "$n" 2>/dev/null || true; done
  # Already down: the nodes' state (their cookie) is gone, and asking them
  # would only leave an Erlang crash dump in the working directory.
  if [ ! -d "$dir" ]; then log "down"; return 0; fi
  for n in "${nodes[@]}"; do
    if running "$n"; then ctl "$n" -q stop >/dev/null 2>&1 || true; fi
    local p
    p=$(pid_of "$n") || true
    if [ -n "${p:-}" ] && kill -0 "$p" 2>/dev/null; then kill -9 "$p" || true; fi
  done
  rm -rf "$dir"
  log "down"
}

urls() {
  local out=()
  for n in "${nodes[@]}"; do out+=("amqp://guest:guest@127.0.0.1:$((amqp_base + n))/"); done
  (IFS=,; echo "${out[*]}")
}

check_n() { case "${1:-}" in 1|2|3) ;; *) die "node number 1..3 expected, got '${1:-}'" ;; esac; }

# The partition drops node N's Erlang distribution traffic in both
# directions: connections to its distribution port, and connections it
# opened, which leave from its own address 127.0.0.1N. Its clients' AMQP
# connections stay up, as in a real network split between brokers. Rules
# carry a comment so heal finds exactly them.
rule() {
  local op=$1 n=$2 c=(-m comment --comment "hcp-rmq-partition-$2")
  iptables -w "$op" INPUT -i lo -p tcp --dport $((dist_base + n)) "${c[@]}" -j DROP
  iptables -w "$op" INPUT -i lo -p tcp --sport $((dist_base + n)) "${c[@]}" -j DROP
  iptables -w "$op" INPUT -i lo -s "127.0.0.1$n" "${c[@]}" -j DROP
  iptables -w "$op" INPUT -i lo -d "127.0.0.1$n" "${c[@]}" -j DROP
}

partition() {
  check_n "$1"
  command -v iptables >/dev/null || { log "installing iptables"; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null; }
  iptables -w -C INPUT -i lo -p tcp --dport $((dist_base + $1)) -m comment --comment "hcp-rmq-partition-$1" -j DROP 2>/dev/null && return 0
  rule -I "$1"
  log "$(name "$1") partitioned from the others"
}

heal() {
  check_n "$1"
  while iptables -w -C INPUT -i lo -p tcp --dport $((dist_base + $1)) -m comment --comment "hcp-rmq-partition-$1" -j DROP 2>/dev/null; do
    rule -D "$1"
  done
  log "$(name "$1") healed"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) ctl 1 cluster_status ;;
  urls) urls ;;
  management) echo "http://127.0.0.1:$((mgmt_base + 1))" ;;
  kill) check_n "${2:-}"; p=$(pid_of "$2") || die "no pid for node $2"; kill -9 "$p"; log "$(name "$2") killed (pid $p)" ;;
  start) check_n "${2:-}"; start_node "$2"; recover "$2" ;;
  restart) restart ;;
  partition) partition "${2:-}" ;;
  heal) heal "${2:-}"; recover "$2" ;;
  *) sed -n '2,24p' "$0" >&2; exit 2 ;;
esac
