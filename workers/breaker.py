"""The quarantine circuit breaker (pure): a fault storm must not cordon the whole fleet.

New quarantines inside a sliding `window` are counted; when one more would exceed `max_share` of the GPU
nodes or `max_count` nodes, the breaker opens and refuses new quarantines. After `cooldown` it half-opens
by itself: quarantines are allowed again, counted only from the moment it half-opened, and it opens again
if that count crosses the threshold; a half-open breaker that stays under it for a whole window closes.
Uncordon and recovery are never blocked. The state is a plain dict (stored in MongoDB by the worker).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


@dataclass(frozen=True)
class BreakerConfig:
    window: dt.timedelta = dt.timedelta(minutes=10)
    max_share: float | None = 0.1  # of the GPU nodes; None: no share limit
    max_count: int | None = None  # nodes; None: no count limit
    cooldown: dt.timedelta = dt.timedelta(minutes=15)

    @property
    def limited(self) -> bool:
        """Whether any limit is set (without one the breaker never opens by itself)."""
        return self.max_share is not None or self.max_count is not None

    def limit(self, gpu_nodes: int) -> int:
        """How many quarantines a window may hold."""
        limits = []
        if self.max_share is not None:
            limits.append(max(1, int(self.max_share * gpu_nodes)))
        if self.max_count is not None:
            limits.append(self.max_count)
        return min(limits) if limits else 1 << 30


DEFAULT = BreakerConfig()


@dataclass(frozen=True)
class BreakerState:
    state: str = CLOSED
    since: dt.datetime | None = None  # when it entered that state
    reason: str = ""


def current(state: BreakerState, cfg: BreakerConfig, now: dt.datetime) -> BreakerState:
    """The state as of `now`: open turns half-open after the cool-down; half-open closes after a window."""
    if state.state == OPEN and state.since is not None and now - state.since >= cfg.cooldown:
        return BreakerState(HALF_OPEN, now, "cool-down over")
    if state.state == HALF_OPEN and state.since is not None and now - state.since >= cfg.window:
        return BreakerState(CLOSED, now, "a window without a storm")
    return state


def counting_from(state: BreakerState, cfg: BreakerConfig, now: dt.datetime) -> dt.datetime:
    """Quarantines made since this time count against the limit."""
    start = now - cfg.window
    if state.state == HALF_OPEN and state.since is not None:
        start = max(start, state.since)
    return start


def admit(
    state: BreakerState, cfg: BreakerConfig, now: dt.datetime, recent: int, gpu_nodes: int
) -> tuple[bool, BreakerState]:
    """May one more node be quarantined, given `recent` quarantines since `counting_from`? And the new
    state (opened when this one would cross the limit)."""
    state = current(state, cfg, now)
    if state.state == OPEN:
        return False, state
    limit = cfg.limit(gpu_nodes)
    if recent + 1 > limit:
        since = counting_from(state, cfg, now)
        reason = f"{recent} GPU nodes quarantined since {since:%H:%M:%S}Z; limit {limit} of {gpu_nodes}"
        return False, BreakerState(OPEN, now, reason)
    return True, state
