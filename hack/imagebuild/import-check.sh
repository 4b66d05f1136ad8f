#!/usr/bin/env bash
# Proves that the archives of `make images` are what the local test node's
# containerd needs (`make check-images-import`; root): starts a throw-away
# containerd (its own root, state and socket under a temp dir; a system
# containerd, running or not, is not touched), imports every archive with
# `ctr -n k8s.io images import` as the node's setup does, checks that the
# images are listed under their full names (the CRI looks them up
# normalised, ghcr.io/hcp-io/hcp-operator:latest), and runs two of them
# with runc: the sample callee (its entrypoint, as uid 65532) and the pause
# image (uid 65535, PID 1 of its namespace, exits 0 on SIGTERM). Then stops
# containerd and removes everything it made.
#
# Needs Debian's containerd (1.6) and runc. Env: IMAGES_DIR (default
# bin/images), IMAGEBUILD (default bin/imagebuild), SNAPSHOTTER (overlayfs).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
IMAGES_DIR=${IMAGES_DIR:-bin/images}
IMAGEBUILD=${IMAGEBUILD:-bin/imagebuild}
SNAPSHOTTER=${SNAPSHOTTER:-overlayfs}
for b in containerd ctr runc containerd-shim-runc-v2; do
  command -v "$b" >/dev/null || { echo "import-check: $b not found (apt-get install containerd runc)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "import-check: run as root (containerd and runc need it)" >&2; exit 1; }

dir=$(mktemp -d /tmp/hcp-imagebuild-containerd.XXXXXX)
sock=$dir/containerd.sock
ctrd_pid=""
cleanup() {
  set +e
  if [ -n "$ctrd_pid" ]; then
    for c in $(ctr --address "$sock" -n k8s.io containers ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$c" >/dev/null 2>&1
      sleep 0.5
      ctr --address "$sock" -n k8s.io tasks delete "$c" >/dev/null 2>&1
      ctr --address "$sock" -n k8s.io containers delete "$c" >/dev/null 2>&1
    done
    kill "$ctrd_pid" 2>/dev/null
    wait "$ctrd_pid" 2>/dev/null
  fi
  # Snapshot mounts left by an interrupted run, innermost first.
  awk -v d="$dir" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l
  rm -rf "$dir"
}
trap cleanup EXIT

cat >"$dir/config.toml" <<EOF
version = 2
# Plugins that need host setup the check does not do: the CRI (CNI,
# sandbox image) and snapshotters for other filesystems.
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"
EOF
containerd --config "$dir/config.toml" --root "$dir/root" --state "$dir/state" --address "$sock" >"$dir/containerd.log" 2>&1 &
ctrd_pid=$!
for _ in $(seq 100); do
  ctr --address "$sock" version >/dev/null 2>&1 && break
  kill -0 "$ctrd_pid" 2>/dev/null || { cat "$dir/containerd.log" >&2; exit 1; }
  sleep 0.1
done
ctr() { command ctr --address "$sock" -n k8s.io "$@"; }
echo "== containerd $(command ctr --address "$sock" version | awk '/Server:/{s=1} s && /Version:/{print $2; exit}') at $sock (pid $ctrd_pid)"

failures=0
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "  ok:   $*"; }

echo "== import"
want_refs=()
while read -r _ _ tarball; do
  ctr images import --snapshotter "$SNAPSHOTTER" "$tarball" | sed 's/^/  /'
  mapfile -t -O "${#want_refs[@]}" want_refs < <("$IMAGEBUILD" describe -text "$tarball" | awk '$2 == "ref" {print $3}')
done < <("$IMAGEBUILD" list -manifest "$IMAGES_DIR/images.json")

echo "== ctr -n k8s.io images ls"
listing=$(ctr images ls)
while IFS= read -r line; do echo "  $line"; done <<<"$listing"
for ref in "${want_refs[@]}"; do
  if awk '{print $1}' <<<"$listing" | grep -qx "$ref"; then ok "listed as $ref"; else fail "$ref is not listed"; fi
done

# run_check IMAGE ID UID COMMAND: runs IMAGE detached, checks the uid and
# command line of its process, stops it with SIGTERM and reports its exit.
run_check() {
  local image=$1 id=$2 want_uid=$3 want_cmd=$4 pid uid cmd nspid
  echo "== ctr run $image"
  ctr run -d --snapshotter "$SNAPSHOTTER" "$image" "$id" >"$dir/$id.log" 2>&1
  sleep 1
  pid=$(ctr tasks ls | awk -v id="$id" '$1 == id {print $2}')
  if [ -z "$pid" ] || [ ! -d "/proc/$pid" ]; then
    fail "$image: no running task ($(ctr tasks ls | awk -v id="$id" '$1 == id'))"
  else
    uid=$(awk '/^Uid:/{print $2}' "/proc/$pid/status")
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" | sed 's/ $//')
    nspid=$(awk '/^NSpid:/{print $NF}' "/proc/$pid/status")
    if [ "$uid" = "$want_uid" ]; then ok "runs as uid $uid"; else fail "runs as uid $uid, want $want_uid"; fi
    if [ "$cmd" = "$want_cmd" ]; then ok "runs its entrypoint: $cmd (PID $nspid in its namespace)"; else fail "runs '$cmd', want '$want_cmd'"; fi
  fi
  ctr tasks kill -s SIGTERM "$id" >/dev/null 2>&1 || true
  for _ in $(seq 100); do
    [ "$(ctr tasks ls | awk -v id="$id" '$1 == id {print $3}')" = STOPPED ] && break
    sleep 0.1
  done
  # ctr exits with the task's exit code when it deletes a stopped task.
  if ctr tasks delete "$id" >/dev/null 2>&1; then
    ok "exits 0 on SIGTERM"
  else
    fail "exit code $? after SIGTERM"
    ctr tasks delete -f "$id" >/dev/null 2>&1 || true
  fi
  ctr containers delete "$id" >/dev/null 2>&1 || true
}
run_check ghcr.io/hcp-io/hcp-sample-callee:latest ib-sample-callee 65532 /sample-callee
run_check localhost/hcp-local/pause:1 ib-pause 65535 /pause

if [ "$failures" -gt 0 ]; then
  echo "import-check: $failures failure(s)"
  exit 1
fi
echo "import-check: ok (containerd stopped, $dir removed)"
