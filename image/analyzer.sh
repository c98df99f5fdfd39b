#!/usr/bin/env bash
# Builds the analyzer image: the product image (`make image`, .cache/image/oci) plus one layer holding the
# anomaly extra (`faultline[anomaly]`: river and numpy, scipy, narwhals), for the cluster analyzer with
# anomaly scores on (chart value analyzer.anomaly.enabled; analyzer.image names this image):
#   1. the product image of HEAD, built first (image/build.sh) when missing or built from another commit;
#   2. for each architecture of the product image (.cache/image/arches): the extra's wheels that
#      requirements/analyzer.lock pins by hash (downloaded once into .cache), installed --require-hashes
#      --no-deps for CPython 3.11 on that architecture's Linux into a tree of its own at
#      the image's site-packages (/opt/faultline/lib/python3.11/site-packages): no interpreter of the
#      image runs, so it needs no root of its own; pruned as image/customize.sh prunes (tests, stubs and C
#      sources, symbols of native extensions, console scripts) and compiled to hash-based .pyc files by
#      the development venv's CPython 3.11 (another minor version compiles nothing: the image's interpreter
#      would then compile at each start);
#   3. devtools/oci.py writes that tree as one more layer over the product image's layers of the same
#      architecture (reused as they are), the product's config with the title faultline-analyzer. The
#      layer's epoch is the last change to this script or the lock, so an ordinary commit changes only
#      the product's own layer;
#   4. both architectures' images under one OCI image index, as the product's.
# Output: .cache/image/analyzer/faultline-analyzer.oci.tar (OCI archive), .cache/image/analyzer/oci/ (the
# layout), .cache/image/analyzer/digest (the index's), version and revision (of the product image below
# it); each architecture's image in .cache/image/analyzer/<arch>/.
#
#   image/analyzer.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-$root/.venv/bin/python}
base=${FAULTLINE_IMAGE_DIR:-$root/.cache/image}
out=$base/analyzer
lock=requirements/analyzer.lock
started=$SECONDS

# 1. The product image of HEAD (what devtools/registry.py checks before it pushes one).
if [ ! -s "$base/digest" ] || [ ! -s "$base/arches" ] || [ "$(cat "$base/revision" 2>/dev/null)" != "$(git rev-parse HEAD)" ]; then
  echo "analyzer image: building the product image of HEAD first (image/build.sh)"
  bash "$root/image/build.sh"
fi
revision=$(cat "$base/revision")

mkdir -p "$out"
exec 9>"$out/.lock"
flock -w 1800 9 || { echo "error: another analyzer image build holds $out/.lock" >&2; exit 1; }
read -r -a arches < "$base/arches"
native=$("$py" -c 'from devtools.oci import native; print(native())')
declare -A wheel_arch=([amd64]=x86_64 [arm64]=aarch64)
work="$out/work"
rm -rf "$work" && mkdir -p "$work"
epoch=$(git log -1 --format=%ct "$revision")
layer_epoch=$(git log -1 --format=%ct "$revision" -- image/analyzer.sh "$lock")
version=$(cat "$base/version")
cat > "$work/config.json" <<EOF
{"ref_name": "$version",
 "config": {"Labels": {"org.opencontainers.image.title": "faultline-analyzer"}},
 "annotations": {"org.opencontainers.image.title": "faultline-analyzer"}}
EOF

layer() {  # ARCH: the extra's tree for ARCH, written as a layer over the product image of ARCH
  local arch=$1 tag=${wheel_arch[$1]} plats=() m strip=strip
  [ "$arch" = "$native" ] || strip="$tag-linux-gnu-strip"
  command -v "$strip" >/dev/null || { echo "error: $strip is missing: make system-deps" >&2; exit 1; }
  # 2. The extra's wheels by hash, installed into the layer's tree.
  for m in 2014 2010 1; do plats+=(--platform "manylinux${m}_$tag"); done
  for m in $(seq 5 36); do plats+=(--platform "manylinux_2_${m}_$tag"); done  # Debian 12: glibc 2.36
  local target=(--python-version 3.11 --implementation cp --abi cp311 "${plats[@]}")
  mkdir -p "$out/wheels/$arch" "$out/$arch"
  "$py" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes --only-binary :all: \
    "${target[@]}" -r "$lock" --dest "$out/wheels/$arch"
  local tree="$work/$arch/root" site="$work/$arch/root/opt/faultline/lib/python3.11/site-packages"
  "$py" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-index \
    --find-links "$out/wheels/$arch" --require-hashes --no-deps --only-binary :all: "${target[@]}" \
    --no-compile --target "$site" -r "$lock"
  rm -rf "$site/bin"  # console scripts (numpy's f2py): their first line names the build's interpreter
  find "$site" -depth -type d \( -name tests -o -name test \) -prune -exec rm -rf {} +
  find "$site" \( -name '*.pyi' -o -name '*.pxd' -o -name '*.pyx' -o -name '*.c' -o -name '*.cpp' \
    -o -name '*.h' \) -type f -delete
  # the native extensions' symbols, but not the libraries auditwheel vendored (numpy.libs, scipy.libs):
  # patchelf rewrote those, and a stripped OpenBLAS no longer loads ("ELF load command address/offset not
  # page-aligned")
  find "$site" -name '*.so*' -type f -not -path '*.libs/*' -exec "$strip" --strip-unneeded {} +
  # byte code is the same on every architecture: the development venv's CPython 3.11 compiles it
  if "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    "$py" -m compileall -q -j 1 --invalidation-mode unchecked-hash -s "$tree" -p / "$site" >/dev/null
  else
    echo "analyzer image: note: $py is not CPython 3.11: no .pyc files for the extra"
  fi
  # Owners and modes as the product image's own directories have them (root's, 0755; files 0644 or 0755).
  chown -R 0:0 "$tree" 2>/dev/null || true
  find "$tree" -type d -exec chmod 0755 {} +
  find "$tree" -type f -exec chmod go-w {} +

  # 3. The layer over the product image of the same architecture.
  "$py" -m devtools.oci "$tree" --base "$base/oci" --architecture "$arch" --layout "$out/$arch/oci" \
    --archive "$out/$arch/faultline-analyzer.oci.tar" --epoch "$epoch" --config "$work/config.json" \
    --layer "anomaly@$layer_epoch=opt" | sed "s/^/$arch /" | tee "$work/$arch/oci.txt"
  grep "^$arch digest:" "$work/$arch/oci.txt" | cut -d' ' -f3 > "$out/$arch/digest"
}

layouts=()
for arch in "${arches[@]}"; do
  mkdir -p "$work/$arch"
  layer "$arch"
  layouts+=("$out/$arch/oci")
done

# 4. The index.
"$py" -m devtools.oci index "${layouts[@]}" --layout "$out/oci" --archive "$out/faultline-analyzer.oci.tar" \
  --epoch "$epoch" --config "$work/config.json" | tee "$work/index.txt"
grep '^index:' "$work/index.txt" | cut -d' ' -f2 > "$out/digest"
echo "$version" > "$out/version"
echo "$revision" > "$out/revision"
echo "${arches[*]}" > "$out/arches"
echo "analyzer image: product image $(cat "$base/digest"), analyzer image $(cat "$out/digest") of" \
  "${arches[*]}; built in $((SECONDS - started)) s"
rm -rf "$work"
