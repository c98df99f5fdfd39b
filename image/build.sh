#!/usr/bin/env bash
# Builds faultline's one OCI image (every component; entrypoint: the `faultline` console script) for
# linux/amd64 and linux/arm64, with no Docker and no base image pull. For each architecture:
#   1. the project's wheel from the last commit (`git archive HEAD`, SOURCE_DATE_EPOCH = its time; or
#      IMAGE_REF=<commit>), and the architecture's dependency wheels that requirements/image.lock pins by
#      hash (the lock holds every artifact's hash; downloaded once into .cache);
#   2. a Debian 12 root filesystem from Debian's packages (mmdebstrap): python3 (3.11), libstdc++6
#      (google-re2's extension links it; manylinux wheels expect it from the system), ca-certificates,
#      tzdata, systemd (for journalctl, which the agent runs: bookworm ships it in no smaller package),
#      without docs, man pages or locales;
#   3. inside it, a virtual environment /opt/faultline with the wheels installed --require-hashes
#      --no-deps, `pip check`ed; then pip, setuptools and the Debian packages that only the install needed
#      are removed, and what the image does not run is pruned (see image/customize.sh);
#   4. devtools/oci.py writes the tree as an OCI layout and archive, reproducibly, in three layers: the
#      Debian base, the locked dependencies, the project's own files.
# Another architecture's steps 2 and 3 run its binaries under QEMU's user-mode emulator
# (qemu-user-static), registered only inside the build's own user namespace (devtools/foreign.py):
# nothing on the machine changes. Then devtools/oci.py puts the images under one OCI image index.
# Output: .cache/image/faultline.oci.tar (OCI archive of the index and its images), .cache/image/oci/ (the
# same as a layout directory), .cache/image/digest (the index's: what the chart and the nodes pull), the
# build's report of sizes and digests in .cache/image/report.txt; each architecture's own image in
# .cache/image/<arch>/ (archive, layout, manifest digest). Needs root
# (mmdebstrap's root mode and chroot), mmdebstrap, qemu-user-static and the aarch64 binutils (make
# system-deps), and the virtualenv.
#
#   image/build.sh                       both architectures
#   IMAGE_ARCHES=amd64 image/build.sh    one (an index of one image)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-$root/.venv/bin/python}
out=${FAULTLINE_IMAGE_DIR:-$root/.cache/image}
read -r -a arches <<<"${IMAGE_ARCHES:-amd64 arm64}"
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
native=$("$py" -c 'from devtools.oci import native; print(native())')
declare -A wheel_arch=([amd64]=x86_64 [arm64]=aarch64)  # Debian's name -> the wheels' platform tags'

strip_for() {  # the binutils strip that reads ARCH's ELF files
  if [ "$1" = "$native" ]; then echo strip; else echo "${wheel_arch[$1]}-linux-gnu-strip"; fi
}
[ "$(id -u)" = 0 ] || { echo "error: make image needs root (mmdebstrap --mode=root and chroot)" >&2; exit 1; }
for arch in "${arches[@]}"; do
  [ -n "${wheel_arch[$arch]:-}" ] || { echo "error: IMAGE_ARCHES: $arch is not amd64 or arm64" >&2; exit 1; }
  for c in mmdebstrap "$(strip_for "$arch")"; do
    command -v "$c" >/dev/null || { echo "error: $c is missing: make system-deps" >&2; exit 1; }
  done
  if [ "$arch" != "$native" ] && [ ! -e "/usr/lib/binfmt.d/qemu-${wheel_arch[$arch]}.conf" ]; then
    echo "error: qemu-user-static is missing ($arch on $native): make system-deps" >&2; exit 1
  fi
done
ref=$(git rev-parse "${IMAGE_REF:-HEAD}^{commit}")  # IMAGE_REF: build another commit
product=(faultline sources patterns dataflows sinks workers cli devtools pyproject.toml)
if ! git diff --quiet "$ref" -- "${product[@]}"; then
  echo "image: note: uncommitted changes are not in the image; it is built from ${ref:0:12}"
fi

# One build at a time per output directory: two would share (and delete) one work tree.
mkdir -p "$out"
exec 9>"$out/.lock"
flock -w 3600 9 || { echo "error: another image build holds $out/.lock" >&2; exit 1; }

