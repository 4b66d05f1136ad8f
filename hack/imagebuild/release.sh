#!/usr/bin/env bash
# The release's dry run (`make release`): assembles in DIST everything a
# release publishes, pushing nothing.
#
#   DIST/<image>.tar                  OCI archives of the release images (from IMAGES_DIR)
#   DIST/<image>.linux-<arch>.cdx.json CycloneDX SBOM of each image and platform
#   DIST/hcp-operator-<v>.tgz          the chart, version and appVersion <v>,
#                                      image.digest pinned to the operator's index
#   DIST/SHA256SUMS                    of all of the above
#
# The chart is packaged from a temp copy; charts/ is never edited. Env
# (make sets it): IMAGEBUILD, HELM, CYCLONEDX_GOMOD, IMAGES_DIR, DIST,
# RELEASE_VERSION.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
: "${IMAGEBUILD:?}" "${HELM:?}" "${CYCLONEDX_GOMOD:?}" "${IMAGES_DIR:?}" "${DIST:?}" "${RELEASE_VERSION:?}"
manifest=$IMAGES_DIR/images.json
operator=ghcr.io/hcp-io/hcp-operator

# Each release image must carry the release version's tag, or the chart
# (whose appVersion is the default tag) would name an image not released.
while read -r name _ tarball; do
  if ! "$IMAGEBUILD" describe -text "$tarball" | grep -qx "$name ref $name:$RELEASE_VERSION"; then
    echo "release: $tarball is not tagged $RELEASE_VERSION (make images IMAGE_TAGS=$RELEASE_VERSION,latest)" >&2
    exit 1
  fi
done < <("$IMAGEBUILD" list -release -manifest "$manifest")

rm -rf "$DIST"
mkdir -p "$DIST"
echo "== images"
while read -r name digest tarball; do
  cp "$tarball" "$DIST/"
  echo "$name@$digest  $(basename "$tarball")"
done < <("$IMAGEBUILD" list -release -manifest "$manifest")

echo "== SBOMs (cyclonedx-gomod bin, joined per image and platform)"
"$IMAGEBUILD" sbom -manifest "$manifest" -cyclonedx "$CYCLONEDX_GOMOD" -version "v$RELEASE_VERSION" -out "$DIST" | sed "s|^$DIST/||"

echo "== chart"
digest=$("$IMAGEBUILD" digest -manifest "$manifest" "$operator")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -R charts/hcp-operator "$tmp/"
values=$tmp/hcp-operator/values.yaml
# Set image.digest: the first `digest:` inside the top-level `image:` block.
awk -v d="$digest" '
  /^[^ #]/ { inimage = ($0 ~ /^image:/) }
  inimage && !done && /^  digest:/ { sub(/digest:.*/, "digest: \"" d "\""); done = 1 }
  { print }
  END { if (!done) exit 1 }
' "$values" >"$values.new" || { echo "release: no image.digest in $values" >&2; exit 1; }
mv "$values.new" "$values"
"$HELM" lint --strict "$tmp/hcp-operator" >/dev/null
"$HELM" package "$tmp/hcp-operator" --version "$RELEASE_VERSION" --app-version "$RELEASE_VERSION" -d "$DIST" | sed "s|$DIST/||"
chart=$DIST/hcp-operator-$RELEASE_VERSION.tgz
# The packaged chart must render the pinned image for the manager and for
# the sidecars it injects.
rendered=$("$HELM" template hcp-operator "$chart" --namespace hcp-system)
want="$operator@$digest"
grep -q "image: $want\$" <<<"$rendered" || { echo "release: the chart does not render image: $want" >&2; exit 1; }
grep -q -- "--sidecar-image=$want\$" <<<"$rendered" || { echo "release: the chart does not render --sidecar-image=$want" >&2; exit 1; }
echo "values image.digest: $digest (manager and sidecar render $want)"

echo "== SHA256SUMS"
(
  cd "$DIST"
  files=$(find . -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort)
  xargs sha256sum <<<"$files" >SHA256SUMS
  cat SHA256SUMS
)
echo "release: dry run complete in $DIST (nothing pushed)"
