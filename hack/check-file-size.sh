#!/usr/bin/env bash
# Fails when a non-test Go file under internal/, pkg/, cmd/ or api/ (the
# generated deepcopy aside) is longer than MAX_LINES (450) lines, and lists those files, longest first. A file that long
# holds more than one job: split it by job, as internal/sidecar/caller's
# doc.go maps (issue 37).
#
# Usage: hack/check-file-size.sh. MAX_LINES overrides the limit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
max=${MAX_LINES:-450}

long=$(find internal pkg cmd api -name '*.go' ! -name '*_test.go' ! -name 'zz_generated.*' -type f -print0 |
	xargs -0 wc -l |
	awk -v max="$max" '$2 != "total" && $1 > max' |
	sort -rn)

if [ -n "$long" ]; then
	echo "check-file-size: non-test Go files under internal/, pkg/, cmd/ or api/ over $max lines (split them by job):"
	echo "$long"
	exit 1
fi
echo "check-file-size: no non-test Go file under internal/, pkg/, cmd/ or api/ is over $max lines"
