"""Caps on repairs in flight (pure): over a cap a round waits; replacements have their own, lower cap."""

from __future__ import annotations

import itertools

import pytest

from workers import inflight

CAPS = inflight.Caps(max_in_flight=3, max_replacements=1)


@pytest.mark.parametrize(
    ("step", "others", "waits"),
    [
        ("REBOOT", [], None),
        ("REBOOT", ["REBOOT", "GPU_RESET"], None),  # the cap's last one goes
        ("REBOOT", ["REBOOT", "GPU_RESET", "REPLACE"], "3 repairs in flight; cap 3"),
        ("REPLACE", ["REBOOT"], None),
        ("REPLACE", ["REPLACE"], "1 replacements in flight; cap 1"),
        ("REBOOT", ["REPLACE"], None),  # the replacements' cap holds back replacements only
        ("REPLACE", ["REPLACE", "REBOOT", "REBOOT"], "3 repairs in flight; cap 3"),
    ],
)
def test_over_the_cap_a_round_waits(step: str, others: list[str], waits: str | None) -> None:
    assert inflight.over(CAPS, step, others) == waits


def test_no_caps_and_the_defaults() -> None:
    assert inflight.over(inflight.NO_CAPS, "REPLACE", ["REPLACE"] * 1000) is None
    assert inflight.Caps() == inflight.Caps(max_in_flight=10, max_replacements=2)
    assert inflight.over(inflight.Caps(), "REBOOT", ["REBOOT"] * 9) is None
    assert inflight.over(inflight.Caps(), "REBOOT", ["REBOOT"] * 10) is not None


def test_concurrent_starts_never_pass_the_cap() -> None:
    """Each round is written first, then counts the others it sees (written, not yet taken back): in any
    interleaving of 4 janitors' writes and reads, the rounds that go ahead are never more than the cap."""
    cap = inflight.Caps(max_in_flight=2, max_replacements=None)
    events = [(kind, r) for r in range(4) for kind in ("write", "read")]
    for order in itertools.permutations(events):
        if any(order.index(("write", r)) > order.index(("read", r)) for r in range(4)):
            continue  # a round reads only after its own write
        written: set[int] = set()
        went = []
        for kind, r in order:
            if kind == "write":
                written.add(r)
            elif inflight.over(cap, "REBOOT", ["REBOOT"] * len(written - {r})) is None:
                went.append(r)
            else:
                written.discard(r)  # taken back (`Store.withdraw_start`)
        assert len(went) <= 2
