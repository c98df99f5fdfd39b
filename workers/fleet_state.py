"""State metrics: what the store says about the fleet, read by a worker's maintenance pass and exported on its
`/metrics`, so alerts and the dashboard see what `faultline status` shows.

Each worker exports the part it owns: the quarantine worker the breaker, the nodes held and the oldest open
fault; the janitor the repairs in flight and how rounds ended. Labels stay bounded: fault codes (the packs'),
repair steps and outcomes, never node names (a node's story is `faultline explain NODE`).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from faultline import store
from faultline.models import RepairOutcome, RepairStep

# a hold lasts from minutes (a reset) to days (a replacement)
HOLD_BUCKETS = (60, 300, 900, 1800, 3600, 2 * 3600, 6 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400)


class QuarantineState:
    """The breaker, the nodes held (by the codes of their faults) and how long the oldest hold and the oldest
    open fault have lasted."""

    def __init__(self, st: store.Store, registry: CollectorRegistry) -> None:
        self.store = st
        r = registry
        tripped = "1 while the quarantine circuit breaker is tripped (until a person resets it)"
        self.breaker_open = Gauge("faultline_breaker_open", tripped, registry=r)
        self.trips = Counter("faultline_breaker_trips", "Times this replica tripped the quarantine breaker",
                             registry=r)  # fmt: skip
        self.held = Gauge("faultline_nodes_held", "Nodes faultline holds (quarantined) now", registry=r)
        gpu_nodes = "Nodes with GPUs (nvidia.com/gpu capacity), as the breaker counts them"
        self.gpu_nodes = Gauge("faultline_gpu_nodes", gpu_nodes, registry=r)
        self.held_by_code = Gauge("faultline_nodes_held_by_code",
                                  "Nodes held now with an open fault of this code behind the hold", ["code"],
                                  registry=r)  # fmt: skip
        longest = "How long the longest-held node has been held (0: none held)"
        self.oldest_hold = Gauge("faultline_node_hold_oldest_age_seconds", longest, registry=r)
        self.oldest_fault = Gauge("faultline_fault_oldest_open_age_seconds",
                                  "How long ago the longest-open fault was first seen (0: none open)",
                                  registry=r)  # fmt: skip
        held_for = "How long each node was held, quarantine to release (this replica's releases)"
        self.held_for = Histogram("faultline_node_hold_seconds", held_for, registry=r, buckets=HOLD_BUCKETS)
        self._codes: set[str] = set()

    def released(self, hold: store.NodeHold | None, now: dt.datetime) -> None:
        """A node was let go: its hold's length counts (None, or no start recorded: nothing to count)."""
        if hold is not None and hold.quarantined_at is not None:
            self.held_for.observe(_age(now, hold.quarantined_at))

    def refresh(self) -> None:
        """Read the state from the store (a few queries; raises when the store is away)."""
        now = self.store.now()
        brk = self.store.breaker()
        holds = self.store.held_nodes()
        codes = self.store.codes_of(k for h in holds for k in h.faults)
        oldest = self.store.oldest_open_first_seen()
        self.breaker_open.set(1 if brk.state == "open" else 0)
        self.held.set(len(holds))
        by_code = Tally(c for h in holds for c in {codes[k] for k in h.faults if codes.get(k)})
        for code in self._codes - set(by_code):  # a code no node is held for any more reads 0, then goes
            self.held_by_code.remove(code)
        for code, n in by_code.items():
            self.held_by_code.labels(code=code).set(n)
        self._codes = set(by_code)
        since = [h.quarantined_at for h in holds if h.quarantined_at is not None]
        self.oldest_hold.set(_age(now, min(since)) if since else 0)
        self.oldest_fault.set(_age(now, oldest) if oldest is not None else 0)


class JanitorState:
    """The repairs in flight by step, and the rounds that ended by step and outcome (counted where the janitor
    recorded them)."""

    def __init__(self, st: store.Store, registry: CollectorRegistry) -> None:
        self.store = st
        r = registry
        now = "Repairs the janitor is carrying out now, by step"
        self.in_flight = Gauge("faultline_repairs_in_flight", now, ["step"], registry=r)
        self.rounds = Counter("faultline_repair_rounds",
                              "Rounds of repair that ended, by step and outcome (this replica's)",
                              ["step", "outcome"], registry=r)  # fmt: skip
        for step in RepairStep:
            self.in_flight.labels(step=step.value)  # 0 before the first
            for outcome in RepairOutcome:
                self.rounds.labels(step=step.value, outcome=outcome.value)

    def refresh(self) -> None:
        steps = Tally(r.step for r in self.store.repairs_in_flight())
        for step in RepairStep:
            self.in_flight.labels(step=step.value).set(steps.get(step.value, 0))

    def ended(self, step: str, outcome: str) -> None:
        self.rounds.labels(step=step, outcome=outcome).inc()


def _age(now: dt.datetime, then: dt.datetime) -> float:
    return max(0.0, (now - then).total_seconds())
