"""What the analyzer's tests share: finding a replica's other processes (`faultline analyzer process`)."""

from __future__ import annotations

from pathlib import Path


def second_processes(parent: int | None = None) -> list[int]:
    """The pids of analyzer processes still alive that are a replica's second ones (of `parent`, or of
    any replica)."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
            ppid = int((cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if argv[-3:-1] == [b"analyzer", b"process"] and parent in (None, ppid):
            out.append(int(cmdline.parent.name))
    return out
