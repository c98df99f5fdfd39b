"""When a failed work item may be claimed again: capped exponential back-off (pure, no I/O)."""

from __future__ import annotations

BASE_S = 0.5  # the wait after a first failure
CAP_S = 300.0  # the longest back-off


def retry_delay(attempt: int, delay: float = 0.0, *, base: float = BASE_S, cap: float = CAP_S) -> float:
    """Seconds before an item that failed on its `attempt`-th claim (1, 2, ...) is due again: `base`
    doubled with every attempt, at most `cap`; never less than `delay`, the error's own (a server's
    Retry-After is honoured even past the cap)."""
    backoff = min(cap, base * 2.0 ** min(max(attempt, 1) - 1, 62))
    return max(backoff, delay, 0.0)
