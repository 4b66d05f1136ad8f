#!/usr/bin/env bash
# Checks the Dockerfile without a container runtime (none on these machines):
#
#  1. The builder stage: its Go version matches go.mod, CGO_ENABLED=0, and
#     every `RUN go build` uses exactly the Makefile's GO_BUILD_FLAGS.
#  2. It builds exactly the binaries the image needs (IMAGE_BINARIES), each
#     from ./cmd/<name>, and copies each to /<name> in the final image.
#  3. It replays the builder stage locally: copies what the COPY lines copy
#     (and .dockerignore lets through) into a temp workspace and runs the
#     exact `go build` commands there, with the stage's ENV. The binaries must
#     be static (CGO_ENABLED=0 in `go version -m`, "statically linked").
#  4. The final stage: distroless (or scratch) base, a non-root USER, an
#     exec-form ENTRYPOINT (no shell at run time).
#  5. Every command the project's pod specs run is a binary of the image:
#     the manager in the chart and config/manager, and the hcp-sidecar
#     container the operator injects (hack/installcheck).
#  6. The Dockerfile's final stage and Dockerfile.samples' image stages
#     give the images `make images` builds without Docker (hack/imagebuild,
#     `imagebuild describe`): the same exec-form ENTRYPOINT and CMD, USER,
#     WORKDIR and binary paths, and, for a distroless static:nonroot base,
#     a base layer with what that base gives (users, CA bundle, /tmp,
#     nonroot's home). Every imagebuild image but the local test node's
#     (localhost/...) must have a Dockerfile stage.
#
# Usage: hack/check-dockerfile.sh [Dockerfile]. GO_BUILD_FLAGS defaults to
# the Makefile's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dockerfile=${1:-Dockerfile}
IMAGE_BINARIES=${IMAGE_BINARIES:-"manager hcp-sidecar"}

failures=0
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "  ok:   $*"; }
# words STRING: split STRING into shell words, one per line, without
# evaluating it (quotes and backslashes handled by xargs, no expansion).
words() { printf '%s\n' "$1" | xargs -n1 printf '%s\n'; }

if [ -z "${GO_BUILD_FLAGS:-}" ]; then
  GO_BUILD_FLAGS=$(sed -n 's/^GO_BUILD_FLAGS ?= *//p' Makefile)
fi
mapfile -t want_flags < <(words "$GO_BUILD_FLAGS")

# Join continuation lines and drop comments.
instructions=$(sed -e 's/^[[:space:]]*#.*$//' "$dockerfile" | sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' | grep -v '^[[:space:]]*$')

# Split into stages.
declare -a stage_from stage_name
stage=-1
declare -A stage_lines
while IFS= read -r line; do
  read -r instr rest <<<"$line"
  instr=${instr^^}
  if [ "$instr" = FROM ]; then
    stage=$((stage + 1))
    read -r -a f <<<"$rest"
    stage_from[stage]=${f[0]}
    stage_name[stage]=""
    if [ "${#f[@]}" -ge 3 ] && [ "${f[1]^^}" = AS ]; then stage_name[stage]=${f[2]}; fi
    stage_lines[$stage]=""
    continue
  fi
  stage_lines[$stage]+="$instr $rest"$'\n'
done <<<"$instructions"
final=$stage
[ "$final" -ge 1 ] || { echo "check-dockerfile: want a multi-stage build, found $((final + 1)) stage(s)"; exit 1; }

echo "== $dockerfile: final stage"
base=${stage_from[final]}
case "$base" in
  gcr.io/distroless/static*:nonroot* | gcr.io/distroless/static*@sha256:* | scratch) ok "base image $base" ;;
  *) fail "final base image $base is not distroless static (nonroot) or scratch" ;;
esac
user=$(grep '^USER ' <<<"${stage_lines[$final]}" | tail -1 | awk '{print $2}' || true)
case "${user%%:*}" in
  "") fail "no USER line: the image would run as root" ;;
  0 | root) fail "USER $user is root" ;;
  *) ok "USER $user" ;;
