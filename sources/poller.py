"""A node-side look taken every `interval` seconds on a thread of its own, for the agent's side sources
that read something local and record it in the store (`sources.pod_resources`, `sources.scheduled_events`).
A failing look (the local service or the store away) is logged once per distinct reason and tried again
at the next interval; `close` stops the thread, then closes the store link the looks used."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from faultline import bounds

log = logging.getLogger(__name__)


class Poller:
    def __init__(self, node: str, what: str, interval: float, close_link: Callable[[], None]) -> None:
        """`what`: the thread's name and the subject of the warning ("<what> not read")."""
        self.node = node
        self.what = what
        self.interval = interval
        self.close_link = close_link
        self.failing: str | None = None  # the last look's failure, None once one succeeds
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=what.replace(" ", "-"), daemon=True)

    def look(self) -> bool:
        """One look; whether the poller goes on (subclasses)."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                if not self.look():
                    return
            except Exception as exc:  # noqa: BLE001 - the local service or the store away: next time
                why = bounds.clip(f"{type(exc).__name__}: {exc}", bounds.ERROR_TEXT)
                if why != self.failing:
                    log.warning("%s not read: %s", self.what, why, extra={"node": self.node})
                self.failing = why
            else:
                self.failing = None
            self.stop.wait(self.interval)

    def start(self) -> None:
        self.thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (waiting up to `timeout` seconds for a look in progress), then the store link."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout)
        if not self.thread.is_alive():
            self.close_link()
