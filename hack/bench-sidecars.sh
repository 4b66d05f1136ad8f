#!/usr/bin/env bash
# Each sidecar as a process of its own beside raw amqp091-go in processes
# of their own, at 1,000 events/s, one processor each (the sidecars'
# default), in ROUNDS rounds whose order rotates: the callee sidecar
# (harness stream in, write-ahead log, confirmed publishes), the caller
# sidecar (one session, app stream out, fsynced journal, acks), and the raw
# publisher and consumer of the same journey (BenchmarkRawClientCPU). Prints
# every run, the medians (lowest-highest) and issue 35's CPU target line
# beside the raw pair. Each sidecar also runs with BUSY_GODEBUG in its
# environment (callee-busy, caller-busy: the Go runtime's monitor thread
# no longer sleeps between bursts; spec.sidecar.env, docs/performance.md
# "Choosing settings"), with its own target line. Needs RabbitMQ (make
# testbed); EVENTS per run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
EVENTS=${EVENTS:-20000}
BUSY_GODEBUG=${BUSY_GODEBUG:-schedtrace=2147483647}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go test -c -o "$bin/callee.test" ./internal/sidecar/callee
go test -c -o "$bin/caller.test" ./internal/sidecar/caller
go test -c -o "$bin/raw.test" ./internal/benchutil

# run NAME: one run; prints "NAME µs [µs µs]" (raw: the pair, publisher, consumer).
run() {
	local out godebug=
	[[ $1 == *-busy ]] && godebug=$BUSY_GODEBUG
	case ${1%-busy} in
	callee) out=$(cd internal/sidecar/callee && GODEBUG=$godebug "$bin/callee.test" -test.run '^$' -test.bench 'BenchmarkCalleeCPU/api=stream/rate=1000$' -test.benchtime "${EVENTS}x") ;;
	caller) out=$(cd internal/sidecar/caller && GODEBUG=$godebug "$bin/caller.test" -test.run '^$' -test.bench 'BenchmarkCallerCPU/app=stream/rate=1000/sessions=1$' -test.benchtime "${EVENTS}x") ;;
	raw) out=$(cd internal/benchutil && "$bin/raw.test" -test.run '^$' -test.bench 'BenchmarkRawClientCPU/rate=1000$' -test.benchtime "${EVENTS}x") ;;
	esac
	echo "$out" | awk -v name="$1" '
		/^Benchmark/ {
			for (i = 1; i < NF; i++) m[$(i+1)] = $i
			if (name == "raw") print name, m["pair-cpu-µs/event"], m["publisher-cpu-µs/event"], m["consumer-cpu-µs/event"]
			else print name, m["cpu-µs/event"]
			found = 1
		}
		END { if (!found) { print "no result from " name > "/dev/stderr"; exit 1 } }'
}

order=(raw callee caller callee-busy caller-busy)
results=$(mktemp)
for ((r = 0; r < ROUNDS; r++)); do
	for ((i = 0; i < ${#order[@]}; i++)); do
		line=$(run "${order[(r + i) % ${#order[@]}]}")
		echo "round $((r + 1)): $line"
		echo "$line" >>"$results"
	done
done
awk -v godebug="$BUSY_GODEBUG" '
	function median(name,   n, i, j, t, v) {
		n = cnt[name]
		for (i = 1; i <= n; i++) v[i] = val[name, i]
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
		lo[name] = v[1]; hi[name] = v[n]
		return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
	}
	{ cnt[$1]++; val[$1, cnt[$1]] = $2; if ($1 == "raw") { cnt["raw publisher"]++; val["raw publisher", cnt["raw publisher"]] = $3; cnt["raw consumer"]++; val["raw consumer", cnt["raw consumer"]] = $4 } }
	END {
		printf "µs of CPU per event at 1,000 events/s, one processor per process, medians of %d rounds (lowest-highest):\n", cnt["raw"]
		for (k in cnt) med[k] = median(k)
		printf "  callee sidecar   %6.1f (%g-%g)   raw publisher %6.1f (%g-%g)\n", med["callee"], lo["callee"], hi["callee"], med["raw publisher"], lo["raw publisher"], hi["raw publisher"]
		printf "  caller sidecar   %6.1f (%g-%g)   raw consumer  %6.1f (%g-%g)\n", med["caller"], lo["caller"], hi["caller"], med["raw consumer"], lo["raw consumer"], hi["raw consumer"]
		pair = med["callee"] + med["caller"]
		printf "  both sidecars    %6.1f             raw pair      %6.1f (%g-%g): the sidecars %.2fx raw amqp091-go\n", pair, med["raw"], lo["raw"], hi["raw"], pair / med["raw"]
		busy = med["callee-busy"] + med["caller-busy"]
		printf "  with GODEBUG=%s: callee %.1f (%g-%g), caller %.1f (%g-%g), both %.1f\n", godebug, med["callee-busy"], lo["callee-busy"], hi["callee-busy"], med["caller-busy"], lo["caller-busy"], hi["caller-busy"], busy
		printf "target: both sidecars ≤ 250 µs per event at 1,000/s: %.0f %s (raw amqp091-go alone: %.0f %s)\n", pair, pair <= 250 ? "✓" : "✗", med["raw"], med["raw"] <= 250 ? "within it" : "over it"
		printf "target, with GODEBUG=%s in spec.sidecar.env: %.0f %s\n", godebug, busy, busy <= 250 ? "✓" : "✗"
	}' "$results"
rm -f "$results"
