"""The simulated GPU backend's event wait: it blocks like NVML's and wakes on an injection."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sources import simulator


def test_wait_wakes_on_injection_and_ignores_other_files(tmp_path: Path) -> None:
    backend = simulator.SimulatorBackend("n1", directory=tmp_path)
    try:
        assert backend._watch is not None  # Linux: inotify, not polling
        (tmp_path / "other.jsonl").write_text("noise\n")  # another file in the directory
        started = time.monotonic()
        assert backend.wait_events(0.3) == []
        assert time.monotonic() - started >= 0.29  # did not return early for the other file
        threading.Timer(0.1, simulator.inject, args=("n1", 3), kwargs={"kind": "xid", "value": 79,
                                                                       "directory": tmp_path}).start()  # fmt: skip
        started = time.monotonic()
        events = backend.wait_events(5.0)
        waited = time.monotonic() - started
        assert [(e.gpu, e.kind, e.value) for e in events] == [(3, "xid", 79)]
        assert 0.05 < waited < 1.0
    finally:
        backend.close()


def test_scenario_records_bound_the_wait(tmp_path: Path) -> None:
    backend = simulator.SimulatorBackend(
        "n2", directory=tmp_path, scenario=[{"at": "0.2s", "gpu": 1, "xid": 48}]
    )
    try:
        started = time.monotonic()
        events = backend.wait_events(5.0)
        assert [(e.gpu, e.value) for e in events] == [(1, 48)]
        assert time.monotonic() - started < 1.0
    finally:
        backend.close()


def test_polling_fallback_without_inotify(tmp_path: Path) -> None:
    backend = simulator.SimulatorBackend("n3", directory=tmp_path)
    backend._watch = None  # as where inotify is unavailable
    try:
        simulator.inject("n3", 0, kind="xid", value=13, directory=tmp_path)
        assert [e.value for e in backend.wait_events(1.0)] == [13]
    finally:
        backend.close()
