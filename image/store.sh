#!/usr/bin/env bash
# Builds the embedded store's two OCI images, the way image/build.sh builds faultline's (no Docker, no
# base image pull, devtools/oci.py writing the layout and archive reproducibly):
#   ferretdb  FerretDB v1.24 (tools/ferretdb, built by tools/build.sh: one static Go binary) on an empty
#             base: the binary, /etc/passwd and /etc/group naming user 65532, an empty /tmp. Nothing else
#             runs in it, so nothing else is in it.
#   postgres  Debian 12's postgresql-15 (mmdebstrap, essential variant, merged /usr, no docs/man/locales)
#             with image/postgres-entrypoint.sh (initdb on the first start with the chart's password, then
#             PostgreSQL as PID 1); user 65532.
# Output: .cache/image/store/<name>.oci.tar, <name>/ (the layout) and <name>.digest. The postgres image
# needs root (mmdebstrap's root mode); the ferretdb image does not.
#
#   image/store.sh [ferretdb] [postgres]      # default: both
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

write() {  # NAME ROOTFS EPOCH CONFIG LAYER...
  local name=$1 rootfs=$2 epoch=$3 cfg=$4; shift 4
  local layers=()
  for l in "$@"; do layers+=(--layer "$l"); done
  "$py" -m devtools.oci "$rootfs" --layout "$out/$name" --archive "$out/$name.oci.tar" --epoch "$epoch" \
    --config "$cfg" "${layers[@]}" | tee "$out/$name.txt"
  grep '^digest:' "$out/$name.txt" | cut -d' ' -f2 > "$out/$name.digest"
}

nonroot() {  # ROOTFS: user and group 65532, as in faultline's image
  mkdir -p "$1/etc"
  echo 'nonroot:x:65532:65532:faultline store:/tmp:/usr/sbin/nologin' >> "$1/etc/passwd"
  echo 'nonroot:x:65532:' >> "$1/etc/group"
}

ferretdb() {
  bash tools/build.sh ferretdb >/dev/null
  local t=$SECONDS work="$out/work-ferretdb"
  rm -rf "$work" && mkdir -p "$work/rootfs/usr/local/bin" "$work/rootfs/tmp" "$work/rootfs/"{dev,proc,sys,run}
  chmod 1777 "$work/rootfs/tmp"
  install -m 0755 .cache/bin/ferretdb "$work/rootfs/usr/local/bin/ferretdb"
  mkdir -p "$work/rootfs/etc"
  echo 'root:x:0:0:root:/root:/usr/sbin/nologin' > "$work/rootfs/etc/passwd"
  echo 'root:x:0:' > "$work/rootfs/etc/group"
  nonroot "$work/rootfs"
  local epoch; epoch=$(epoch_of image/store.sh tools/ferretdb)
  config ferretdb "$ferretdb_version" "65532:65532" '["/usr/local/bin/ferretdb"]' \
    '["PATH=/usr/local/bin"]' "$epoch" "$(revision_of image/store.sh tools/ferretdb)" > "$work/config.json"
  write ferretdb "$work/rootfs" "$epoch" "$work/config.json" "ferretdb="
  rm -rf "$work"
  echo "image-store: ferretdb built in $((SECONDS - t)) s"
}

postgres() {
  [ "$(id -u)" = 0 ] || { echo "error: the postgres image needs root (mmdebstrap --mode=root)" >&2; exit 1; }
  command -v mmdebstrap >/dev/null || { echo "error: mmdebstrap is missing: make system-deps" >&2; exit 1; }
  local t=$SECONDS work="$out/work-postgres"
  rm -rf "$work" && mkdir -p "$work"
  local epoch; epoch=$(epoch_of image/store.sh image/postgres-entrypoint.sh)
  export SOURCE_DATE_EPOCH=$epoch
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
  mmdebstrap --quiet --mode=root --variant=essential --format=directory \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='APT::Install-Recommends "false"' "${exclude[@]}" \
    --essential-hook='mkdir -p "$1/etc/postgresql-common/createcluster.d" && echo "create_main_cluster = false" > "$1/etc/postgresql-common/createcluster.d/faultline.conf"' \
    --include="postgresql-$postgres_version" \
    --customize-hook="install -m 0755 '$root/image/postgres-entrypoint.sh' \"\$1/usr/local/bin/faultline-postgres\"" \
    --customize-hook="bash -c '$prune' prune \"\$1\" $postgres_version" \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/* "$1"/var/cache/ldconfig/aux-cache "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old; : > "$1/etc/machine-id"' \
    "$suite" "$work/rootfs" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main"
  nonroot "$work/rootfs"
  install -d -o 65532 -g 65532 -m 0775 "$work/rootfs/var/lib/postgresql/data"
  local bin=/usr/lib/postgresql/$postgres_version/bin
  config postgres "$postgres_version" "65532:65532" '["/usr/local/bin/faultline-postgres"]' \
    "[\"PATH=$bin:/usr/local/bin:/usr/bin:/bin\", \"LANG=C.UTF-8\", \"PGDATA=/var/lib/postgresql/data/pgdata\"]" \
    "$epoch" "$(revision_of image/store.sh image/postgres-entrypoint.sh)" > "$work/config.json"
  write postgres "$work/rootfs" "$epoch" "$work/config.json" "postgres="
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
