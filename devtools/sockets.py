"""TCP connections as Linux lists them (`/proc/net/tcp`, `/proc/<pid>/fd`): how many connections a process
holds to a port, or a server's port has open, counted by the kernel rather than by the client that made
them. Used by the store's connection-budget test and the fleet benchmark."""

from __future__ import annotations

import os
from pathlib import Path

ESTABLISHED = "01"


def _entries() -> list[tuple[int, int, str, int]]:
    """(local port, remote port, state, socket inode) of every IPv4 and IPv6 TCP socket."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
            out.append((int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16), state, inode))
    return out


def _inodes(pid: int) -> set[int]:
    """The socket inodes among `pid`'s open files (those it may read: its own, or any as root)."""
    found: set[int] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(fd_dir)
    except (FileNotFoundError, PermissionError):
        return found
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def connections_to(pid: int, port: int) -> int:
    """Established TCP connections that process `pid` holds to `port` (on any address)."""
    mine = _inodes(pid)
    return sum(1 for _, remote, state, inode in _entries() if remote == port and state == ESTABLISHED and
               inode in mine)  # fmt: skip


def accepted_on(port: int) -> int:
    """Established TCP connections whose local end is `port`: those a server listening there holds."""
    return sum(1 for local, _, state, _ in _entries() if local == port and state == ESTABLISHED)
