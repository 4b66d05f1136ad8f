# shellcheck shell=bash
# Sourced by hack/local-stack.sh and hack/demo.sh: build progress for long Go
# builds. Callers define log() first.

# progress LABEL: reads `go build -v` output (and script log lines) on stdin;
# prints script log lines ("[...]") and anything that looks like an error at
# once, and a summary of the packages compiled every 10 s, so that a cold
# build (minutes) is never silent and a warm one prints next to nothing.
progress() {
  local label=$1 n=0 last="" line started=$SECONDS next=$((SECONDS + 10))
  while true; do
    if IFS= read -r -t 5 line; then
      case "$line" in
        \[*) echo "$line" >&2 ;;
        *" "*|*.go:*|"#"*) echo "  $label: $line" >&2 ;;
        *) n=$((n + 1)); last=$line ;;
      esac
    else
      # Status > 128: read timed out (no output for 5 s); otherwise EOF.
      [ $? -gt 128 ] || break
    fi
    if [ $SECONDS -ge $next ]; then
      if [ $n -gt 0 ]; then
        log "$label: compiled $n packages so far ($((SECONDS - started))s; last: $last)"
      else
        log "$label: still working ($((SECONDS - started))s; resolving, compiling or linking)"
      fi
      next=$((SECONDS + 10))
    fi
  done
  [ $n -eq 0 ] || log "$label: compiled $n packages in $((SECONDS - started))s"
}

# with_progress LABEL CMD...: runs CMD with `go build -v` in effect (through
# GOFLAGS); its stderr goes through progress, its stdout is passed on.
with_progress() {
  local label=$1; shift
  { GOFLAGS="${GOFLAGS:-} -v" "$@" 2>&1 1>&3 3>&- | progress "$label"; } 3>&1
}