# What a killed mmdebstrap may leave mounted in the work tree (/proc, /dev, /sys) is unmounted, deepest
# first, before anything is removed, and removal never crosses into another file system (the host's /dev).
clean_work() {
  local m
  for m in $(awk -v w="$1/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m"
  done
  rm -rf --one-file-system "$1"
}

started=$SECONDS
epoch=$(git log -1 --format=%ct "$ref")
# The Debian and dependency layers' own epoch: the last change to their recipe or the lock, so that other
# commits leave them (and their digests) as they were.
base_epoch=$(git log -1 --format=%ct "$ref" -- image requirements)
revision=$ref
export SOURCE_DATE_EPOCH=$epoch PYTHONHASHSEED=0
work="$out/work"
clean_work "$work"
mkdir -p "$work/src" "$work/project"

# 1. The project's wheel from the commit (pure Python: the same for every architecture).
git archive "$ref" | tar -x -C "$work/src"
"$py" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$work/project" "$work/src"
wheel=$(cd "$work/project" && ls faultline-*.whl)
version=${wheel#faultline-}; version=${version%%-*}
annotations="\"org.opencontainers.image.version\": \"$version\",
                 \"org.opencontainers.image.revision\": \"$revision\",
                 \"org.opencontainers.image.created\": \"$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)\""

build_arch() {  # ARCH: its wheels, root filesystem and image, into $out/ARCH
  local arch=$1 t=$SECONDS tag=${wheel_arch[$1]} wheels="$work/$1/wheels" rootfs="$work/$1/rootfs"
  local plats=() emulate=() exclude=() m p
  mkdir -p "$wheels" "$out/wheels/$arch" "$out/$arch"
  for m in 2014 2010 1; do plats+=(--platform "manylinux${m}_$tag"); done
  for m in $(seq 5 36); do plats+=(--platform "manylinux_2_${m}_$tag"); done  # Debian 12: glibc 2.36
  "$py" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes --only-binary :all: \
    --python-version 3.11 --implementation cp --abi cp311 "${plats[@]}" \
    -r requirements/image.lock --dest "$out/wheels/$arch"
  cp "$out/wheels/$arch"/*.whl "$work/project/$wheel" "$wheels/"
  { cat requirements/image.lock
    echo "faultline==$version --hash=sha256:$(sha256sum "$wheels/$wheel" | cut -d' ' -f1)"
  } > "$wheels/requirements.txt"
  echo "image ($arch): wheels ready ($((SECONDS - t)) s)"

  # 2 and 3. The root filesystem, with the application installed by image/customize.sh.
  t=$SECONDS
  for p in doc man info locale lintian; do  # dpkg's patterns, not the shell's
    exclude+=(--dpkgopt="path-exclude=/usr/share/$p/*")
  done
  exclude+=(--dpkgopt='path-include=/usr/share/doc/*/copyright')  # licences stay (the SBOM reads them)
  # Another architecture's maintainer scripts and the customize hook run under QEMU, registered in the
  # build's own user namespace with the F flag (the chroot needs no emulator inside); mmdebstrap's own
  # check for an emulator looks at the machine's registrations, so it is skipped.
  if [ "$arch" != "$native" ]; then emulate=("$py" -m devtools.foreign "$arch" --); fi
  # The merged-usr hook makes /bin, /lib... links to /usr as debootstrap does; otherwise apt would satisfy
  # init-system-helpers' "usrmerge | usr-is-merged" with usrmerge, which brings the whole of Perl (51 MB).
  "${emulate[@]}" mmdebstrap --quiet --mode=root --variant=essential --architectures="$arch" \
    --skip=check/qemu --format=directory \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='APT::Install-Recommends "false"' "${exclude[@]}" \
    --include=python3,python3-venv,libstdc++6,ca-certificates,tzdata,systemd \
    --customize-hook="bash '$root/image/customize.sh' \"\$1\" '$wheels' '$(strip_for "$arch")'" \
    "$suite" "$rootfs" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main"
  echo "image ($arch): root filesystem ready ($((SECONDS - t)) s)"

  # 4. The OCI layout and archive. The project's files (its packages, dist-info and console script) are
  # the last layer; the other installed wheels the one before; Debian the first.
  t=$SECONDS
  local site=opt/faultline/lib/python3.11/site-packages dist app pkg
  dist=$(cd "$rootfs/$site" && ls -d faultline-*.dist-info)
  app="opt/faultline/bin/faultline,$site/$dist"
  while read -r pkg; do app+=",$site/$pkg"; done < "$rootfs/$site/$dist/top_level.txt"
  cat > "$work/$arch/config.json" <<EOF
{"ref_name": "$version",
 "config": {"User": "65532:65532", "WorkingDir": "/home/nonroot",
            "Entrypoint": ["/opt/faultline/bin/faultline"],
            "Env": ["PATH=/opt/faultline/bin:/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
                    "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
            "Labels": {"org.opencontainers.image.title": "faultline",
                       "org.opencontainers.image.version": "$version",
                       "org.opencontainers.image.revision": "$revision",
                       "org.opencontainers.image.licenses": "Apache-2.0"}},
 "annotations": {$annotations}}
EOF
  "$py" -m devtools.oci "$rootfs" --architecture "$arch" --layout "$out/$arch/oci" \
    --archive "$out/$arch/faultline.oci.tar" --epoch "$epoch" --config "$work/$arch/config.json" \
    --layer "debian@$base_epoch=" --layer "dependencies@$base_epoch=opt/faultline" --layer "faultline=$app" \
    | sed "s/^/$arch /" | tee "$work/$arch/oci.txt"
  grep "^$arch digest:" "$work/$arch/oci.txt" | cut -d' ' -f3 > "$out/$arch/digest"
  echo "image ($arch): OCI archive written ($((SECONDS - t)) s)"
  clean_work "$rootfs"
}

layouts=()
for arch in "${arches[@]}"; do
  build_arch "$arch"
  layouts+=("$out/$arch/oci")
done

# The index: the images under one digest; a node's runtime pulls its own architecture's.
cat > "$work/index.json" <<EOF
{"ref_name": "$version", "annotations": {$annotations}}
EOF
"$py" -m devtools.oci index "${layouts[@]}" --layout "$out/oci" --archive "$out/faultline.oci.tar" \
  --epoch "$epoch" --config "$work/index.json" | tee "$work/index.txt"
grep '^index:' "$work/index.txt" | cut -d' ' -f2 > "$out/digest"
echo "$version" > "$out/version"
echo "$revision" > "$out/revision"
echo "${arches[*]}" > "$out/arches"
echo "image: index $(cat "$out/digest") of ${arches[*]}; built in $((SECONDS - started)) s" | tee "$work/built.txt"
# What the build printed about its images, kept beside them (report.txt): each architecture's sizes and
# digests, the index's archive and the time taken.
for arch in "${arches[@]}"; do cat "$work/$arch/oci.txt"; done > "$out/report.txt"
cat "$work/index.txt" "$work/built.txt" >> "$out/report.txt"
clean_work "$work"
