"""The quarantine circuit breaker (pure): it trips on the rate or on the cap of nodes held at once, stays
tripped whatever time passes, and only a person's reset closes it."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers import breaker

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
RATE = breaker.BreakerConfig(window=dt.timedelta(minutes=10), max_share=0.1, max_count=5)


def test_the_rate_trips_it_and_it_stays_tripped() -> None:
    assert RATE.limit(30) == 3 and RATE.limit(1000) == 5 and RATE.limit(3) == 1
    ok, state = breaker.admit(breaker.BreakerState(), RATE, T0, recent=2, gpu_nodes=30)
    assert ok and state.state == breaker.CLOSED
    ok, state = breaker.admit(state, RATE, T0, recent=3, gpu_nodes=30)
    assert not ok and state.state == breaker.OPEN and "limit 3 of 30" in state.reason
    for later in (dt.timedelta(minutes=15), dt.timedelta(hours=2), dt.timedelta(days=30)):
        ok, still = breaker.admit(state, RATE, T0 + later, recent=0, gpu_nodes=30, held=0)
        assert not ok and still == state  # no half-open, no close: nothing new, whatever time passed
        assert breaker.current(state) == state


@given(minutes=st.integers(min_value=0, max_value=10**7), recent=st.integers(0, 10**4),
       held=st.integers(0, 10**4), gpu_nodes=st.integers(0, 10**5))  # fmt: skip
def test_no_self_reset_after_any_time(minutes: int, recent: int, held: int, gpu_nodes: int) -> None:
    tripped = breaker.BreakerState(breaker.OPEN, T0, "storm")
    for cfg in (RATE, breaker.DEFAULT, breaker.BreakerConfig(max_share=None, max_count=None)):
        now = T0 + dt.timedelta(minutes=minutes)
        assert breaker.admit(tripped, cfg, now, recent, gpu_nodes, held) == (False, tripped)


@pytest.mark.parametrize(
    ("share", "count", "gpu_nodes", "cap"),
    [
        (0.1, 50, 100, 10),  # the defaults on 100 GPU nodes: a tenth
        (0.1, 50, 2000, 50),  # on 2000: the number bounds it
        (0.1, 50, 5, 1),  # a small fleet: one node at least
        (None, 5, 40, 5),  # the number alone
        (0.25, None, 40, 10),  # the share alone
        (None, None, 40, 1 << 30),  # no cap
    ],
)
def test_the_cap_by_share_and_number(
    share: float | None, count: int | None, gpu_nodes: int, cap: int
) -> None:
    cfg = breaker.BreakerConfig(max_share=None, max_count=None, max_held_share=share, max_held=count)
    assert cfg.cap(gpu_nodes) == cap
    assert cfg.capped == (share is not None or count is not None)
    if cap == 1 << 30:
        return
    ok, state = breaker.admit(breaker.BreakerState(), cfg, T0, recent=0, gpu_nodes=gpu_nodes, held=cap - 1)
    assert ok and state.state == breaker.CLOSED  # the cap's last node goes ahead
    ok, state = breaker.admit(state, cfg, T0, recent=0, gpu_nodes=gpu_nodes, held=cap)
    assert not ok and state.state == breaker.OPEN and f"cap {cap} of {gpu_nodes}" in state.reason
    # latched: nodes released since (held back under the cap) do not close it
    assert breaker.admit(state, cfg, T0 + dt.timedelta(days=1), 0, gpu_nodes, held=0)[0] is False


def test_the_default_caps_a_slow_storm() -> None:
    """100 GPU nodes faulting one every 2 minutes never pass the rate limit (one per window of 10 m is
    under a tenth of 100), and the old breaker held all 100 in time; the cap stops at 10."""
    state, held = breaker.BreakerState(), 0
    for i in range(100):
        ok, state = breaker.admit(state, breaker.DEFAULT, T0 + dt.timedelta(minutes=2 * i), recent=min(i, 4),
                                  gpu_nodes=100, held=held)  # fmt: skip
        held += ok
    assert held == 10 and state.state == breaker.OPEN and "cap 10 of 100" in state.reason


def test_reset_closes_it_and_counts_from_the_reset() -> None:
    tripped = breaker.BreakerState(breaker.OPEN, T0, "storm")
    at = T0 + dt.timedelta(hours=3)
    state = breaker.reset(at, "alice", "bad pack rolled back")
    assert state == breaker.BreakerState(breaker.CLOSED, at, "reset by alice: bad pack rolled back")
    assert tripped.state == breaker.OPEN
    # the window counts from the reset, not the storm before it
    assert breaker.counting_from(state, RATE, at + dt.timedelta(minutes=1)) == at
    assert breaker.counting_from(state, RATE, at + dt.timedelta(minutes=30)) == at + dt.timedelta(minutes=20)
    ok, state = breaker.admit(state, RATE, at + dt.timedelta(minutes=1), recent=0, gpu_nodes=30)
    assert ok and state.state == breaker.CLOSED
    ok, state = breaker.admit(state, RATE, at + dt.timedelta(minutes=2), recent=3, gpu_nodes=30)
    assert not ok and state.state == breaker.OPEN  # and it trips again at its limits


def test_a_legacy_half_open_record_reads_as_closed() -> None:
    legacy = breaker.BreakerState(breaker.LEGACY_HALF_OPEN, T0, "cool-down over")
    assert breaker.current(legacy).state == breaker.CLOSED
    assert breaker.admit(legacy, RATE, T0 + dt.timedelta(minutes=1), recent=0, gpu_nodes=30)[0]


def test_without_limits_it_never_trips_by_itself() -> None:
    wide = breaker.BreakerConfig(max_share=None, max_count=None)
    assert not wide.limited and breaker.BreakerConfig(max_share=None, max_count=3).limited
    assert breaker.DEFAULT.limited and breaker.DEFAULT.capped  # the defaults limit a share of the GPU nodes
    ok, state = breaker.admit(breaker.BreakerState(), wide, T0, recent=100_000, gpu_nodes=10, held=100_000)
    assert ok and state.state == breaker.CLOSED
    # a tripped state stored before the limits were lifted still waits for a person
    opened = breaker.BreakerState(breaker.OPEN, T0, "storm")
    assert not breaker.admit(opened, wide, T0 + dt.timedelta(days=1), recent=0, gpu_nodes=10)[0]
