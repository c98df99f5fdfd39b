#!/usr/bin/env bash
# mmdebstrap's customize hook for image/build.sh: installs faultline into the root filesystem ROOT from the
# hashed wheels in WHEELS, adds the non-root user, and prunes what the image never runs. STRIP: the host's
# binutils strip for the image's architecture (default strip: the host's own).
#
#   image/customize.sh ROOT WHEELS [STRIP]
set -euo pipefail
rootfs=$1 wheels=$2 strip=${3:-strip}
in_root() { chroot "$rootfs" "$@"; }

# The application: a virtual environment made by Debian's python3, everything installed with
# --require-hashes --no-deps from the lock (plus the project's wheel and its hash), then `pip check`
# proves the lock is complete. No .pyc files yet (see below).
mkdir -p "$rootfs/tmp/wheels"
cp "$wheels"/* "$rootfs/tmp/wheels/"
in_root python3 -m venv /opt/faultline
in_root /opt/faultline/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir \
  --no-index --find-links /tmp/wheels --require-hashes --no-deps --no-compile \
  -r /tmp/wheels/requirements.txt
in_root /opt/faultline/bin/python -m pip check --disable-pip-version-check
rm -rf "$rootfs/tmp/wheels"

# What only the install needed: pip and setuptools in the venv, and the Debian packages that brought
# them (python3-venv for ensurepip and its wheels).
in_root /opt/faultline/bin/python -m pip uninstall --quiet --yes --disable-pip-version-check pip setuptools
in_root dpkg --purge python3-venv python3.11-venv python3-pip-whl python3-setuptools-whl >/dev/null

# The user every component runs as unless its pod says otherwise (the agent reading host journals and the
# repair Jobs get root from their securityContext). Written directly: useradd stamps today's date.
echo 'nonroot:x:65532:65532:faultline:/home/nonroot:/usr/sbin/nologin' >> "$rootfs/etc/passwd"
echo 'nonroot:x:65532:' >> "$rootfs/etc/group"
echo 'nonroot:!*:0::::::' >> "$rootfs/etc/shadow"
install -d -o 65532 -g 65532 -m 0755 "$rootfs/home/nonroot"

# Pruning, each with its reason (docs/development/image.md has what each one saves).
site="$rootfs/opt/faultline/lib/python3.11/site-packages"
# - test suites that dependencies ship inside their packages: never imported at run time
find "$site" -depth -type d \( -name tests -o -name test \) -prune -exec rm -rf {} +
# - type stubs and C/C++ sources and headers shipped in wheels: for type checkers and compilers only
find "$site" \( -name '*.pyi' -o -name '*.pxd' -o -name '*.pyx' -o -name '*.c' -o -name '*.cpp' \
  -o -name '*.h' \) -type f -delete
# - symbols in the wheels' native extensions (not stripped upstream; bytewax's alone has 14 MB of them):
#   strip --strip-unneeded, what Debian does to its own shared libraries (the host's binutils)
find "$site" -name '*.so*' -type f -exec "$strip" --strip-unneeded {} +
# - Debian's run-time state of the build: apt's and dpkg's caches and logs, ldconfig's cache
rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* \
  "$rootfs"/var/cache/ldconfig/aux-cache "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old
# - the empty machine id systemd's postinst leaves (the runtime provides one)
: > "$rootfs/etc/machine-id"

# Byte code, compiled once at build time: a component then starts without compiling (as non-root it could
# not cache the result). Hash-based .pyc files hold no timestamps, so the layer stays reproducible.
# Except the Kubernetes client (75 MB of source, 52 MB more as .pyc): only the workers import it, and they
# compile it at start in about a second; the agent on every node never loads it (an import contract).
in_root /opt/faultline/bin/python -m compileall -q -j 1 --invalidation-mode unchecked-hash \
  -x '/site-packages/kubernetes/' /opt/faultline/lib/python3.11/site-packages >/dev/null
