"""The quarantine circuit breaker (pure): a fault storm must not cordon the whole fleet.

Two limits trip it. The *rate*: new quarantines inside a sliding `window`; when one more would exceed
`max_share` of the GPU nodes or `max_count` nodes. The *cap*: nodes held at once; when one more would exceed
`max_held_share` of the GPU nodes or `max_held` nodes. Tripped (`OPEN`), it refuses every new quarantine
and stays so, whatever time passes, until a person resets it (`reset`: who, why and when are recorded);
after a reset the window counts only from the reset. Releases are never blocked, and a tripped breaker
does not release anything either. The state is a plain record (stored in MongoDB by the worker).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

CLOSED, OPEN = "closed", "open"
LEGACY_HALF_OPEN = "half-open"  # stored by versions whose breaker half-opened by itself: read as closed


@dataclass(frozen=True)
class BreakerConfig:
    window: dt.timedelta = dt.timedelta(minutes=10)
    max_share: float | None = 0.1  # of the GPU nodes; None: no share limit
    max_count: int | None = None  # nodes; None: no count limit
    max_held_share: float | None = None  # of the GPU nodes held at once; None: no share cap
    max_held: int | None = None  # nodes held at once; None: no count cap

    @property
    def limited(self) -> bool:
        """Whether any limit is set (without one the breaker never opens by itself)."""
        return self.rate_limited or self.capped

    @property
    def rate_limited(self) -> bool:
        return self.max_share is not None or self.max_count is not None

    @property
    def capped(self) -> bool:
        return self.max_held_share is not None or self.max_held is not None

    def limit(self, gpu_nodes: int) -> int:
        """How many quarantines a window may hold."""
        return _least(self.max_share, self.max_count, gpu_nodes)

    def cap(self, gpu_nodes: int) -> int:
        """How many nodes may be held at once."""
        return _least(self.max_held_share, self.max_held, gpu_nodes)


def _least(share: float | None, count: int | None, gpu_nodes: int) -> int:
    limits = []
    if share is not None:
        limits.append(max(1, int(share * gpu_nodes)))
    if count is not None:
        limits.append(count)
    return min(limits) if limits else 1 << 30


# the worker's defaults (`QuarantineConfig`): at most 10 % of the GPU nodes quarantined in 10 minutes, and
# at most 10 % of them, or 50 nodes, held at once; the dataclass's own defaults set no cap (tests' fleets)
DEFAULT = BreakerConfig(max_held_share=0.1, max_held=50)


@dataclass(frozen=True)
class BreakerState:
    state: str = CLOSED
    since: dt.datetime | None = None  # when it entered that state
    reason: str = ""


def current(state: BreakerState) -> BreakerState:
    """The state as stored, whatever time has passed: only a person's `reset` closes an open breaker. A
    legacy half-open record counts as closed since it half-opened."""
    if state.state == LEGACY_HALF_OPEN:
        return BreakerState(CLOSED, state.since, state.reason)
    return state


def counting_from(state: BreakerState, cfg: BreakerConfig, now: dt.datetime) -> dt.datetime:
    """Quarantines made since this time count against the rate limit: the window, and not before the
    breaker was last reset (the storm that tripped it must not trip it again at once)."""
    start = now - cfg.window
    if state.state == CLOSED and state.since is not None:
        start = max(start, state.since)
    return start


def reset(now: dt.datetime, by: str, why: str) -> BreakerState:
    """A person closes the breaker; the window counts from now."""
    return BreakerState(CLOSED, now, f"reset by {by}: {why}")


def admit(
    state: BreakerState, cfg: BreakerConfig, now: dt.datetime, recent: int, gpu_nodes: int, held: int = 0
) -> tuple[bool, BreakerState]:
    """May one more node be quarantined, given `recent` quarantines since `counting_from` and `held` nodes
    held now (both without this one)? And the new state (tripped when this one would pass a limit)."""
    state = current(state)
    if state.state == OPEN:
        return False, state
    limit, cap = cfg.limit(gpu_nodes), cfg.cap(gpu_nodes)
    if recent + 1 > limit:
        since = counting_from(state, cfg, now)
        reason = f"{recent} GPU nodes quarantined since {since:%H:%M:%S}Z; limit {limit} of {gpu_nodes}"
        return False, BreakerState(OPEN, now, reason)
    if held + 1 > cap:
        return False, BreakerState(
            OPEN, now, f"{held} nodes held at once; cap {cap} of {gpu_nodes} GPU nodes"
        )
    return True, state
