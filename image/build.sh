#!/usr/bin/env bash
# Builds faultline's one OCI image (every component; entrypoint: the `faultline` console script) with no
# Docker and no base image pull:
#   1. the project's wheel from the last commit (`git archive HEAD`, SOURCE_DATE_EPOCH = its time; or
#      IMAGE_REF=<commit>), and the dependency wheels that requirements/image.lock pins by hash
#      (downloaded once into .cache);
#   2. a Debian 12 root filesystem from Debian's packages (mmdebstrap): python3 (3.11), libstdc++6
#      (google-re2's extension links it; manylinux wheels expect it from the system), ca-certificates,
#      tzdata, systemd (for journalctl, which the agent runs: bookworm ships it in no smaller package),
#      without docs, man pages or locales;
#   3. inside it, a virtual environment /opt/faultline with the wheels installed --require-hashes
#      --no-deps, `pip check`ed; then pip, setuptools and the Debian packages that only the install needed
#      are removed, and what the image does not run is pruned (see image/customize.sh);
#   4. devtools/oci.py writes the tree as an OCI layout and archive, reproducibly, in three layers: the
#      Debian base, the locked dependencies, the project's own files.
# Output: .cache/image/faultline.oci.tar (OCI archive), .cache/image/oci/ (the same as a layout directory),
# .cache/image/digest. Needs root (mmdebstrap's root mode and chroot), mmdebstrap, and the virtualenv.
#
#   image/build.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-$root/.venv/bin/python}
out=${FAULTLINE_IMAGE_DIR:-$root/.cache/image}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

[ "$(id -u)" = 0 ] || { echo "error: make image needs root (mmdebstrap --mode=root and chroot)" >&2; exit 1; }
for c in mmdebstrap strip; do
  command -v $c >/dev/null || { echo "error: $c is missing: make system-deps" >&2; exit 1; }
done
ref=$(git rev-parse "${IMAGE_REF:-HEAD}^{commit}")  # IMAGE_REF: build another commit
product=(faultline sources patterns dataflows sinks workers cli devtools pyproject.toml)
if ! git diff --quiet "$ref" -- "${product[@]}"; then
  echo "image: note: uncommitted changes are not in the image; it is built from ${ref:0:12}"
fi

# One build at a time per output directory: two would share (and delete) one work tree.
mkdir -p "$out"
exec 9>"$out/.lock"
flock -w 1800 9 || { echo "error: another image build holds $out/.lock" >&2; exit 1; }

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
mkdir -p "$work/src" "$work/wheels" "$out/wheels"

# 1. Wheels: the project's from HEAD; the dependencies by hash (pip verifies them against the lock).
git archive "$ref" | tar -x -C "$work/src"
"$py" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$work/wheels" "$work/src"
plats=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for m in $(seq 5 36); do plats+=(--platform "manylinux_2_${m}_x86_64"); done  # Debian 12: glibc 2.36
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes --only-binary :all: \
  --python-version 3.11 --implementation cp --abi cp311 "${plats[@]}" \
  -r requirements/image.lock --dest "$out/wheels"
wheel=$(cd "$work/wheels" && ls faultline-*.whl)
version=${wheel#faultline-}; version=${version%%-*}
cp "$out/wheels"/*.whl "$work/wheels/"
{ cat requirements/image.lock
  echo "faultline==$version --hash=sha256:$(sha256sum "$work/wheels/$wheel" | cut -d' ' -f1)"
} > "$work/wheels/requirements.txt"
echo "image: wheels ready ($((SECONDS - started)) s)"

# 2 and 3. The root filesystem, with the application installed by image/customize.sh.
t=$SECONDS
exclude=()
for p in doc man info locale lintian; do  # dpkg's patterns, not the shell's
  exclude+=(--dpkgopt="path-exclude=/usr/share/$p/*")
done
exclude+=(--dpkgopt='path-include=/usr/share/doc/*/copyright')  # licences stay (the SBOM reads them)
# The merged-usr hook makes /bin, /lib... links to /usr as debootstrap does; otherwise apt would satisfy
# init-system-helpers' "usrmerge | usr-is-merged" with usrmerge, which brings the whole of Perl (51 MB).
mmdebstrap --quiet --mode=root --variant=essential --format=directory \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --aptopt='APT::Install-Recommends "false"' "${exclude[@]}" \
  --include=python3,python3-venv,libstdc++6,ca-certificates,tzdata,systemd \
  --customize-hook="bash '$root/image/customize.sh' \"\$1\" '$work/wheels'" \
  "$suite" "$work/rootfs" \
  "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main"
echo "image: root filesystem ready ($((SECONDS - t)) s)"

# 4. The OCI layout and archive. The project's files (its packages, dist-info and console script) are
# the last layer; the other installed wheels the one before; Debian the first.
t=$SECONDS
site=opt/faultline/lib/python3.11/site-packages
dist=$(cd "$work/rootfs/$site" && ls -d faultline-*.dist-info)
app="opt/faultline/bin/faultline,$site/$dist"
while read -r pkg; do app+=",$site/$pkg"; done < "$work/rootfs/$site/$dist/top_level.txt"
cat > "$work/config.json" <<EOF
{"ref_name": "$version",
 "config": {"User": "65532:65532", "WorkingDir": "/home/nonroot",
            "Entrypoint": ["/opt/faultline/bin/faultline"],
            "Env": ["PATH=/opt/faultline/bin:/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
                    "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
            "Labels": {"org.opencontainers.image.title": "faultline",
                       "org.opencontainers.image.version": "$version",
                       "org.opencontainers.image.revision": "$revision",
                       "org.opencontainers.image.licenses": "Apache-2.0"}},
 "annotations": {"org.opencontainers.image.version": "$version",
                 "org.opencontainers.image.revision": "$revision",
                 "org.opencontainers.image.created": "$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"}}
EOF
"$py" -m devtools.oci "$work/rootfs" --layout "$out/oci" --archive "$out/faultline.oci.tar" \
  --epoch "$epoch" --config "$work/config.json" \
  --layer "debian@$base_epoch=" --layer "dependencies@$base_epoch=opt/faultline" --layer "faultline=$app" \
  | tee "$work/oci.txt"
grep '^digest:' "$work/oci.txt" | cut -d' ' -f2 > "$out/digest"
echo "$version" > "$out/version"
echo "$revision" > "$out/revision"
echo "image: OCI archive written ($((SECONDS - t)) s); built in $((SECONDS - started)) s"
clean_work "$work"
