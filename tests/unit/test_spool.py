"""The agent's store spool on disk (`sinks.spool`): append-only segments rolled by size, the order of
writes kept across segments and restarts, a byte bound that refuses health events before fault writes
and counts what it refused, an older agent's single file taken in, and a drain that holds one segment at
a time and keeps what it did not write."""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from faultline import metrics
from faultline.errors import TransientError
from faultline.models import Action, Component, Entity, Fault, FaultState, HealthEvent, NodeUpdate, fault_id
from sinks import mongo
from sinks.spool import Spool

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def _f(i: int, *, fatal: bool = False) -> Fault:
    """A fault of its own (distinct codes: nothing coalesces)."""
    return Fault(
        id=fault_id("n1", "GPU", "0000:3b:00", f"XID-{i}"), node="n1", entity=Entity(type="GPU", id="0000:3b:00"),
        code=f"XID-{i}", component=Component.GPU, count=1, first_seen=T0, last_seen=T0, fatal=fatal,
        action=Action.RESTART_BM if fatal else Action.NONE, state=FaultState.OPEN,
    )  # fmt: skip


def _e(i: int) -> HealthEvent:
    return HealthEvent(
        id=f"e{i}", node="n1", component=Component.GPU, check="xid", code="XID-31",
        entities=(Entity(type="GPU", id="0000:3b:00"),), healthy=False, fatal=False, action=Action.NONE,
        generated_at=T0, observed_at=T0,
    )  # fmt: skip


def _codes(spool: Spool) -> list[str]:
    return [f.code for f, _ in spool.items()]


def test_appends_roll_segments_and_keep_their_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", segment_bytes=2000)
    first: bytes = b""
    for i in range(20):
        spool.append([(_f(i), i)], [_e(i)])
        if i == 0:
            first = spool.path(spool.current).read_bytes()
    segments = sorted(spool.sizes)
    assert len(segments) >= 3
    assert spool.path(segments[0]).read_bytes().startswith(first)  # appended to, never rewritten
    assert all(spool.sizes[n] < 2000 + 1000 for n in segments)  # rolled once past its size
    assert _codes(spool) == [f"XID-{i}" for i in range(20)]
    assert [e.id for e in spool.events()] == [f"e{i}" for i in range(20)]
    assert (len(spool), spool.size) == (40, sum(p.stat().st_size for p in spool.directory.glob("spool-*")))


def test_a_reopened_spool_appends_after_what_it_held(tmp_path: Path) -> None:
    Spool(tmp_path / "spool").append([(_f(0), 1), (_f(1), 2)])
    reopened = Spool(tmp_path / "spool")
    assert (len(reopened), reopened.size) == (2, reopened.path(1).stat().st_size)
    with reopened.path(1).open("ab") as fh:
        fh.write(b'{"revision": 3, "fau')  # a crash mid-append: a torn last line
    reopened = Spool(tmp_path / "spool")
    reopened.append([(_f(2), 4)])  # into a segment of its own, not after the torn line
    assert _codes(reopened) == ["XID-0", "XID-1", "XID-2"]


def test_the_bound_refuses_health_events_first_then_fault_writes_and_counts_them(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=20_000, segment_bytes=4000)
    accepted_events = accepted_faults = 0
    refused: dict[str, int] = {}
    for i in range(60):
        before = dict(spool.dropped)
        for kind, n in spool.append([(_f(i), i)], [_e(i)]).items():
            refused[kind] = refused.get(kind, 0) + n
        accepted_events += spool.dropped["event"] == before["event"]
        accepted_faults += spool.dropped["fault"] == before["fault"]
    assert refused == spool.dropped and refused["event"] > 0 and refused["fault"] > 0
    assert accepted_faults > accepted_events  # events stopped at 3/4 of the bound, faults went on
    assert spool.size <= 20_000
    # what was accepted stays, in order: the first events and the first fault writes
    assert [e.id for e in spool.events()] == [f"e{i}" for i in range(accepted_events)]
    assert _codes(spool) == [f"XID-{i}" for i in range(accepted_faults)]
    assert len(spool) == accepted_events + accepted_faults == 120 - sum(refused.values())


def test_an_older_agents_single_file_is_taken_in_once(tmp_path: Path) -> None:
    legacy = tmp_path / "mongo-spool.jsonl"  # as the agent wrote it before: json.dumps, one a line
    lines = [json.dumps({"event": _e(0).model_dump(mode="json")})]
    lines += [json.dumps({"revision": i, "fault": _f(i).model_dump(mode="json")}) for i in range(5)]
    legacy.write_text("".join(line + "\n" for line in lines))
    (tmp_path / "mongo-spool.tmp").write_text("half")  # its interrupted rewrite
    spool = Spool(tmp_path / "mongo-spool")
    assert (spool.migrated, len(spool)) == (6, 6)
    assert not legacy.exists() and not (tmp_path / "mongo-spool.tmp").exists()
    assert [e.id for e in spool.events()] == ["e0"] and _codes(spool) == [f"XID-{i}" for i in range(5)]
    spool.append([(_f(5), 5)])
    assert _codes(Spool(tmp_path / "mongo-spool")) == [f"XID-{i}" for i in range(6)]


