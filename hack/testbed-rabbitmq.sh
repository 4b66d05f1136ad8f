#!/usr/bin/env bash
# Makes sure a RabbitMQ broker with the management plugin answers on localhost,
# for envtest suites, the topology operator and the local stack.
#
#   running                 → enable rabbitmq_management (idempotent) and wait for it
#   installed but stopped   → rabbitmq-server -detached, then as above
#   not installed, root     → apt-get install rabbitmq-server, then as above
#   otherwise               → explain and exit 1
#
# Also makes sure quorum queues can be declared (feature flags enabled; a probe
# quorum queue is declared and deleted through the management API).
# Idempotent and cheap when everything is already in place (HTTP checks only).
# Prints the management URL on the last line of stdout.
#
# Environment:
#   RABBITMQ_MANAGEMENT_URL  default http://127.0.0.1:15672
#   RABBITMQ_USERNAME        default guest
#   RABBITMQ_PASSWORD        default guest
#   TESTBED_WAIT_SECONDS     bound for each wait, default 60
set -euo pipefail

url=${RABBITMQ_MANAGEMENT_URL:-http://127.0.0.1:15672}
url=${url%/}
user=${RABBITMQ_USERNAME:-guest}
pass=${RABBITMQ_PASSWORD:-guest}
wait_s=${TESTBED_WAIT_SECONDS:-60}
# Debian installs the CLI tools in /usr/sbin, which a non-login shell may lack.
export PATH="$PATH:/usr/sbin:/sbin"

log() { echo "[testbed-rabbitmq] $*" >&2; }
die() { echo "[testbed-rabbitmq] ERROR: $*" >&2; exit 1; }

# api METHOD PATH [BODY]: prints the HTTP status code; the body goes to $api_body.
api_body=$(mktemp)
trap 'rm -f "$api_body"' EXIT
api() {
  local args=(-sS -o "$api_body" -w '%{http_code}' --max-time 10 -u "$user:$pass" -X "$1")
  if [ $# -ge 3 ]; then args+=(-H 'content-type: application/json' --data "$3"); fi
  curl "${args[@]}" "$url$2" 2>/dev/null || true
}

management_up() { [ "$(api GET /api/overview)" = 200 ]; }

quorum_enabled() {
  [ "$(api GET /api/feature-flags)" = 200 ] &&
    tr -d ' \n' <"$api_body" | grep -q '"name":"quorum_queue"[^}]*"state":"enabled"\|"state":"enabled"[^}]*"name":"quorum_queue"'
}

# Declares and deletes a quorum queue in the default vhost: the real proof.
quorum_declarable() {
  local q=hcp-testbed-probe-$$ code
  code=$(api PUT "/api/queues/%2F/$q" '{"durable":true,"auto_delete":false,"arguments":{"x-queue-type":"quorum"}}')
  case "$code" in
    201|204) api DELETE "/api/queues/%2F/$q" >/dev/null; return 0 ;;
    *) log "declaring a quorum queue failed: HTTP $code $(head -c 300 "$api_body")"; return 1 ;;
  esac
}

ready() { management_up && quorum_enabled; }

cli_ping() { command -v rabbitmq-diagnostics >/dev/null && timeout 30 rabbitmq-diagnostics -q ping </dev/null >/dev/null 2>&1 9>&-; }

# wait_for WHAT CMD...: polls CMD every 2s until it succeeds or the bound passes.
wait_for() {
  local what=$1; shift
  local deadline=$((SECONDS + wait_s))
  until "$@"; do
    if [ $SECONDS -ge $deadline ]; then return 1; fi
    sleep 2
  done
  log "$what after $((SECONDS - start))s"
}

# HCP envelopes are at most 1 MiB; RabbitMQ's default max_message_size is
# 128 MiB. The lower limit makes the broker refuse an oversized publish
# (channel error 406 PRECONDITION_FAILED) before any consumer buffers it.
# Set at run time (new channels use it); a broker restart forgets it, which
# only loosens the limit (docs/install.md shows the permanent setting).
max_size=${RABBITMQ_MAX_MESSAGE_SIZE:-8388608}
limit_message_size() {
  if [ "$(id -u)" != 0 ] && [ "$(id -un)" != rabbitmq ]; then return 0; fi
  command -v rabbitmqctl >/dev/null || return 0
  timeout 30 rabbitmqctl -q eval "application:set_env(rabbit, max_message_size, $max_size)." </dev/null >/dev/null 2>&1 9>&- ||
    log "could not set max_message_size to $max_size (rabbitmqctl eval); the broker keeps its own limit"
}

command -v curl >/dev/null || die "curl is required (apt-get install -y curl)"
start=$SECONDS

