#!/usr/bin/env bash
# Fails when a documentation path that the project names does not exist:
#   - "docs/…" paths named in README.md, docs/, the chart and config/
#     (values.yaml and values.schema.json cite docs a user is sent to);
#   - relative Markdown links ([text](path), anchors dropped) in README.md
#     and docs/, resolved against the linking file's directory.
# Run by `make verify`.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=0
report() { echo "check-doc-paths: $1 names $2, which does not exist"; missing=$((missing + 1)); }

mapfile -t sources < <(git ls-files -co --exclude-standard -- README.md 'docs/*.md' 'charts/*' 'config/*.yaml' | sort -u)
for f in "${sources[@]}"; do
  [ -f "$f" ] || continue
  # docs/... after anything that cannot be part of a longer path.
  while read -r p; do
    [ -e "$p" ] || report "$f" "$p"
  done < <(grep -oE '(^|[^A-Za-z0-9_./-])docs/[A-Za-z0-9_./-]*[A-Za-z0-9_]' "$f" | sed -E 's#^[^d]*docs/#docs/#' | sort -u)
  case "$f" in
    *.md)
      dir=$(dirname "$f")
      while read -r link; do
        target=${link%%#*}
        [ -n "$target" ] || continue
        [ -e "$dir/$target" ] || report "$f" "$target (link)"
      done < <(grep -oE '\]\([^)[:space:]]+\)' "$f" | sed -E 's/^\]\(//; s/\)$//' | grep -vE '^[a-z][a-z0-9+.-]*:' | grep -E '^[A-Za-z0-9_./-]+(#.*)?$' | sort -u)
      ;;
  esac
done
if [ "$missing" -gt 0 ]; then
  echo "check-doc-paths: $missing missing"
  exit 1
fi
echo "check-doc-paths: every documentation path named exists (${#sources[@]} files read)"
