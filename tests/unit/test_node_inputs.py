"""The node dataflow's input multiplexer and its batch matcher (no Bytewax run needed)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from dataflows import node
from patterns import compiler, loader
from sources import formats, inputs, wake
from sources.journal import Entry


def _entry(i: int, message: str) -> Entry:
    return Entry(f"c{i}", formats.Parsed(1_700_000_000.0 + i, "h", message, None))


def test_batch_matcher_finds_what_line_by_line_matching_finds() -> None:
    compiled = compiler.compile_packs(loader.load([], builtin=True), check_examples=False)
    messages = [
        "nfs: server storage-1 OK",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
        "multi\nline: NVRM: Xid (PCI:0000:5e:00): 48, pid=2, An uncorrectable double bit error",
        "ünïcødé — EXT4-fs (nvme0n1p1): re-mounted.",
        "NVRM: Xid (PCI:0000:86:00): 13, pid=3, Graphics Exception",  # after a non-ASCII line
        "audit: type=1400",
    ]
    entries = [_entry(i, m) for i, m in enumerate(messages)]
    got = node._entry_matcher(compiled, "journal", 1)(entries)
    want = [(e.record.message, h.code) for e in entries for h in compiled.match("journal", e.record.message)]
    assert sorted((t.message, t.hit.code) for t in got) == sorted(want)
    assert {h for _, h in want} >= {"XID-79", "XID-48", "XID-13"}
    assert node._entry_matcher(compiled, "journal", 1)([]) == []


class _Queue(StatefulSourcePartition[str, int]):
    """A thread-fed input: `put` queues an item and notifies, like the GPU and journal readers."""

    def __init__(self, resume: int | None) -> None:
        self.notifies = True
        self.items: list[str] = []
        self.taken = resume or 0

    def put(self, item: str) -> None:
        self.items.append(item)
        wake.notify()

    def next_batch(self) -> list[str]:
        out, self.items = self.items, []
        self.taken += len(out)
        return out

    def next_awake(self) -> dt.datetime | None:
        return None

    def snapshot(self) -> int:
        return self.taken


class _Timed(StatefulSourcePartition[str, None]):
    """A polled input due every `interval` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.due = dt.datetime.now(dt.UTC)
        self.polls = 0

    def next_batch(self) -> list[str]:
        now = dt.datetime.now(dt.UTC)
        if now < self.due:
            return []
        self.due = now + dt.timedelta(seconds=self.interval)
        self.polls += 1
        return []

    def next_awake(self) -> dt.datetime | None:
        return self.due

    def snapshot(self) -> None:
        return None


class _Source(FixedPartitionedSource[Any, Any]):
    def __init__(self, build: Any) -> None:
        self.build = build
        self.built: Any = None

    def list_parts(self) -> list[str]:
        return ["one"]

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> Any:
        self.built = self.build(resume_state)
        return self.built


def _drain_spin(part: Any) -> None:
    for _ in range(inputs.SPIN_CALLS):
        assert part.next_batch() == []


def test_inputs_sleep_until_notified_and_tag_batches_by_position() -> None:
    queued, timed = _Source(_Queue), _Source(lambda _r: _Timed(0.2))
    part = inputs.Inputs([("q", queued), ("t", timed)]).build_part("inputs", "inputs", {"q": 5})
    assert queued.built.taken == 5  # resume state handed to the input under its step id
    part.next_batch()  # first look: nothing queued, the timed input polled once
    wake.clear()
    threading.Timer(0.1, queued.built.put, args=("xid",)).start()
    started = time.monotonic()
    assert part.next_batch() == []  # slept until the notify (not the 0.25 s cap, not the timed input)
    waited = time.monotonic() - started
    assert 0.05 < waited < 0.19
    assert part.next_batch() == [(0, ["xid"])]
    _drain_spin(part)  # answered without looking while the batch moves downstream
    queued.built.items.append("quiet")  # queued without a notify: not seen during the spin...
    assert part.snapshot() == {"q": 6, "t": None}
    assert part.next_batch() == [(0, ["quiet"])]  # ...but at the next look


def test_inputs_wake_for_timed_inputs_and_cap_the_sleep() -> None:
    timed = _Source(lambda _r: _Timed(0.1))
    part = inputs.Inputs([("t", timed)]).build_part("inputs", "inputs", None)
    wake.clear()
    started = time.monotonic()
    for _ in range(4):
        part.next_batch()
    elapsed = time.monotonic() - started
    assert timed.built.polls >= 3  # woken for each due time, not only at the cap
    assert elapsed < 4 * inputs.MAX_WAIT_S


def test_detector_resends_its_state_after_a_restore_and_counts_past_old_revisions() -> None:
    compiled = compiler.compile_packs(loader.load([], builtin=True), check_examples=False)
    entries = [_entry(0, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")]
    base = node.revision_base()
    logic = node.DetectLogic("n1", compiled)
    assert logic.notify_at() > dt.datetime.now(dt.UTC) + dt.timedelta(seconds=node.RESEND_S - 5)
    (first,), _ = logic.on_item(node._entry_matcher(compiled, "journal", 1)(entries))
    [(fault, revision)] = first.changed
    assert fault.code == "XID-79" and base < revision <= node.revision_base() + 1
    restored = node.DetectLogic("n1", compiled, logic.snapshot())
    assert restored.notify_at() <= dt.datetime.now(dt.UTC)  # due at once: the sinks catch up
    (again,), _ = restored.on_notify()
    assert [f.code for f in again.faults] == ["XID-79"] and again.changed == []
    more = [_entry(1, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")]
    (later,), _ = restored.on_item(node._entry_matcher(compiled, "journal", 1)(more))
    assert later.changed[0][1] > revision + node.RESTART_GAP  # above whatever was written before the restart


def test_an_agent_starting_without_a_snapshot_writes_above_an_earlier_agent() -> None:
    """Its state directory lost (a reinstalled node, a wiped hostPath): its revisions must still be newer
    than those an earlier agent of the node stored, or the store would ignore its faults."""
    compiled = compiler.compile_packs(loader.load([], builtin=True), check_examples=False)
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    earlier = node.DetectLogic("n1", compiled)
    for i in range(50):  # an agent that has written many revisions
        (update,), _ = earlier.on_item(node._entry_matcher(compiled, "journal", 1)([_entry(i, line)]))
    [(_, old)] = update.changed
    deadline = time.monotonic() + 1
    while node.revision_base() <= old and time.monotonic() < deadline:
        time.sleep(0.001)  # the next millisecond: what any restart takes at least
    fresh = node.DetectLogic("n1", compiled)
    (update,), _ = fresh.on_item(node._entry_matcher(compiled, "journal", 1)([_entry(60, line)]))
    [(_, new)] = update.changed
    assert new > old


def test_a_gpus_events_carry_its_uuid_for_the_cluster_analyzer() -> None:
    compiled = compiler.compile_packs(loader.load([], builtin=True), check_examples=False)
    logic = node.DetectLogic("n1", compiled, gpu_uuids={"0000:3b:00": "GPU-8f2c"})
    lines = ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
             "NVRM: Xid (PCI:0000:5e:00): 79, pid=1, GPU has fallen off the bus."]  # fmt: skip
    (update,), _ = logic.on_item(
        node._entry_matcher(compiled, "journal", 1)([_entry(i, t) for i, t in enumerate(lines)])
    )
    assert [e.metadata for e in update.events] == [
        {"source": "journal", "gpu_uuid": "GPU-8f2c"}, {"source": "journal"}  # a GPU the backend does not list
    ]  # fmt: skip
