"""Health fields: what a change between two reads reports, the monitor's own health from its polls, and
the simulator's fields (state folded from its control file, as a restarted agent sees them)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from patterns import compiler, loader
from patterns.detectors import NodeDetector
from sources import gpu, simulator


def kinds(events: list[gpu.GpuEvent]) -> list[tuple[int, str, str, int]]:
    return [(e.gpu, e.kind, e.name, e.value) for e in events]


def test_first_read_reports_only_abnormal_states() -> None:
    current = {0: {"ecc_dbe_volatile": 0, "pcie_replay": 40, "thermal_slowdown": 1}, 1: {"nvlink_down": 0}}
    assert kinds(gpu.field_changes({}, current, 1.0)) == [(0, "field", "thermal_slowdown", 1)]


def test_changes_states_both_ways_and_counter_rises_only() -> None:
    before = {0: {"ecc_dbe_volatile": 0, "pcie_replay": 40, "thermal_slowdown": 1}}
    after = {0: {"ecc_dbe_volatile": 2, "pcie_replay": 52, "thermal_slowdown": 0}}
    assert kinds(gpu.field_changes(before, after, 1.0)) == [
        (0, "field", "ecc_dbe_volatile", 2),
        (0, "counter", "pcie_replay", 12),
        (0, "field", "thermal_slowdown", 0),
    ]
    reset = {0: {"ecc_dbe_volatile": 2, "pcie_replay": 0, "thermal_slowdown": 0}}
    assert gpu.field_changes(after, reset, 2.0) == []  # a counter reset (driver reload) is not an error


def test_monitor_unhealthy_when_a_call_fails_or_hangs_then_unresponsive_then_healthy() -> None:
    watch = gpu.MonitorWatch(hung_after=10, unresponsive_after=60)
    assert watch.observe(100.0, running_since=95.0, failure=None) == []  # a slow call, not yet hung
    (hung,) = watch.observe(106.0, running_since=95.0, failure=None)
    assert (hung.gpu, hung.kind, hung.value) == (-1, "monitor", gpu.MONITOR_UNHEALTHY)
    assert "has not returned for 11 s" in hung.name
    assert watch.observe(150.0, running_since=95.0, failure=None) == []  # still the same state
    (stuck,) = watch.observe(156.0, running_since=95.0, failure=None)  # 61 s since the call began
    assert stuck.value == gpu.MONITOR_UNRESPONSIVE
    (ok,) = watch.observe(157.0, running_since=None, failure=None)
    assert ok.value == gpu.MONITOR_OK
    (failed,) = watch.observe(200.0, running_since=None, failure="NVMLError_Uninitialized: driver not loaded")
    assert (failed.value, failed.name) == (
        gpu.MONITOR_UNHEALTHY,
        "NVMLError_Uninitialized: driver not loaded",
    )
    assert watch.observe(259.0, None, "NVMLError_Uninitialized: driver not loaded") == []
    assert watch.observe(260.0, None, "NVMLError_Uninitialized: driver not loaded")[0].value == 2


def test_monitor_lines_and_field_lines_classify_through_the_builtin_pack() -> None:
    compiled = compiler.compile_packs(loader.load([]))
    detector = NodeDetector("n", compiled)
    device = gpu.GpuDevice(0, "GPU-x", "0000:18:00")
    stream = [
        gpu.GpuEvent(1.0, 0, "field", 2, name="ecc_dbe_volatile"),
        gpu.GpuEvent(2.0, 0, "field", 1, name="thermal_slowdown"),
        gpu.GpuEvent(3.0, -1, "monitor", gpu.MONITOR_UNHEALTHY, name="hung"),
        gpu.GpuEvent(4.0, 0, "field", 0, name="ecc_dbe_volatile"),  # a reset cleared the counter
        gpu.GpuEvent(5.0, -1, "monitor", gpu.MONITOR_OK),
        gpu.GpuEvent(6.0, 0, "field", 1, name="lost"),
    ]
    for event in stream:
        text = gpu.message(event, device if event.gpu >= 0 else None)
        assert text is not None
        for hit in compiled.match("nvml", text):
            detector.observe(event.ts, hit, text)
    got = {(f.code, f.component.value, f.state.value) for f in detector.snapshot_faults()}
    assert got == {
        ("GPU-ECC-DBE-VOLATILE", "GPU", "resolved"),
        ("GPU-THERMAL-SLOWDOWN", "GPU", "open"),  # the ECC clear resolved only its own code
        ("GPU-MONITOR-UNHEALTHY", "MONITOR", "resolved"),
        ("GPU-FELL-OFF-BUS", "GPU", "open"),
    }


def test_simulator_fields_are_state_folded_from_the_control_file(tmp_path: Path) -> None:
    simulator.inject("n1", 2, kind="field", name="ecc_dbe_volatile", value=1, directory=tmp_path)
    simulator.inject("n1", 2, kind="xid", value=79, directory=tmp_path)  # history: not replayed
    backend = simulator.SimulatorBackend("n1", directory=tmp_path)
    idle = simulator.SIM_TEMPERATURE
    assert backend.read_fields()[2] == {"ecc_dbe_volatile": 1, "temperature": idle}  # set before the start
    assert backend.wait_events(0.05) == []
    simulator.inject("n1", 2, kind="field", name="nvlink_down", value=3, directory=tmp_path)
    simulator.inject("n1", 2, kind="field", name="temperature", value=84, directory=tmp_path)
    assert backend.wait_events(1.0) == [] and backend.read_fields()[2]["temperature"] == 84
    simulator.inject("n1", 2, kind="healthy", directory=tmp_path)
    (healthy,) = backend.wait_events(1.0)
    assert healthy.kind == "healthy"
    assert backend.read_fields()[2] == {"ecc_dbe_volatile": 0, "nvlink_down": 0, "temperature": idle}
    assert healthy.position is not None
    backend.close()


def test_simulator_resumes_after_a_position(tmp_path: Path) -> None:
    for xid in (13, 31, 79):
        simulator.inject("n2", 0, kind="xid", value=xid, directory=tmp_path)
    first = simulator.SimulatorBackend("n2", directory=tmp_path)
    first.resume(0)
    events = first.wait_events(1.0)
    assert [e.value for e in events] == [13, 31, 79]
    again = simulator.SimulatorBackend("n2", directory=tmp_path)
    again.resume(events[0].position or 0)
    assert [e.value for e in again.wait_events(1.0)] == [31, 79]


def test_simulated_hang_blocks_reads(tmp_path: Path) -> None:
    backend = simulator.SimulatorBackend("n3", directory=tmp_path)
    simulator.inject("n3", 0, kind="hang", value=1, directory=tmp_path)
    backend.wait_events(0.1)
    started = time.monotonic()
    done = threading.Event()
    threading.Thread(target=lambda: (backend.read_fields(), done.set()), daemon=True).start()
    assert not done.wait(0.5)
    assert done.wait(2.0) and time.monotonic() - started >= 0.8


@pytest.mark.parametrize("bad", ["ecc", "ECC=1", "ecc=x", "=1", "ecc=1.5"])
def test_bad_field_spec_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match="NAME=INTEGER"):
        simulator.parse_field(bad)


def test_a_monitor_that_is_not_the_driver_never_becomes_a_node_fault() -> None:
    """DCGM's host engine away for an hour (the GPU operator upgraded): GpuMonitorHealthy False, GpuHealthy
    still True; no GPU-DRIVER-UNRESPONSIVE, so no reboot (sources.gpu: only in-process driver calls)."""
    from faultline import conditions  # noqa: PLC0415
    from sources import dcgm, nvml  # noqa: PLC0415

    assert dcgm.DcgmBackend.driver_in_process is False
    assert getattr(nvml.NvmlBackend, "driver_in_process", True) is True
    watch = gpu.MonitorWatch(hung_after=10, unresponsive_after=300, escalates=False)
    refused = "DCGMError_ConnectionNotValid: host engine connection refused"
    (down,) = watch.observe(0.0, None, refused)
    assert down.value == gpu.MONITOR_UNHEALTHY
    assert watch.observe(3600.0, None, refused) == []  # an hour: still only the monitor's health
    assert watch.observe(3700.0, running_since=0.0, failure=None) == []  # a call hung for an hour: the same
    compiled = compiler.compile_packs(loader.load([]))
    detector = NodeDetector("n", compiled)
    text = gpu.message(down, None)
    assert text is not None
    for hit in compiled.match("dcgm", text):
        detector.observe(1.0, hit, text)
    faults = detector.snapshot_faults()
    assert [(f.code, f.fatal) for f in faults] == [("GPU-MONITOR-UNHEALTHY", False)]
    wanted = conditions.desired(faults)
    assert wanted["GpuMonitorHealthy"].status == "False" and wanted["GpuHealthy"].status == "True"