def test_an_older_file_past_the_bound_is_taken_in_as_far_as_it_goes(tmp_path: Path) -> None:
    legacy = tmp_path / "mongo-spool.jsonl"
    legacy.write_text("".join(json.dumps({"revision": i, "fault": _f(i).model_dump(mode="json")}) + "\n"
                              for i in range(100)))  # fmt: skip
    spool = Spool(tmp_path / "mongo-spool", max_bytes=10_000, segment_bytes=3000)
    assert spool.size <= 10_000 and len(sorted(spool.sizes)) > 1
    assert spool.dropped["fault"] == 100 - len(spool) > 0
    assert _codes(spool) == [f"XID-{i}" for i in range(len(spool))]


class _Store:
    """The store's writes as a drain makes them; fault writes fail from the `fail_at`-th on, once."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.events: list[str] = []
        self.faults: list[str] = []

    def record_events(self, events: list[HealthEvent]) -> int:
        self.events += [e.id for e in events]
        return len(events)

    def write_fault(self, fault: Fault, revision: int) -> bool:
        if self.fail_at is not None and len(self.faults) + 1 == self.fail_at:
            self.fail_at = None
            raise TransientError("timed out")
        self.faults.append(fault.code)
        return True


def test_a_drain_goes_segment_by_segment_and_a_failure_keeps_the_rest_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", segment_bytes=3000)
    for i in range(30):
        spool.append([(_f(i), i)], [_e(i)])
    segments = sorted(spool.sizes)
    st = _Store(fail_at=16)
    with pytest.raises(TransientError):
        mongo.drain(spool, st)  # type: ignore[arg-type]
    assert segments[0] not in spool.sizes  # written segments are gone
    left = _codes(spool)
    assert left == [f"XID-{i}" for i in range(30 - len(left), 30)]  # the rest, in order
    assert len(left) + 15 >= 30  # nothing lost: at most the chunk under way is sent twice
    mongo.drain(spool, st)  # type: ignore[arg-type]
    assert st.faults[:15] + st.faults[-len(left) :] == [f"XID-{i}" for i in range(15)] + left
    assert sorted(set(st.faults)) == sorted(f"XID-{i}" for i in range(30))
    assert st.events == [f"e{i}" for i in range(30)]  # each segment's events once
    assert (len(spool), spool.size, list(spool.directory.iterdir())) == (0, 0, [])


def test_a_drain_that_fails_at_its_first_call_leaves_the_segment_open(tmp_path: Path) -> None:
    """The store still away: nothing was written, so appends go on into the same segment (one segment a
    batch would make an outage of small batches a spool of small files, coalescing nothing)."""
    spool = Spool(tmp_path / "spool")
    spool.append([(_f(1), 1)], [_e(1)])
    with pytest.raises(TransientError):
        mongo.drain(spool, _Away())  # type: ignore[arg-type]
    spool.append([(_f(2), 2)], [_e(2)])
    assert list(spool.sizes) == [spool.current]
    st = _Store()
    mongo.drain(spool, st)  # type: ignore[arg-type]
    assert (st.events, st.faults) == (["e1", "e2"], ["XID-1", "XID-2"])


def test_in_a_segment_fatal_faults_are_written_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.append([(_f(1), 1), (_f(2, fatal=True), 2), (_f(3), 3)])
    st = _Store()
    mongo.drain(spool, st)  # type: ignore[arg-type]
    assert st.faults == ["XID-2", "XID-1", "XID-3"]


class _Away:
    """A store that cannot be reached."""

    def ensure_indexes(self) -> None:
        raise TransientError("unreachable")

    def record_events(self, events: list[HealthEvent]) -> int:
        raise TransientError("unreachable")

    def close(self) -> None:
        pass


def _sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_sink_counts_exports_and_logs_what_a_full_spool_drops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    queue = Spool(tmp_path / "spool", max_bytes=6000)
    part = mongo._Partition("mongodb://unused", "agent", queue, (1.0, 1.0), 3600.0, False, _Away())  # type: ignore[arg-type]
    before = {k: _sample("faultline_spool_dropped_total", kind=k) for k in ("event", "fault")}
    try:
        with caplog.at_level(logging.WARNING, logger="sinks.mongo"):
            for i in range(20):
                f = _f(i)
                part.write_batch([NodeUpdate("n1", [f], [(f, i)], [_e(i)])])
    finally:
        part.close()
    dropped = {k: _sample("faultline_spool_dropped_total", kind=k) - before[k] for k in before}
    assert dropped == {"event": queue.dropped["event"], "fault": queue.dropped["fault"]}
    assert dropped["event"] > dropped["fault"] > 0
    assert _sample("faultline_spool_bytes") == queue.size > 0
    assert _sample("faultline_spool_depth") == len(queue) == 40 - sum(dropped.values())
    records = [r for r in caplog.records if r.getMessage() == "store spool full: writes dropped"]
    assert len(records) == 1  # the first drop; the next line after DROP_LOG_S with the count since
    first: Any = records[0]
    assert (first.events, first.faults, first.max_bytes) == (1, 0, 6000)
