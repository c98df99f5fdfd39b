"""Run a command where another architecture's binaries run, without changing the machine.

`make image` builds the arm64 images on an amd64 machine (and the tests run them there) with QEMU's user-mode
emulator, Debian's qemu-user-static. The kernel runs a foreign binary through the emulator only when the
emulator is registered with binfmt_misc; registering it in the machine's own binfmt_misc would change the
machine for every process on it. Since Linux 6.7 each user namespace can mount a binfmt_misc of its own, so
the command runs in new user, mount and PID namespaces instead, with a binfmt_misc mounted there and the
emulator registered in it as Debian's package describes it (/usr/lib/binfmt.d/qemu-<arch>.conf, with the F
flag: the kernel opens the emulator at registration, so it also works inside a chroot). The user namespace
maps every uid and gid below 65536 to itself, so root stays root and files keep their owners. When the
command ends, the namespaces and the registration go with it; nothing else sees either.

    python -m devtools.foreign arm64 -- CMD ARGS...
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from devtools.oci import native

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
BINFMT = "/proc/sys/fs/binfmt_misc"
QEMU = {"arm64": "aarch64", "amd64": "x86_64"}  # Debian's architecture -> QEMU's
IDS = 65536


def registration(arch: str) -> str:
    """Debian's binfmt_misc line for QEMU's emulator of `arch`; an error that says what to install."""
    conf = Path(f"/usr/lib/binfmt.d/qemu-{QEMU[arch]}.conf")
    try:
        line = conf.read_text().strip()
    except FileNotFoundError:
        raise SystemExit(f"error: {conf} is missing: install qemu-user-static (make system-deps)") from None
    if "F" not in line.rsplit(":", 1)[1]:  # the emulator must be opened now: a chroot would not find it later
        line += "F"
    return line


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def run(arch: str, argv: list[str]) -> int:
    """Run `argv` with `arch` binaries runnable; its exit status (a native `arch` runs it as it is)."""
    if arch == native():
        return os.spawnvp(os.P_WAIT, argv[0], argv)  # noqa: S606 - the caller's command
    if arch not in QEMU:
        raise SystemExit(f"error: no emulator known for architecture {arch!r} (known: {', '.join(QEMU)})")
    line = registration(arch)
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    child = os.fork()
    if child == 0:  # the namespaces' owner: unshare, wait for the id maps, then run the command as PID 1
        os.close(ready_r)
        os.close(mapped_w)
        try:
            _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID), "unshare")
        except OSError as exc:
            sys.stderr.write(f"error: cannot make a user namespace ({exc}); Linux 6.7 or later is needed\n")
            os._exit(125)
        os.write(ready_w, b"1")
        os.read(mapped_r, 1)
        inner = os.fork()  # the first child in the new PID namespace
        if inner == 0:
            try:
                _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
                _check(libc.mount(b"binfmt_misc", BINFMT.encode(), b"binfmt_misc", 0, None), "binfmt_misc")
                Path(BINFMT, "register").write_text(line)
                os.execvp(argv[0], argv)  # noqa: S606 - the caller's command
            except OSError as exc:
                sys.stderr.write(f"error: {exc}\n")
                os._exit(125)
        _, status = os.waitpid(inner, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    os.close(ready_w)
    os.close(mapped_r)
    if os.read(ready_r, 1) != b"1":
        _, status = os.waitpid(child, 0)
        return os.waitstatus_to_exitcode(status)
    for kind in ("uid_map", "gid_map"):
        Path(f"/proc/{child}/{kind}").write_text(f"0 0 {IDS}\n")
    os.write(mapped_w, b"1")
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


def main(args: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if args is None else args)
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: python -m devtools.foreign ARCH -- CMD ARGS...\n")
        return 2
    return run(args[0], args[2:])


if __name__ == "__main__":
    sys.exit(main())
