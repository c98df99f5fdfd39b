"""The agent's spool drained after an outage: consecutive writes of one fault in one state are one write
(the newest revision), a change of state is kept (it makes or removes the fault's work items); a drain
cut short keeps its progress, and fatal faults go first."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from faultline.errors import TransientError
from faultline.models import Action, Component, Entity, Fault, FaultState, HealthEvent, fault_id
from sinks.mongo import drain
from sinks.spool import Spool, coalesced

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


class _FlakyStore:
    """The store's writes as the drain makes them; the `fail_at`-th fault write times out."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.events: list[str] = []
        self.faults: list[tuple[str, int]] = []

    def record_events(self, events: list[Any]) -> int:
        self.events += [e.id for e in events]
        return len(events)

    def record_batch(self, events: list[Any], writes: list[tuple[Fault, int]]) -> int:
        """As the store's: the events, then each fault write (a failure leaves the rest unwritten)."""
        self.record_events(events)
        for fault, revision in writes:
            self.write_fault(fault, revision)
        return len(events)

    def write_fault(self, fault: Fault, revision: int) -> bool:
        if self.fail_at is not None and len(self.faults) + 1 == self.fail_at:
            self.fail_at = None
            raise TransientError("timed out")
        self.faults.append((fault.code, revision))
        return True


def _event(i: int) -> HealthEvent:
    return HealthEvent(
        id=f"e{i}", node="n1", component=Component.GPU, check="xid", code="XID-31",
        entities=(Entity(type="GPU", id="0000:3b:00"),), healthy=False, fatal=False, action=Action.NONE,
        generated_at=T0, observed_at=T0,
    )  # fmt: skip


def test_a_drain_cut_by_a_timeout_resumes_where_it_stopped(tmp_path: Path) -> None:
    """25 faults and 3 events spooled; the 14th fault write times out: the events are not sent again, the
    13 faults written are not written again (only the chunk under way, 11 to 13, is), nothing is lost."""
    spool = Spool(tmp_path / "spool")
    spool.append([(_f(f"XID-{i}", 1), 1) for i in range(25)], [_event(i) for i in range(3)])
    st = _FlakyStore(fail_at=14)
    with pytest.raises(TransientError):
        drain(spool, st)  # type: ignore[arg-type]
    assert st.events == ["e0", "e1", "e2"]
    assert [code for code, _ in st.faults] == [f"XID-{i}" for i in range(13)]
    assert not spool.events()
    assert [f.code for f, _ in spool.items()] == [f"XID-{i}" for i in range(10, 25)]
    drain(spool, st)  # type: ignore[arg-type]
    assert st.events == ["e0", "e1", "e2"]
    assert [code for code, _ in st.faults][13:] == [f"XID-{i}" for i in range(10, 25)]
    assert len(spool) == 0 and not list(spool.directory.glob("spool-*"))


def test_fatal_faults_are_drained_first_and_each_faults_writes_in_order(tmp_path: Path) -> None:
    fatal = _f("XID-79", 1).model_copy(update={"fatal": True, "action": Action.RESTART_BM})
    spool = Spool(tmp_path / "spool")
    spool.append([(_f("XID-31", 1), 1), (fatal, 2), (_f("XID-13", 1), 3),
                  (fatal.model_copy(update={"state": RS, "resolved_at": T0}), 4), (fatal, 5)])  # fmt: skip
    st = _FlakyStore()
    drain(spool, st)  # type: ignore[arg-type]
    assert st.faults == [("XID-79", 2), ("XID-79", 4), ("XID-79", 5), ("XID-31", 1), ("XID-13", 3)]
