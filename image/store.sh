#!/usr/bin/env bash
# Builds the embedded store's two OCI images, the way image/build.sh builds faultline's (no Docker, no
# base image pull, devtools/oci.py writing the layout and archive reproducibly; linux/amd64 and
# linux/arm64 under one image index, the foreign one's Debian steps under QEMU user emulation registered
# only in the build's own user namespace, devtools/foreign.py):
#   ferretdb  FerretDB v1.24 (tools/ferretdb: one static Go binary, built for each architecture) on an empty
#             base: the binary, /etc/passwd and /etc/group naming user 65532, an empty /tmp. Nothing else
#             runs in it, so nothing else is in it.
#   postgres  Debian 12's postgresql-15 (mmdebstrap, essential variant, merged /usr, no docs/man/locales)
#             with image/postgres-entrypoint.sh (initdb on the first start with the chart's password, then
#             PostgreSQL as PID 1); user 65532.
# Output: .cache/image/store/<name>.oci.tar, <name>/ (the layout) and <name>.digest (the index's); each
# architecture's image in .cache/image/store/<arch>/. The postgres image needs root (mmdebstrap's root
# mode); the ferretdb image does not.
#
#   image/store.sh [ferretdb] [postgres]      # default: both; IMAGE_ARCHES="amd64 arm64" by default
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-$root/.venv/bin/python}
out=${FAULTLINE_IMAGE_DIR:-$root/.cache/image}/store
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
ferretdb_version=1.24.2
postgres_version=15
read -r -a arches <<<"${IMAGE_ARCHES:-amd64 arm64}"
native=$("$py" -c 'from devtools.oci import native; print(native())')
mkdir -p "$out"
# An image's time and revision: the last commit that changed its inputs (other commits leave its digest
# as it was); HEAD's while those inputs are not yet committed.
epoch_of() { local e; e=$(git log -1 --format=%ct -- "$@"); echo "${e:-$(git log -1 --format=%ct)}"; }
revision_of() { local r; r=$(git log -1 --format=%H -- "$@"); echo "${r:-$(git rev-parse HEAD)}"; }
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(ferretdb postgres)

# the image's config: NAME VERSION USER ENTRYPOINT-JSON ENV-JSON EPOCH REVISION
config() {
  cat <<JSON
{"ref_name": "$2",
 "config": {"User": "$3", "Entrypoint": $4, "Env": $5,
            "Labels": {"org.opencontainers.image.title": "faultline-$1",
                       "org.opencontainers.image.version": "$2",
                       "org.opencontainers.image.revision": "$7",
                       "org.opencontainers.image.licenses": "Apache-2.0"}},
 "annotations": {"org.opencontainers.image.version": "$2",
                 "org.opencontainers.image.created": "$(date -u -d "@$6" +%Y-%m-%dT%H:%M:%SZ)"}}
JSON
}

write() {  # NAME ARCH ROOTFS EPOCH CONFIG LAYER...: ARCH's image of NAME
  local name=$1 arch=$2 rootfs=$3 epoch=$4 cfg=$5; shift 5
  local layers=()
  for l in "$@"; do layers+=(--layer "$l"); done
  mkdir -p "$out/$arch"
  "$py" -m devtools.oci "$rootfs" --architecture "$arch" --layout "$out/$arch/$name" \
    --archive "$out/$arch/$name.oci.tar" --epoch "$epoch" --config "$cfg" "${layers[@]}" \
    | sed "s/^/$arch /" | tee "$out/$arch/$name.txt"
  grep "^$arch digest:" "$out/$arch/$name.txt" | cut -d' ' -f3 > "$out/$arch/$name.digest"
}

index() {  # NAME EPOCH CONFIG: the architectures' images of NAME under one index
  local name=$1 epoch=$2 cfg=$3 layouts=() arch
  for arch in "${arches[@]}"; do layouts+=("$out/$arch/$name"); done
  "$py" -m devtools.oci index "${layouts[@]}" --layout "$out/$name" --archive "$out/$name.oci.tar" \
    --epoch "$epoch" --config "$cfg" | tee "$out/$name.txt"
  grep '^index:' "$out/$name.txt" | cut -d' ' -f2 > "$out/$name.digest"
}

nonroot() {  # ROOTFS: user and group 65532, as in faultline's image
  mkdir -p "$1/etc"
  echo 'nonroot:x:65532:65532:faultline store:/tmp:/usr/sbin/nologin' >> "$1/etc/passwd"
  echo 'nonroot:x:65532:' >> "$1/etc/group"
}