esac
entry=$(grep '^ENTRYPOINT ' <<<"${stage_lines[$final]}" | tail -1 | cut -d' ' -f2- || true)
if [[ "$entry" =~ ^\[\ *\"([^\"]+)\" ]]; then
  entrypoint=${BASH_REMATCH[1]}
  ok "exec-form ENTRYPOINT $entry"
else
  entrypoint=""
  fail "ENTRYPOINT ${entry:-missing} is not in exec form: the image has no shell"
fi
if grep -q '^CMD [^[]' <<<"${stage_lines[$final]}"; then fail "shell-form CMD: the image has no shell"; fi
# COPY --from=<stage> SRC DST in the final stage: image path -> builder path.
declare -A image_files
builder=""
while read -r _ from src dst; do
  builder=${from#--from=}
  image_files[$dst]=$src
done < <(grep '^COPY --from=' <<<"${stage_lines[$final]}" || true)
[ -n "$builder" ] || fail "the final stage copies nothing from a builder stage"
bstage=""
for ((i = 0; i < final; i++)); do
  if [ "${stage_name[i]}" = "$builder" ] || [ "$i" = "$builder" ]; then bstage=$i; fi
done
[ -n "$bstage" ] || { fail "no stage named $builder"; echo "check-dockerfile: $failures failure(s)"; exit 1; }

echo "== $dockerfile: builder stage $builder (${stage_from[bstage]})"
go_mod_version=$(awk '$1=="go"{print $2}' go.mod)
go_mod_minor=$(cut -d. -f1,2 <<<"$go_mod_version")
builder_image=${stage_from[bstage]}
builder_tag=${builder_image#*:}
if [[ "$builder_image" == golang:* ]] && [[ "$builder_tag" == "$go_mod_minor" || "$builder_tag" == "$go_mod_minor".* || "$builder_tag" == "$go_mod_minor"-* ]]; then
  ok "builder image $builder_image matches go.mod's go $go_mod_version"
else
  fail "builder image $builder_image does not match go.mod's go $go_mod_version"
fi

# ARG defaults and ENV of the builder stage.
declare -A args
declare -a build_env=()
while IFS= read -r line; do
  read -r instr rest <<<"$line"
  case "$instr" in
    ARG)
      name=${rest%%=*}
      if [[ "$rest" == *=* ]]; then args[$name]=${rest#*=}; else args[$name]=""; fi
      ;;
    ENV)
      for kv in $rest; do
        k=${kv%%=*}; v=${kv#*=}
        for a in "${!args[@]}"; do v=${v//\$\{$a\}/${args[$a]}}; v=${v//\$$a/${args[$a]}}; done
        build_env+=("$k=$v")
      done
      ;;
  esac
done <<<"${stage_lines[$bstage]}"
env_value() { local kv; for kv in "${build_env[@]}"; do [ "${kv%%=*}" = "$1" ] && echo "${kv#*=}"; done | tail -1; }
if [ "$(env_value CGO_ENABLED)" = 0 ]; then ok "ENV CGO_ENABLED=0"; else fail "the builder stage does not set ENV CGO_ENABLED=0"; fi
make_cgo=$(sed -n 's/^export CGO_ENABLED ?= *//p' Makefile)
if [ "${make_cgo:-}" = 0 ]; then ok "Makefile exports CGO_ENABLED=0"; else fail "the Makefile does not export CGO_ENABLED ?= 0"; fi

tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
ws=$tmp/workspace # stands for the builder's WORKDIR
mkdir -p "$ws" "$tmp/out"

# .dockerignore in its allow-list form ("*" then "!path" lines).
allowed=""
if [ -f .dockerignore ] && grep -qx '\*' .dockerignore; then
  allowed=$(sed -n 's/^!//p' .dockerignore | sed 's:/*$::')
fi

declare -A built # builder path -> local file
declare -a built_names=()
while IFS= read -r line; do
  read -r instr rest <<<"$line"
  case "$instr" in
    COPY)
      [[ "$rest" == --from=* ]] && { fail "builder COPY $rest from another stage is not replayed"; continue; }
      read -r -a parts <<<"$rest"
      dst=${parts[-1]}
      for src in "${parts[@]:0:${#parts[@]}-1}"; do
        s=${src%/}
        if [ -n "$allowed" ] && ! grep -qx "${s%%/*}" <<<"$allowed"; then
          fail "COPY $src: .dockerignore excludes it from the build context"
        fi
        [ -e "$s" ] || { fail "COPY $src: no such path in the repository"; continue; }
        # Docker copies a directory's contents, and a file into a
        # directory destination (one ending in /) or to a file path.
        if [ -d "$s" ]; then
          mkdir -p "$ws/$dst"; cp -R "$s/." "$ws/$dst"
        elif [[ "$dst" == */ ]]; then
          mkdir -p "$ws/$dst"; cp "$s" "$ws/$dst"
        else
          mkdir -p "$(dirname "$ws/$dst")"; cp "$s" "$ws/$dst"
        fi
      done
      ;;
    RUN)
      if [ "$rest" = "go mod download" ]; then
        ok "RUN go mod download (the local module cache stands in)"
        continue
      fi
      mapfile -t cmd < <(words "$rest")
      if [ "${cmd[0]}" != go ] || [ "${cmd[1]}" != build ]; then
        fail "RUN $rest: not a go build, not replayed; extend this check"
        continue
      fi
      out="" pkg="" flags=()
      for ((i = 2; i < ${#cmd[@]}; i++)); do
        case "${cmd[i]}" in
          -o) out=${cmd[i + 1]}; i=$((i + 1)) ;;
          -o=*) out=${cmd[i]#-o=} ;;
          ./* | */*) [[ "${cmd[i]}" == -* ]] && flags+=("${cmd[i]}") || pkg=${cmd[i]} ;;
          *) flags+=("${cmd[i]}") ;;
        esac
      done
      name=$(basename "$out")
      echo "  RUN $rest"
      if [ "${flags[*]}" = "${want_flags[*]}" ] && [ "${#flags[@]}" = "${#want_flags[@]}" ]; then
        ok "$name: flags $(printf '[%s] ' "${flags[@]}")= GO_BUILD_FLAGS"
      else
        fail "$name: flags $(printf '[%s] ' "${flags[@]}")differ from GO_BUILD_FLAGS $(printf '[%s] ' "${want_flags[@]}")"
      fi
      if [ "$pkg" != "./cmd/$name" ]; then fail "$name is built from ${pkg:-?}, want ./cmd/$name"; fi
      # Replay it: the same words, the output redirected into the temp dir.
      local_out=$tmp/out/$name
      replay=(go build "${flags[@]}" -o "$local_out" "$pkg")
      if (cd "$ws" && env -u GOFLAGS "${build_env[@]}" "${replay[@]}"); then
        ok "$name: built with ${build_env[*]} ${replay[*]/#$tmp/\$TMP}"
        built[$out]=$local_out
        built_names+=("$name")
      else
        fail "$name: the Dockerfile's go build fails on the files the builder stage copies"
      fi
      ;;
  esac
done <<<"${stage_lines[$bstage]}"

echo "== binaries"
want_sorted=$(tr ' ' '\n' <<<"$IMAGE_BINARIES" | sort | xargs)
got_sorted=$(printf '%s\n' "${built_names[@]}" | sort | xargs)
if [ "$want_sorted" = "$got_sorted" ]; then ok "the image builds exactly: $got_sorted"; else fail "the image builds [$got_sorted], want [$want_sorted]"; fi
for name in $IMAGE_BINARIES; do
  [ -d "cmd/$name" ] || fail "cmd/$name does not exist"
done
others=$(comm -23 <(find cmd -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort) <(tr ' ' '\n' <<<"$IMAGE_BINARIES" | sort) | xargs)
[ -z "$others" ] || echo "  note: cmd/ also holds $others, which the image does not need"
want_ldflags=""
for f in "${want_flags[@]}"; do [[ "$f" == -ldflags=* ]] && want_ldflags=${f#-ldflags=}; done
for dst in "${!image_files[@]}"; do
  src=${image_files[$dst]}
  bin=${built[$src]:-}
  [ -n "$bin" ] || { fail "COPY --from=$builder $src $dst: the builder does not build $src"; continue; }
  info=$(go version -m "$bin")
  before=$failures
  for want in "CGO_ENABLED=0" "GOOS=linux" "GOARCH=amd64"; do
    grep -q "build[[:space:]]$want\$" <<<"$info" || fail "$dst: go version -m lacks $want"
  done
  if [[ " ${want_flags[*]} " == *" -trimpath "* ]]; then
    grep -q 'build[[:space:]]-trimpath=true' <<<"$info" || fail "$dst: not built with -trimpath"
  fi
  # With -trimpath, go does not record -ldflags in the build info; check
  # their effect instead (-s -w strip the symbol table and DWARF).
  if [ -n "$want_ldflags" ] && ! grep -q 'build[[:space:]]-trimpath=true' <<<"$info"; then
    grep -qF -e "-ldflags=\"$want_ldflags\"" <<<"$info" || fail "$dst: go version -m shows no -ldflags=\"$want_ldflags\""
  fi
  if command -v file >/dev/null; then
    desc=$(file -b "$bin")
    [[ "$desc" == *"statically linked"* ]] || fail "$dst is not statically linked: $desc"
    if [[ " $want_ldflags " == *" -s "* ]] && [[ "$desc" != *", stripped"* ]]; then
      fail "$dst is not stripped although GO_BUILD_FLAGS has -ldflags=$want_ldflags: $desc"
    fi
  fi
  [ "$failures" = "$before" ] && ok "$dst: CGO_ENABLED=0 linux/amd64, $(command -v file >/dev/null && file -b "$bin" | grep -o 'statically linked' || echo 'no file(1)'), $(du -h "$bin" | cut -f1)"
done

echo "== commands the pod specs run"
image_has() { [ -n "${image_files[$1]:-}" ]; }
check_command() { # what, command or "-", expected binary
  local what=$1 command=$2 want=$3 exe
  if [ "$command" = - ]; then exe=$entrypoint; else exe=${command%% *}; fi
  if [ "$exe" != "$want" ]; then
    if [ "$command" = - ]; then
      fail "$what sets no command, so it runs the image's ENTRYPOINT $entrypoint; it must run $want (set command: [\"$want\"])"
    else
      fail "$what runs $exe, want $want"
    fi
  elif ! image_has "$exe"; then
    fail "$what runs $exe, which the image does not contain"
  else
    ok "$what runs $exe"
  fi
}
manager_cmd=$(awk '/- name: manager/{m=1} m && /command:/{getline; sub(/^[ -]+/, ""); print; exit}' charts/hcp-operator/templates/deployment.yaml)
check_command "chart manager container" "${manager_cmd:--}" /manager
kustomize_cmd=$(sed -n 's/^ *command: *\["\([^"]*\)".*/\1/p' config/manager/manager.yaml | head -1)
check_command "config/manager container" "${kustomize_cmd:--}" /manager
while read -r name cmd; do
  check_command "injected $name container" "$cmd" /hcp-sidecar
done < <(go run ./hack/installcheck commands)

echo "== Dockerfiles against imagebuild (make images)"
# stage_instructions FILE STAGE: the instructions of the stage named STAGE
# ("" for the last), keyword upper-cased, continuations joined.
stage_instructions() {
  sed -e 's/^[[:space:]]*#.*$//' "$1" | sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' | grep -v '^[[:space:]]*$' |
    awk -v want="$2" '
      { $1 = toupper($1) }
      $1 == "FROM" { n++; names[n] = (toupper($3) == "AS") ? $4 : ""; froms[n] = $2; next }
      { buf[n] = buf[n] $0 "\n" }
      END { for (i = 1; i <= n; i++) if ((want == "" && i == n) || (want != "" && names[i] == want)) { printf "FROM %s\n%s", froms[i], buf[i]; exit } }'
}
# exec_json WORDS: an exec-form array ["a", "b"] as compact JSON; fails on
# the shell form.
exec_json() {
  [[ "$1" =~ ^\[.*\]$ ]] || return 1
  printf '[%s]' "$(grep -o '"[^"]*"' <<<"$1" | paste -sd, -)"
}
if described=$(cd hack/imagebuild && env -u GOFLAGS GOWORK=off go run . describe -text -repo "$root" 2>&1); then
  ok "imagebuild describe ($(awk '{print $1}' <<<"$described" | sort -u | wc -l) images)"
else
  fail "imagebuild describe: $described"
  described=""
fi
# compare_stage FILE STAGE IMAGE
compare_stage() {
  local file=$1 stage=$2 image=$3 lines from got want
  lines=$(stage_instructions "$file" "$stage")
  [ -n "$lines" ] || { fail "$file: no stage ${stage:-(last)}"; return; }
  from=$(sed -n 's/^FROM //p' <<<"$lines")
  if ! grep -q "^$image " <<<"$described"; then
    fail "$file stage ${stage:-(final)}: imagebuild builds no $image"
    return
  fi
  want=$(awk -v i="$image" '$1 == i && $2 == "entrypoint" {print $3}' <<<"$described")
  got=$(exec_json "$(sed -n 's/^ENTRYPOINT //p' <<<"$lines" | tail -1)") || got="(not exec form)"
  if [ "$got" = "$want" ]; then ok "$image: ENTRYPOINT $got"; else fail "$image: $file ENTRYPOINT $got, imagebuild $want"; fi
  want=$(awk -v i="$image" '$1 == i && $2 == "cmd" {print $3}' <<<"$described")
  got=$(sed -n 's/^CMD //p' <<<"$lines" | tail -1)
  if [ -n "$got" ]; then got=$(exec_json "$got") || got="(not exec form)"; else got="[]"; fi
  if [ "$got" = "$want" ]; then ok "$image: CMD $got"; else fail "$image: $file CMD $got, imagebuild $want"; fi
  want=$(awk -v i="$image" '$1 == i && $2 == "user" {print $3}' <<<"$described")
  got=$(sed -n 's/^USER //p' <<<"$lines" | tail -1)
  if [ "$got" = "$want" ]; then ok "$image: USER $got"; else fail "$image: $file USER ${got:-(none)}, imagebuild $want"; fi
  want=$(awk -v i="$image" '$1 == i && $2 == "workdir" {print $3}' <<<"$described")
  got=$(sed -n 's/^WORKDIR //p' <<<"$lines" | tail -1)
  if [ "${got:-/}" = "$want" ]; then ok "$image: WORKDIR ${got:-/ (default)}"; else fail "$image: $file WORKDIR $got, imagebuild $want"; fi
  want=$(awk -v i="$image" '$1 == i && $2 == "app" {print $3}' <<<"$described" | sort | xargs)
  got=$(awk '$1 == "COPY" {print $NF}' <<<"$lines" | sort | xargs)
  if [ "$got" = "$want" ]; then ok "$image: files $got"; else fail "$image: $file copies [$got], imagebuild packs [$want]"; fi
  case "$from" in
    gcr.io/distroless/static*:nonroot*)
      local base missing=""
      base=$(awk -v i="$image" '$1 == i && $2 == "base" {print $3, $4, $5}' <<<"$described")
      for want in "/etc/passwd 0644 0:0" "/etc/group 0644 0:0" "/etc/ssl/certs/ca-certificates.crt 0644 0:0" "/tmp/ 1777 0:0" "/home/nonroot/ 0700 65532:65532"; do
        grep -qx "$want" <<<"$base" || missing+=" [$want]"
      done
      if [ -z "$missing" ]; then ok "$image: base layer has what $from gives"; else fail "$image: base layer lacks$missing ($from has it)"; fi
      ;;
    *) fail "$file stage ${stage:-(final)}: base $from has no imagebuild equivalent" ;;
  esac
}
covered=()
if [ -n "$described" ]; then
  # The Dockerfile builds the chart's image.repository.
  operator_repo=$(awk '/^image:/{m=1; next} m && /^[^ ]/{m=0} m && $1 == "repository:" {print $2; exit}' charts/hcp-operator/values.yaml)
  compare_stage Dockerfile "" "$operator_repo"
  covered+=("$operator_repo")
  # Dockerfile.samples names each target's image in its header comment:
  #   docker build -f Dockerfile.samples --target STAGE -t IMAGE:TAG .
  while read -r stage image; do
    compare_stage Dockerfile.samples "$stage" "${image%:*}"
    covered+=("${image%:*}")
  done < <(sed -n 's/^#.*--target \([^ ]*\) -t \([^ ]*\).*/\1 \2/p' Dockerfile.samples)
  while read -r image; do
    [[ "$image" == localhost/* ]] && continue
    [[ " ${covered[*]} " == *" $image "* ]] || fail "imagebuild builds $image, which no Dockerfile stage builds"
  done < <(awk '{print $1}' <<<"$described" | sort -u)
fi

if [ "$failures" -gt 0 ]; then
  echo "check-dockerfile: $failures failure(s)"
  exit 1
fi
echo "check-dockerfile: ok"
