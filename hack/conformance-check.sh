#!/usr/bin/env bash
# Checks docs/conformance.md against the code: every test it names exists,
# and every file:symbol it names is defined in that file. Prints the rows
# whose status is not "yes" and the count of each status per table, and
# checks the document's summary against those counts.
#
#   hack/conformance-check.sh            check; exit 1 on a missing test or symbol,
#                                        or a summary that disagrees with the table
#   hack/conformance-check.sh --strict   also exit 1 while a row is "pending"
#   hack/conformance-check.sh --write    rewrite the summary from the table, then check
#   hack/conformance-check.sh --list     print the referenced tests (DIR TestName), one per line
#
# The summary is the text between the lines "<!-- summary:begin ... -->" and
# "<!-- summary:end -->": one bullet per table with its row count, the count
# of each status (yes, pending and no always, others when present) and the
# rows of every status but yes. It is generated, never written by hand: a
# hand-kept count drifted from the table before (it said 43 yes and 1
# pending when the table had 44 and 0). `make verify` runs the check, so a
# table edit without --write fails there; the check does not rewrite the
# file itself because a check that edits what it checks cannot fail.
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
case "$mode" in check | --strict | --write | --list) ;; *)
  echo "usage: $0 [--strict|--write|--list]" >&2
  exit 2
  ;;
esac
[ -f "$doc" ] || { echo "conformance-check: $doc not found" >&2; exit 1; }

# Code spans in table rows, one per line.
# shellcheck disable=SC2016 # the backquotes are Markdown, not shell
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

# Every numbered row as "TABLE<TAB>ROW<TAB>STATUS<TAB>LAST CELL": the table is
# the number of its "## N. Title" heading, the status the first word of the
# row's last cell.
rows=$(awk -F'|' '
  /^## / { table = $0; sub(/^## /, "", table); sub(/\..*/, "", table) }
  /^\| *[0-9]+ *\|/ {
    n = $2; gsub(/ /, "", n)
    cell = $(NF-1); sub(/^ +/, "", cell); sub(/ +$/, "", cell)
    status = cell; sub(/[: ].*/, "", status)
    printf "%s\t%s\t%s\t%s\n", table, n, status, cell
  }' "$doc")

echo "conformance-check: rows that are not \"yes\":"
awk -F'\t' '$3 != "yes" {
    short = $4; if (length(short) > 110) short = substr(short, 1, 107) "..."
    printf "  row %s (table %s): %s\n", $2, $1, short; any = 1
  }
  END { if (!any) print "  (none)" }' <<<"$rows"
pending=$(awk -F'\t' '$3 == "pending"' <<<"$rows" | wc -l)

# The summary, generated from the rows: per table, in table order, the
# statuses in a fixed order (yes, pending and no even at 0, so a reader sees
# that none is pending), then any other status alphabetically.
summary=$(awk -F'\t' '
  function plural(k, w) { return k == 1 ? w : w "s" }
  !($1 in seen) { seen[$1] = 1; order[++nt] = $1 }
  {
    total[$1]++; count[$1, $3]++
    if (!(($1, $3) in list)) list[$1, $3] = $2; else list[$1, $3] = list[$1, $3] ", " $2
    if (!($3 in known)) { known[$3] = 1; extra[++ne] = $3 }
  }
  END {
    ns = split("yes pending no partial deviation choice n/a", fixed, " ")
    for (i = 1; i <= ns; i++) always[fixed[i]] = (i <= 3)
    # other statuses, sorted, after the fixed ones
    for (i = 1; i <= ne; i++) if (!(extra[i] in always)) others[++no] = extra[i]
    for (i = 1; i <= no; i++) for (j = i + 1; j <= no; j++) if (others[j] < others[i]) { t = others[i]; others[i] = others[j]; others[j] = t }
    for (i = 1; i <= no; i++) fixed[ns + i] = others[i]
    for (t = 1; t <= nt; t++) {
      tb = order[t]; line = ""
      for (i = 1; i <= ns + no; i++) {
        st = fixed[i]; k = count[tb, st] + 0
        if (k == 0 && !always[st]) continue
        part = k " *" st "*"
        if (k > 0 && st != "yes") part = part " (" plural(k, "row") " " list[tb, st] ")"
        line = line (line == "" ? "" : ", ") part
      }
      printf "- Table %s: %d %s: %s.\n", tb, total[tb], plural(total[tb], "row"), line
    }
  }' <<<"$rows")

begin='<!-- summary:begin (generated by hack/conformance-check.sh --write; do not edit) -->'
end='<!-- summary:end -->'
if ! grep -qxF "$begin" "$doc" || ! grep -qxF "$end" "$doc"; then
  echo "conformance-check: $doc has no summary markers:" >&2
  printf '  %s\n  %s\n' "$begin" "$end" >&2
  exit 1
fi
if [ "$mode" = --write ]; then
  tmp=$(mktemp "$doc.XXXXXX")
  # ENVIRON, not -v: awk would interpret backslashes in a -v value.
  SUMMARY=$summary awk -v b="$begin" -v e="$end" '
    $0 == b { print; print ENVIRON["SUMMARY"]; skip = 1; next }
    $0 == e { skip = 0 }
    !skip { print }' "$doc" >"$tmp"
  mv "$tmp" "$doc"
fi
written=$(awk -v b="$begin" -v e="$end" '$0 == e { exit } in_ { print } $0 == b { in_ = 1 }' "$doc")
echo "conformance-check: status counts:"
awk '{ print "  " $0 }' <<<"$summary"
summary_ok=1
if [ "$written" != "$summary" ]; then
  summary_ok=0
  echo "conformance-check: the summary in $doc disagrees with its table; it says" >&2
  awk '{ print "  " $0 }' <<<"$written" >&2
  echo "conformance-check: run hack/conformance-check.sh --write to regenerate it" >&2
fi

echo "conformance-check: $ntests tests and $nsymbols symbols referenced, $missing missing"
if [ "$missing" -gt 0 ] || [ "$summary_ok" = 0 ]; then
  exit 1
fi
if [ "$mode" = --strict ] && [ "$pending" -gt 0 ]; then
  echo "conformance-check: $pending row(s) pending (--strict)" >&2
  exit 1
fi
