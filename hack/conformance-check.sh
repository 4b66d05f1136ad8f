#!/usr/bin/env bash
# Checks docs/conformance.md against the code: every test it names exists,
# and every file:symbol it names is defined in that file. Prints the rows
# whose status is not "yes" and the count of each status per table.
#
#   hack/conformance-check.sh            check; exit 1 on a missing test or symbol
#   hack/conformance-check.sh --strict   also exit 1 while a row is "pending"
#   hack/conformance-check.sh --list     print the referenced tests (DIR TestName), one per line
#
# References are code spans in the table:
#   `internal/sidecar/callee.TestAbort`              a test: DIR.Name, where Name
#                                                     starts with Test, Fuzz, Benchmark or
#                                                     Example and DIR holds *_test.go files
#   `internal/sidecar/callee/abort.go:abortCommand`  a function, method, type, constant,
#                                                     variable or struct field defined in that file
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
doc=${CONFORMANCE_DOC:-docs/conformance.md}
mode=${1:-check}
case "$mode" in check | --strict | --list) ;; *)
  echo "usage: $0 [--strict|--list]" >&2
  exit 2
  ;;
esac
[ -f "$doc" ] || { echo "conformance-check: $doc not found" >&2; exit 1; }

# Code spans in table rows, one per line.
spans=$(grep -E '^\|' "$doc" | grep -oE '`[^`]+`' | tr -d '`' | sort -u)

tests=$(grep -E '^[A-Za-z0-9_./-]+\.(Test|Fuzz|Benchmark|Example)[A-Za-z0-9_]*$' <<<"$spans" || true)
symbols=$(grep -E '^[A-Za-z0-9_./-]+\.go:[A-Za-z_][A-Za-z0-9_]*$' <<<"$spans" || true)

if [ "$mode" = --list ]; then
  while IFS= read -r ref; do
    [ -n "$ref" ] && printf '%s %s\n' "${ref%.*}" "${ref##*.}"
  done <<<"$tests"
  exit 0
fi

missing=0
ntests=0
while IFS= read -r ref; do
  [ -n "$ref" ] || continue
  ntests=$((ntests + 1))
  dir=${ref%.*} name=${ref##*.}
  if ! compgen -G "$dir/*_test.go" >/dev/null; then
    echo "MISSING test $name: no *_test.go files in $dir" >&2
    missing=$((missing + 1))
  elif ! grep -qE "^func ${name}\(" "$dir"/*_test.go; then
    echo "MISSING test $name in $dir" >&2
    missing=$((missing + 1))
  fi
done <<<"$tests"

nsymbols=0
while IFS= read -r ref; do
  [ -n "$ref" ] || continue
  nsymbols=$((nsymbols + 1))
  file=${ref%%:*} name=${ref##*:}
  if [ ! -f "$file" ]; then
    echo "MISSING file $file (for $name)" >&2
    missing=$((missing + 1))
    continue
  fi
  # func Name( / func Name[T ...]( / func (recv) Name( ; type Name ; const/var
  # Name ; a tab-indented Name in a const, var or struct block.
  if ! grep -qE "^func (\([^)]*\) )?${name}[[(]|^type ${name}([[:space:][]|$)|^(const|var) ${name}([[:space:]]|$)|^[[:space:]]+${name}([[:space:]]+[A-Za-z*[(]|[[:space:]]*=)" "$file"; then
    echo "MISSING symbol $name in $file" >&2
    missing=$((missing + 1))
  fi
done <<<"$symbols"

# Status of each numbered row (the first word of its last cell), per table.
awk -F'|' '
  /^## / { table = substr($0, 4) }
  /^\| *[0-9]+ *\|/ {
    n = $2; gsub(/ /, "", n)
    cell = $(NF-1); sub(/^ +/, "", cell); sub(/ +$/, "", cell)
    status = cell; sub(/[: ].*/, "", status)
    count[table SUBSEP status]++; tables[table] = 1
    if (status != "yes") {
      short = cell; if (length(short) > 110) short = substr(short, 1, 107) "..."
      printf "  row %s (%s): %s\n", n, table, short
    }
  }
  END {
    for (t in tables) {
      line = ""
      for (k in count) { split(k, p, SUBSEP); if (p[1] == t) line = line sprintf(" %s=%d", p[2], count[k]) }
      printf "%s:%s\n", t, line
    }
  }' "$doc" | sort -s -k1,1 >/tmp/conformance-status.$$ || true
echo "conformance-check: rows that are not \"yes\":"
grep '^  row' /tmp/conformance-status.$$ || echo "  (none)"
echo "conformance-check: status counts:"
grep -v '^  row' /tmp/conformance-status.$$ | sed 's/^/  /'
pending=$(grep -c '^  row .*: pending' /tmp/conformance-status.$$ || true)
rm -f /tmp/conformance-status.$$

echo "conformance-check: $ntests tests and $nsymbols symbols referenced, $missing missing"
if [ "$missing" -gt 0 ]; then
  exit 1
fi
if [ "$mode" = --strict ] && [ "$pending" -gt 0 ]; then
  echo "conformance-check: $pending row(s) pending (--strict)" >&2
  exit 1
fi
