"""The agent's spool drained after an outage: consecutive writes of one fault in one state are one write
(the newest revision), a change of state is kept (it makes or removes the fault's work items)."""

from __future__ import annotations

import datetime as dt

import pytest

from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from sinks.mongo import coalesced

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def _f(code: str, count: int, state: FaultState = FaultState.OPEN) -> Fault:
    return Fault(
        id=fault_id("n1", "GPU", "0000:3b:00", code), node="n1", entity=Entity(type="GPU", id="0000:3b:00"),
        code=code, component=Component.GPU, count=count, first_seen=T0, last_seen=T0, fatal=False,
        action=Action.NONE, state=state, resolved_at=T0 if state == FaultState.RESOLVED else None,
    )  # fmt: skip


OP, RS = FaultState.OPEN, FaultState.RESOLVED


@pytest.mark.parametrize(
    ("writes", "kept"),
    [
        ([("A", 1, OP, 1), ("A", 2, OP, 2), ("A", 3, OP, 3)], [("A", 3)]),  # a count that rose: one write
        ([("A", 1, OP, 1), ("B", 1, OP, 2), ("A", 2, OP, 3)], [("A", 3), ("B", 2)]),  # per fault
        (
            [("A", 1, OP, 1), ("A", 1, RS, 2), ("A", 2, OP, 3), ("A", 3, OP, 4)],
            [("A", 1), ("A", 2), ("A", 4)],
        ),
        ([("A", 2, OP, 5), ("A", 1, OP, 4)], [("A", 5), ("A", 4)]),  # an older revision is not folded in
        ([], []),
    ],
)
def test_coalesced(writes: list[tuple[str, int, FaultState, int]], kept: list[tuple[str, int]]) -> None:
    got = coalesced([(_f(f"XID-{c}", n, s), rev) for c, n, s, rev in writes])
    assert [(f.code.removeprefix("XID-"), rev) for f, rev in got] == kept