ferretdb() {
  local t=$SECONDS work="$out/work-ferretdb" arch
  local epoch; epoch=$(epoch_of image/store.sh tools/ferretdb)
  rm -rf "$work" && mkdir -p "$work"
  config ferretdb "$ferretdb_version" "65532:65532" '["/usr/local/bin/ferretdb"]' \
    '["PATH=/usr/local/bin"]' "$epoch" "$(revision_of image/store.sh tools/ferretdb)" > "$work/config.json"
  for arch in "${arches[@]}"; do
    local rootfs="$work/$arch/rootfs"
    mkdir -p "$rootfs/usr/local/bin" "$rootfs/tmp" "$rootfs/"{dev,proc,sys,run} "$rootfs/etc"
    chmod 1777 "$rootfs/tmp"
    # tools/ferretdb's module, as tools/build.sh builds it, for this architecture (Go cross-compiles it)
    (cd tools/ferretdb && go mod download && CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath \
      -tags selinux,notest,grpcnotrace -ldflags "-s -w" -o "$rootfs/usr/local/bin/ferretdb" .)
    chmod 0755 "$rootfs/usr/local/bin/ferretdb"
    echo 'root:x:0:0:root:/root:/usr/sbin/nologin' > "$rootfs/etc/passwd"
    echo 'root:x:0:' > "$rootfs/etc/group"
    nonroot "$rootfs"
    write ferretdb "$arch" "$rootfs" "$epoch" "$work/config.json" "ferretdb="
  done
  index ferretdb "$epoch" "$work/config.json"
  rm -rf "$work"
  echo "image-store: ferretdb built in $((SECONDS - t)) s"
}

postgres() {
  [ "$(id -u)" = 0 ] || { echo "error: the postgres image needs root (mmdebstrap --mode=root)" >&2; exit 1; }
  command -v mmdebstrap >/dev/null || { echo "error: mmdebstrap is missing: make system-deps" >&2; exit 1; }
  local t=$SECONDS work="$out/work-postgres" arch
  rm -rf "$work" && mkdir -p "$work"
  local epoch; epoch=$(epoch_of image/store.sh image/postgres-entrypoint.sh)
  export SOURCE_DATE_EPOCH=$epoch
  local bin=/usr/lib/postgresql/$postgres_version/bin
  config postgres "$postgres_version" "65532:65532" '["/usr/local/bin/faultline-postgres"]' \
    "[\"PATH=$bin:/usr/local/bin:/usr/bin:/bin\", \"LANG=C.UTF-8\", \"PGDATA=/var/lib/postgresql/data/pgdata\"]" \
    "$epoch" "$(revision_of image/store.sh image/postgres-entrypoint.sh)" > "$work/config.json"
  # What PostgreSQL itself never runs, removed after the install (dpkg --force-depends: the packages that
  # declare a need for them are kept): the LLVM JIT (llvmjit.so and its bitcode, libLLVM-14, libz3: 150 MB;
  # the entrypoint sets jit=off, and faultline's small queries would not gain from it), Perl (postgresql-
  # common's cluster wrappers, which the entrypoint does not use: 50 MB) and the locale sources (initdb
  # runs with --no-locale: 15 MB).
  local prune='r=$1 v=$2
    rm -rf "$r/usr/lib/postgresql/$v/lib/llvmjit.so" "$r/usr/lib/postgresql/$v/lib/llvmjit_types.bc" \
      "$r/usr/lib/postgresql/$v/lib/bitcode"
    chroot "$r" dpkg --purge --force-depends libllvm14 libz3-4 perl libperl5.36 perl-modules-5.36 locales \
      >/dev/null 2>&1'
  local exclude=()
  for p in doc man info locale lintian; do exclude+=(--dpkgopt="path-exclude=/usr/share/$p/*"); done
  exclude+=(--dpkgopt='path-include=/usr/share/doc/*/copyright')
  # postgresql-common would create a cluster in /var/lib/postgresql at install: the entrypoint makes its
  # own in the volume instead
  for arch in "${arches[@]}"; do
  local emulate=() rootfs="$work/$arch/rootfs"
  mkdir -p "$work/$arch"
  if [ "$arch" != "$native" ]; then emulate=("$py" -m devtools.foreign "$arch" --); fi
  "${emulate[@]}" mmdebstrap --quiet --mode=root --variant=essential --architectures="$arch" \
    --skip=check/qemu --format=directory \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='APT::Install-Recommends "false"' "${exclude[@]}" \
    --essential-hook='mkdir -p "$1/etc/postgresql-common/createcluster.d" && echo "create_main_cluster = false" > "$1/etc/postgresql-common/createcluster.d/faultline.conf"' \
    --include="postgresql-$postgres_version" \
    --customize-hook="install -m 0755 '$root/image/postgres-entrypoint.sh' \"\$1/usr/local/bin/faultline-postgres\"" \
    --customize-hook="bash -c '$prune' prune \"\$1\" $postgres_version" \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/* "$1"/var/cache/ldconfig/aux-cache "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old; : > "$1/etc/machine-id"' \
    "$suite" "$rootfs" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main"
  nonroot "$rootfs"
  install -d -o 65532 -g 65532 -m 0775 "$rootfs/var/lib/postgresql/data"
  write postgres "$arch" "$rootfs" "$epoch" "$work/config.json" "postgres="
  rm -rf --one-file-system "$rootfs"
  done
  index postgres "$epoch" "$work/config.json"
  rm -rf "$work"
  echo "image-store: postgres built in $((SECONDS - t)) s"
}

for n in "${names[@]}"; do
  case $n in
    ferretdb) ferretdb ;;
    postgres) postgres ;;
    *) echo "error: unknown store image $n (ferretdb, postgres)" >&2; exit 2 ;;
  esac
done
