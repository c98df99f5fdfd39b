"""Keeping leases: one thread renews every lease a component holds (claims in hand, claims waiting for
their next look, the analyzer's lease), each every `period` seconds (a third of the lease).

An entry's `renew` raises `LeaseLostError` when someone else took the lease over: the entry is dropped and
its `on_lost` called (on the renewing thread: it must only set flags or take a short lock). Any other error
is logged and the entry renewed again at the next period, while the lease has time left. `drop` waits for
a renewal of that entry in progress, so the caller may then write under the lease's last number.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from faultline.errors import LeaseLostError

log = logging.getLogger(__name__)


def _nothing() -> None:
    return None


@dataclass
class _Entry:
    renew: Callable[[], None]
    on_lost: Callable[[], None]
    lock: threading.Lock = field(default_factory=threading.Lock)
    dropped: bool = False


class Renewer:
    """The leases one component holds, renewed by one thread named `name` (`start`, then `stop`, which
    joins it). `beat`: called on every pass (its liveness)."""

    def __init__(self, name: str, period: float, *, beat: Callable[[], None] = _nothing) -> None:
        self.name = name
        self.period = period
        self.beat = beat
        self._entries: dict[Hashable, _Entry] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """End the thread (a renewal in progress finishes first); True when it ended within `timeout`."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def hold(self, key: Hashable, renew: Callable[[], None], on_lost: Callable[[], None] = _nothing) -> None:
        """Renew `key` from now on (replacing an entry of the same key)."""
        with self._lock:
            self._entries[key] = _Entry(renew, on_lost)

    def drop(self, key: Hashable) -> None:
        """Stop renewing `key`; returns once no renewal of it is in progress."""
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is not None:
            with entry.lock:
                entry.dropped = True

    def held(self) -> int:
        with self._lock:
            return len(self._entries)

    def renew_all(self) -> None:
        """One pass over every entry (the thread's turn; tests call it directly)."""
        with self._lock:
            entries = list(self._entries.items())
        for key, entry in entries:
            with entry.lock:
                if entry.dropped:
                    continue
                try:
                    entry.renew()
                except LeaseLostError:
                    entry.dropped = True
                    lost = True
                except Exception as exc:  # noqa: BLE001 - renewed again at the next period
                    log.warning("%s: renewing %s failed: %s", self.name, key, exc)
                    continue
                else:
                    lost = False
            if lost:
                with self._lock:
                    if self._entries.get(key) is entry:
                        del self._entries[key]
                entry.on_lost()

    def _run(self) -> None:
        self.beat()
        while not self._stop.wait(self.period):
            self.renew_all()
            self.beat()
