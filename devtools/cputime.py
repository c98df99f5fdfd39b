"""CPU time of processes and their descendants, from /proc (user + system), for the benchmarks: what each
component of a run spent, measured from outside it."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def seconds(pid: int) -> float:
    """CPU seconds (user + system) process `pid` spent so far; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def tree(pid: int) -> list[int]:
    """`pid` and every process below it."""
    below: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        below.setdefault(parent, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(below.get(p, ()))
    return out


def of_trees(pids: list[int]) -> float:
    """CPU seconds of `pids` and all their descendants (PostgreSQL's backends, for one)."""
    return sum(seconds(p) for root in pids for p in tree(root))


class Meter:
    """CPU seconds of named components between `start` and `stop`: each its processes and their
    descendants, except those named in `alone` (a process that started the others: itself only)."""

    def __init__(self, components: dict[str, list[int]], alone: frozenset[str] = frozenset()) -> None:
        self.components = components
        self.alone = alone
        self.began: dict[str, float] = {}
        self.spent: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        return {k: sum(seconds(p) for p in v) if k in self.alone else of_trees(v)
                for k, v in self.components.items()}  # fmt: skip

    def start(self) -> None:
        self.began = self._read()

    def stop(self) -> dict[str, float]:
        now = self._read()
        self.spent = {k: now[k] - self.began[k] for k in self.components}
        return self.spent
