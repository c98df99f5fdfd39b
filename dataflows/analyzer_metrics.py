"""The cluster analyzer's metrics: its lease, its writes, and how far it is behind the feed."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

if TYPE_CHECKING:
    from faultline.store import Store

log = logging.getLogger(__name__)
LAG_EVERY_S = 15.0  # between reads of how far the analyzer is behind the feed


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.active = Gauge("faultline_analyzer_active", "1 while this replica holds the analyzer's lease",
                            registry=self.registry)  # fmt: skip
        self.derived = Counter("faultline_analyzer_derived_faults", "Derived fault writes that applied",
                               ["pattern"], registry=self.registry)  # fmt: skip
        self.lost = Counter("faultline_analyzer_feed_lost", "Feed documents pruned before the analyzer read "
                            "them", registry=self.registry)  # fmt: skip
        self.behind = Gauge("faultline_analyzer_feed_behind", "Feed documents written but not yet read by "
                            "the analyzer (the active replica's view)", registry=self.registry)  # fmt: skip
        self.checkpoint_age = Gauge("faultline_analyzer_checkpoint_age_seconds", "Time since the analyzer's "
                                    "newest checkpoint", registry=self.registry)  # fmt: skip

    def watch_lag(self, st: Store, stop: threading.Event, every: float = LAG_EVERY_S) -> threading.Thread:
        """A thread that reads how far the analyzer is behind the feed every `every` seconds (the store
        away: the figures stay as they were) until `stop`."""

        def run() -> None:
            from patterns.cluster import PARTITIONS  # noqa: PLC0415

            while True:
                try:
                    status = st.analyzer_status(PARTITIONS)
                    if status is not None:
                        self.behind.set(max(0, status.head - status.position))
                        at = status.checkpointed_at
                        self.checkpoint_age.set(max(0.0, (st.now() - at).total_seconds()) if at else 0)
                except Exception as exc:  # noqa: BLE001 - the next look tries again
                    log.warning("analyzer: reading its lag failed: %s", exc)
                if stop.wait(every):
                    return

        thread = threading.Thread(target=run, name="analyzer-lag", daemon=True)
        thread.start()
        return thread
