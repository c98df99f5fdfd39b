"""Liveness: the loops a component runs, each with the last time it made progress. `/healthz` fails when
one of them has been silent longer than its limit, so the kubelet restarts a wedged process.

A loop beats on every turn, including a turn that found nothing to do or waited out an outage (an idle
claimer, a standby replica, an unreachable store): a restart cures none of those. What fails the probe is
a turn that never ends: a handler hung in a call, a watch that stopped reading, a dataflow whose epochs
stopped, a server that stopped accepting. A loop that ends in order is forgotten, so a stopping process
is not reported as wedged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_LIMIT_S = 120.0  # a turn longer than this is wedged: well past every call's own timeout


@dataclass(frozen=True)
class Stall:
    """A loop silent past its limit."""

    name: str
    silent_s: float
    limit_s: float

    def __str__(self) -> str:
        return f"{self.name}: no progress for {self.silent_s:.0f} s (limit {self.limit_s:.0f} s)"


class Liveness:
    """Named loops and when each last beat. Thread-safe; `clock`: seconds, monotonic (injected in tests)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._loops: dict[str, tuple[float, float]] = {}  # name -> (last beat, limit)
        self._lock = threading.Lock()

    def loop(self, name: str, limit_s: float = DEFAULT_LIMIT_S) -> Callable[[], None]:
        """Register `name` (counted from now) and return its beat."""
        with self._lock:
            self._loops[name] = (self.clock(), limit_s)
        return lambda: self.beat(name)

    def beat(self, name: str) -> None:
        """`name` made progress now (a loop not registered, or forgotten, is ignored)."""
        now = self.clock()
        with self._lock:
            entry = self._loops.get(name)
            if entry is not None:
                self._loops[name] = (now, entry[1])

    def forget(self, name: str) -> None:
        """`name` ended in order: no longer watched."""
        with self._lock:
            self._loops.pop(name, None)

    def stalls(self) -> list[Stall]:
        """The loops silent past their limit, by name."""
        now = self.clock()
        with self._lock:
            loops = sorted(self._loops.items())
        return [Stall(name, now - at, limit) for name, (at, limit) in loops if now - at > limit]

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._loops)

    def __call__(self) -> bool:
        """Healthy: no loop is wedged."""
        return not self.stalls()
