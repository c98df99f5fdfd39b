#!/usr/bin/env bash
# Builds the analyzer image: the product image (`make image`, .cache/image/oci) plus one layer holding the
# anomaly extra (`faultline[anomaly]`: river and numpy, scipy, narwhals), for the cluster analyzer with
# anomaly scores on (chart value analyzer.anomaly.enabled; analyzer.image names this image):
#   1. the product image of HEAD, built first (image/build.sh) when missing or built from another commit;
#   2. the extra's wheels that requirements/analyzer.lock pins by hash (downloaded once into .cache),
#      installed --require-hashes --no-deps for CPython 3.11 on x86_64 Linux into a tree of its own at
#      the image's site-packages (/opt/faultline/lib/python3.11/site-packages): no interpreter of the
#      image runs, so it needs no root of its own; pruned as image/customize.sh prunes (tests, stubs and C
#      sources, symbols of native extensions, console scripts) and compiled to hash-based .pyc files by
#      the development venv's CPython 3.11 (another minor version compiles nothing: the image's interpreter
#      would then compile at each start);
#   3. devtools/oci.py writes that tree as one more layer over the product image's layers (reused as
#      they are), the product's config with the title faultline-analyzer. The layer's epoch is the last
#      change to this script or the lock, so an ordinary commit changes only the product's own layer.
# Output: .cache/image/analyzer/faultline-analyzer.oci.tar (OCI archive), .cache/image/analyzer/oci/ (the
# layout), .cache/image/analyzer/digest, version and revision (of the product image below it).
#
#   image/analyzer.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-$root/.venv/bin/python}
base=${FAULTLINE_IMAGE_DIR:-$root/.cache/image}
out=$base/analyzer
lock=requirements/analyzer.lock
command -v strip >/dev/null || { echo "error: strip is missing: make system-deps" >&2; exit 1; }
started=$SECONDS

# 1. The product image of HEAD (what devtools/registry.py checks before it pushes one).
if [ ! -s "$base/digest" ] || [ "$(cat "$base/revision" 2>/dev/null)" != "$(git rev-parse HEAD)" ]; then
  echo "analyzer image: building the product image of HEAD first (image/build.sh)"
  bash "$root/image/build.sh"
fi
revision=$(cat "$base/revision")

mkdir -p "$out"
exec 9>"$out/.lock"
flock -w 1800 9 || { echo "error: another analyzer image build holds $out/.lock" >&2; exit 1; }
work="$out/work"
rm -rf "$work" && mkdir -p "$work" "$out/wheels"

# 2. The extra's wheels by hash, installed into the layer's tree.
plats=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for m in $(seq 5 36); do plats+=(--platform "manylinux_2_${m}_x86_64"); done  # Debian 12: glibc 2.36
target=(--python-version 3.11 --implementation cp --abi cp311 "${plats[@]}")
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes --only-binary :all: \
  "${target[@]}" -r "$lock" --dest "$out/wheels"
site="$work/root/opt/faultline/lib/python3.11/site-packages"
"$py" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-index --find-links "$out/wheels" \
  --require-hashes --no-deps --only-binary :all: "${target[@]}" --no-compile --target "$site" -r "$lock"
rm -rf "$site/bin"  # console scripts (numpy's f2py): their first line names the build's interpreter
find "$site" -depth -type d \( -name tests -o -name test \) -prune -exec rm -rf {} +
find "$site" \( -name '*.pyi' -o -name '*.pxd' -o -name '*.pyx' -o -name '*.c' -o -name '*.cpp' \
  -o -name '*.h' \) -type f -delete
# the native extensions' symbols, but not the libraries auditwheel vendored (numpy.libs, scipy.libs):
# patchelf rewrote those, and a stripped OpenBLAS no longer loads ("ELF load command address/offset not
# page-aligned")
find "$site" -name '*.so*' -type f -not -path '*.libs/*' -exec strip --strip-unneeded {} +
if "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  "$py" -m compileall -q -j 1 --invalidation-mode unchecked-hash -s "$work/root" -p / "$site" >/dev/null
else
  echo "analyzer image: note: $py is not CPython 3.11: no .pyc files for the extra"
fi
# Owners and modes as the product image's own directories have them (root's, 0755; files 0644 or 0755).
chown -R 0:0 "$work/root" 2>/dev/null || true
find "$work/root" -type d -exec chmod 0755 {} +
find "$work/root" -type f -exec chmod go-w {} +

# 3. The layer over the product image.
epoch=$(git log -1 --format=%ct "$revision")
layer_epoch=$(git log -1 --format=%ct "$revision" -- image/analyzer.sh "$lock")
version=$(cat "$base/version")
cat > "$work/config.json" <<EOF
{"ref_name": "$version",
 "config": {"Labels": {"org.opencontainers.image.title": "faultline-analyzer"}},
 "annotations": {"org.opencontainers.image.title": "faultline-analyzer"}}
EOF
"$py" -m devtools.oci "$work/root" --base "$base/oci" --layout "$out/oci" \
  --archive "$out/faultline-analyzer.oci.tar" --epoch "$epoch" --config "$work/config.json" \
  --layer "anomaly@$layer_epoch=opt" | tee "$work/oci.txt"
grep '^digest:' "$work/oci.txt" | cut -d' ' -f2 > "$out/digest"
echo "$version" > "$out/version"
echo "$revision" > "$out/revision"
echo "analyzer image: product image $(cat "$base/digest"), analyzer image $(cat "$out/digest");" \
  "built in $((SECONDS - started)) s"
rm -rf "$work"
