"""The GPU source's resume state on the simulated backend: an agent killed before its first GPU event
still replays, on restart, what was written after it started (found by the chaos suite's agent-kill
scenario: the snapshot's position was None, and the restarted backend took those events for history)."""

from __future__ import annotations

import time
from pathlib import Path

from sources import simulator
from sources.gpu import GpuEvent
from sources.gpu_source import GpuEventSource


def _source(tmp_path: Path) -> GpuEventSource:
    return GpuEventSource(simulator.SimulatorBackend("n1", directory=tmp_path, gpus=2), boot_id="boot-a")


def _events(part: object, want: int, timeout: float = 5.0) -> list[GpuEvent]:
    got: list[GpuEvent] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += [e for e in part.next_batch() if e.kind == "xid"]  # type: ignore[attr-defined]
        time.sleep(0.01)
    return got


def test_a_snapshot_before_the_first_event_replays_from_the_start(tmp_path: Path) -> None:
    simulator.inject("n1", 0, kind="xid", value=13, directory=tmp_path)  # before the first start: history
    first = _source(tmp_path).build_part("gpu", "gpu", None)
    try:
        state = first.snapshot()  # no event read yet: where reading began
    finally:
        first.close()
    assert state[0] is not None
    simulator.inject("n1", 1, kind="xid", value=79, directory=tmp_path)  # while the agent is down
    again = _source(tmp_path).build_part("gpu", "gpu", state)
    try:
        assert [(e.gpu, e.value) for e in _events(again, 1)] == [(1, 79)]
    finally:
        again.close()


def test_a_first_start_without_a_snapshot_leaves_history_alone(tmp_path: Path) -> None:
    simulator.inject("n1", 0, kind="xid", value=13, directory=tmp_path)
    part = _source(tmp_path).build_part("gpu", "gpu", None)
    try:
        simulator.inject("n1", 1, kind="xid", value=79, directory=tmp_path)
        assert [(e.gpu, e.value) for e in _events(part, 1)] == [(1, 79)]
        assert _events(part, 1, timeout=0.3) == []  # the XID 13 from before the start never comes
    finally:
        part.close()
