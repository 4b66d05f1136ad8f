#!/usr/bin/env bash
# Issue 35's operator target asks for the mean of at least 3 A-B-A runs:
# runs `make bench-scale` RUNS times (each on a local stack of its own:
# baseline, floor, operator, baseline again), keeps each run's report as
# REPORT_DIR/run-K.md, and prints each run's time to Ready against the
# floor and the baseline, then the means and the target line. SCALE_N and
# SCALE_IDLE pass through (default here 200 and 10s). Each stack's
# kube-controller-manager runs at HCP_KCM_API_QPS (default here 200, burst
# twice that; its own default is 20): at 20 the garbage collector's share
# of the four cleanups of 1,000 + 1,000 takes most of an hour a run. Time
# to Ready counts topology objects, which it does not touch.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SCALE_N=${SCALE_N:-200}
SCALE_IDLE=${SCALE_IDLE:-10s}
REPORT_DIR=${REPORT_DIR:-bin/bench-scale-runs}
export HCP_KCM_API_QPS=${HCP_KCM_API_QPS:-200}
export HCP_KCM_API_BURST=${HCP_KCM_API_BURST:-$((2 * HCP_KCM_API_QPS))}
mkdir -p "$REPORT_DIR"

for k in $(seq 1 "$RUNS"); do
	echo "== run $k of $RUNS: make bench-scale SCALE_N=$SCALE_N SCALE_IDLE=$SCALE_IDLE, kube-controller-manager at $HCP_KCM_API_QPS requests/s ($(date -u +%H:%M:%S) UTC)"
	make --no-print-directory bench-scale SCALE_N="$SCALE_N" SCALE_IDLE="$SCALE_IDLE" \
		SCALE_REPORT="$REPORT_DIR/run-$k.md" >"$REPORT_DIR/run-$k.log" 2>&1 ||
		{ echo "run $k failed; its log: $REPORT_DIR/run-$k.log" >&2; tail -30 "$REPORT_DIR/run-$k.log" >&2; exit 1; }
done

# Each report has a target line "... against the floor, N + N: R× (operator
# O s, floor F s; one A-B-A run, baseline B1 s and B2 s: ..." and a
# writes line "... per Callee/Caller, N + N: W (T writes, ...".
for k in $(seq 1 "$RUNS"); do
	f="$REPORT_DIR/run-$k.md"
	sed -n 's/.*against the floor, [0-9]* + [0-9]*: .*(operator \([0-9.]*\) s, floor \([0-9.]*\) s; one A-B-A run, baseline \([0-9.]*\) s and \([0-9.]*\) s.*/\1 \2 \3 \4/p' "$f" | head -1 | tr '\n' ' '
	sed -n 's/.*writes per Callee\/Caller, [0-9]* + [0-9]*: [0-9.]* (\([0-9]*\) writes,.*/\1/p' "$f" | head -1
done | awk -v n="$SCALE_N" -v runs="$RUNS" '
	NF != 5 { print "a report lacks its target lines" > "/dev/stderr"; bad = 1; exit 1 }
	{
		k++; op = $1; fl = $2; base = ($3 + $4) / 2
		printf "run %d: operator %.1f s, floor %.1f s (%.2f×), baseline %.1f s and %.1f s (%.2f×), %.3f writes per Callee/Caller\n", k, op, fl, op / fl, $3, $4, op / base, $5 / (2 * n)
		sf += op / fl; sb += op / base; sw += $5 / (2 * n)
	}
	END {
		if (bad || k == 0) exit 1
		f = sf / k; b = sb / k
		printf "%s time to Ready against the floor, %d + %d, mean of %d A-B-A runs: %.2f× (against the baseline %.2f×; %.3f writes per Callee/Caller) | target ≤ 1.2× | anchors: the floor: the same children plus the Callee/Caller creates and one status write each\n", (f <= 1.2 ? "✓" : "✗"), n, n, k, f, b, sw / k
		if (k < 3) print "fewer than the target'"'"'s 3 runs"
	}'
