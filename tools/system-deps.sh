#!/usr/bin/env bash
# Installs the Debian packages the test suite needs when they are missing (the README's `make test` and
# CI run this first, so both need the same machine): systemd-journal-remote writes the real journal files
# the journal tests follow; PostgreSQL is the second storage backend FerretDB is tested on (and the
# benchmarks' store); the real-node packages below run real pods in the local cluster. Needs root (or passwordless sudo) only when something is missing.
set -euo pipefail
need=()
[ -x /lib/systemd/systemd-journal-remote ] || need+=(systemd-journal-remote)
command -v initdb >/dev/null || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)  # the image's Debian root filesystem (make image)
command -v strip >/dev/null || need+=(binutils)  # make image strips the wheels' native extensions
# make image's arm64 image on an amd64 machine (or the reverse): QEMU's user-mode emulator (registered only
# in the build's own user namespace: devtools/foreign.py) and the other architecture's strip
case $(uname -m) in
  x86_64) other=aarch64 ;;
  aarch64) other=x86_64 ;;
  *) other= ;;
esac
if [ -n "$other" ]; then
  [ -e "/usr/lib/binfmt.d/qemu-$other.conf" ] || need+=(qemu-user-static)
  command -v "$other-linux-gnu-strip" >/dev/null || need+=("binutils-${other//_/-}-linux-gnu")
fi
# The local cluster's real nodes: runc is built with cgo against libseccomp; bridge CNI plugins from Debian;
# iptables for the pods' DNAT to the API server and the store on loopback.
command -v gcc >/dev/null || need+=(gcc libc6-dev)
[ -e /usr/include/seccomp.h ] || need+=(libseccomp-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || need+=(iptables)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
  else
    echo "error: the tests need the Debian packages: ${need[*]}; install them as root:" >&2
    echo "  apt-get install -y ${need[*]}" >&2
    exit 1
  fi
fi
echo "system-deps: installing ${need[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}"