if ready && quorum_declarable; then
  limit_message_size
  log "RabbitMQ management API answers at $url; quorum queues work"
  echo "$url"
  exit 0
fi

# Parallel test packages may all get here: one fixes the broker, the others wait and re-check.
# Every command below that may leave a daemon behind (beam, epmd) runs with fd 9
# closed, or the daemon would hold the lock for as long as it lives.
lock_dir=${XDG_CACHE_HOME:-$HOME/.cache}/hcp-operator
mkdir -p "$lock_dir" 2>/dev/null || lock_dir=${TMPDIR:-/tmp}
exec 9>"$lock_dir/rabbitmq-setup.lock"
# Bounded: a holder that died oddly must not block everyone forever.
if command -v flock >/dev/null && ! flock -w "$wait_s" 9; then
  log "another testbed-rabbitmq.sh still holds $lock_dir/rabbitmq-setup.lock after ${wait_s}s; going ahead"
fi
if ready && quorum_declarable; then
  limit_message_size
  log "RabbitMQ management API answers at $url; quorum queues work"
  echo "$url"
  exit 0
fi

if ! command -v rabbitmq-server >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "rabbitmq-server is not installed; installing it from Debian (apt-get)"
    # Its postinst may start the broker: keep the daemon off our stdio (see below).
    apt_log=$(mktemp /tmp/testbed-rabbitmq-apt.XXXXXX)
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server; } \
      </dev/null >"$apt_log" 2>&1 9>&-; then
      die "apt-get install rabbitmq-server failed:
$(tail -n 30 "$apt_log")"
    fi
    rm -f "$apt_log"
    log "installed $(dpkg-query -W -f '${Package} ${Version}' rabbitmq-server 2>/dev/null)"
  else
    die "RabbitMQ is not installed and this script cannot install it (needs root and apt-get).
  Install it:  sudo apt-get install -y rabbitmq-server   (then re-run $0)
  or point RABBITMQ_MANAGEMENT_URL at a broker with the management plugin enabled."
  fi
fi

# Everything below needs the CLI, which only root and the rabbitmq user can use.
if [ "$(id -u)" != 0 ] && [ "$(id -un)" != rabbitmq ]; then
  die "no RabbitMQ management API with quorum queues at $url, and $(id -un) cannot fix that
  (starting RabbitMQ, enabling rabbitmq_management and feature flags need root or the rabbitmq user).
  Run once:  sudo $0"
fi

if ! cli_ping; then
  log "RabbitMQ is installed but not running; starting it (rabbitmq-server -detached)"
  # As root, Debian's wrapper switches to the rabbitmq user.
  # The daemon must not inherit our stdout/stderr: a caller reading them through a
  # pipe (go test) would wait for it to exit.
  start_log=$(mktemp /tmp/testbed-rabbitmq-start.XXXXXX)
  rabbitmq-server -detached </dev/null >"$start_log" 2>&1 9>&- || true
  wait_for "RabbitMQ answers ping" cli_ping ||
    die "RabbitMQ did not answer ping within ${wait_s}s: $(cat "$start_log"); see /var/log/rabbitmq/ (startup_err, rabbit@*.log)"
  rm -f "$start_log"
  # ping answers before the boot (and the plugins) finished.
  timeout "$wait_s" rabbitmqctl -q await_startup --timeout "$wait_s" >/dev/null 2>&1 9>&- || true
  log "RabbitMQ booted after $((SECONDS - start))s"
fi

if ! management_up; then
  log "enabling rabbitmq_management"
  rabbitmq-plugins enable rabbitmq_management >&2 9>&- ||
    die "rabbitmq-plugins enable rabbitmq_management failed"
  wait_for "management API answers at $url" management_up || {
    code=$(api GET /api/overview)
    case "$code" in
      401) die "management API at $url refuses $user (HTTP 401): the user is missing, has a different password, lacks the management tag, or (guest) the request did not come from localhost" ;;
      000) die "management API did not answer at $url within ${wait_s}s (rabbitmq-plugins list -e; /var/log/rabbitmq/rabbit@*.log)" ;;
      *) die "management API at $url answered HTTP $code: $(head -c 300 "$api_body")" ;;
    esac
  }
fi

if ! quorum_enabled; then
  log "enabling all feature flags (quorum queues need quorum_queue)"
  rabbitmqctl -q enable_feature_flag all >&2 9>&- || die "rabbitmqctl enable_feature_flag all failed"
  wait_for "feature flag quorum_queue enabled" quorum_enabled ||
    die "feature flag quorum_queue is still not enabled (rabbitmqctl list_feature_flags)"
fi

quorum_declarable || die "quorum queues cannot be declared on this broker"
limit_message_size
log "RabbitMQ management API answers at $url; quorum queues work ($((SECONDS - start))s)"
echo "$url"
