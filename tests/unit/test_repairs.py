"""Repairs confirmed from the GPUs themselves (issue 14 item 6): the verdict on a fresh read, which GPUs
of the janitor's verified rounds are reported repaired, and what those reports clear in the built-in
packs (a reset what a reset repairs, a reboot what a reboot repairs). A user-space "successfully
reset" line clears nothing."""

from __future__ import annotations

import datetime as dt
import functools
from pathlib import Path

import pytest

from faultline import store
from faultline.models import FaultState
from patterns import compiler, loader
from patterns.compiler import CompiledPacks
from patterns.detectors import NodeDetector
from sources import gpu, simulator
from sources.gpu_source import GpuEventSource
from sources.repairs import RepairWatch

DEVICES = [gpu.GpuDevice(0, "GPU-a", "0000:18:00"), gpu.GpuDevice(1, "GPU-b", "0000:2a:00")]
AT = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def notice(
    step: str = "GPU_RESET", *gpus: str, round_id: str = "n1/2026-12-01T00:00:00#0"
) -> store.RepairNotice:
    return store.RepairNotice(round_id=round_id, step=step, gpus=gpus or ("0000:18:00",), verified_at=AT)


@pytest.mark.parametrize(
    ("fields", "verdict"),
    [
        ({"ecc_dbe_volatile": 0, "remapped_rows_pending": 0, "ecc_dbe_aggregate": 3}, None),
        ({"pcie_replay": 12, "remapped_rows_correctable": 2}, None),  # counts of the past are no verdict
        ({"lost": 1}, "lost=1"),
        ({"ecc_dbe_volatile": 1}, "ecc_dbe_volatile=1"),
        ({"remapped_rows_pending": 1, "nvlink_down": 2}, "remapped_rows_pending=1, nvlink_down=2"),
        ({"retired_pages_pending": 1}, "retired_pages_pending=1"),
        ({"remapped_rows_failure": 1}, "remapped_rows_failure=1"),
        ({}, None),  # read, and nothing this backend reports is abnormal
        (None, "not read"),
    ],
)
def test_repair_verdict(fields: dict[str, int] | None, verdict: str | None) -> None:
    assert gpu.repair_verdict(fields) == verdict


def test_each_gpu_of_a_round_is_reported_once_when_it_reads_repaired() -> None:
    watch = RepairWatch(DEVICES)
    round_ = notice("GPU_RESET", "0000:18:00", "0000:2a:00", "0000:ff:00")  # ff: not this node's GPU
    still_bad = {0: {"ecc_dbe_volatile": 0}, 1: {"remapped_rows_pending": 1}}
    events = watch.judge([round_], still_bad, 1.0)
    assert [(e.gpu, e.kind, e.name) for e in events] == [(0, "repaired", "GPU_RESET")]
    assert watch.judge([round_], still_bad, 2.0) == []  # reported once
    now_good = {0: {}, 1: {"remapped_rows_pending": 0}}
    assert [e.gpu for e in watch.judge([round_], now_good, 3.0)] == [1]  # re-read until it reads repaired
    assert watch.judge([], now_good, 4.0) == []  # the round closed: forgotten
    assert not watch.reported and not watch.waiting


def test_no_round_no_report_and_other_steps_are_ignored() -> None:
    watch = RepairWatch(DEVICES)
    healthy = {0: {}, 1: {}}
    assert watch.judge([], healthy, 1.0) == []
    assert watch.judge([notice("REPLACE")], healthy, 1.0) == []
    reboot = watch.judge([notice("REBOOT", "0000:2a:00")], healthy, 1.0)
    assert [(e.gpu, e.name) for e in reboot] == [(1, "REBOOT")]


@functools.cache
def builtin() -> CompiledPacks:
    return compiler.compile_packs(loader.load())


def detector_with(*lines: tuple[str, str]) -> NodeDetector:
    compiled = builtin()
    detector = NodeDetector("n1", compiled)
    for ts, (source, line) in enumerate(lines, start=1):
        for hit in compiled.match(source, line):
            detector.observe(float(ts), hit, line)
    return detector


def states(detector: NodeDetector) -> dict[str, FaultState]:
    return {f.code: f.state for f in detector.snapshot_faults()}


XID_95 = ("kmsg", "NVRM: Xid (PCI:0000:18:00): 95, pid=1, name=x, Uncontained: FBHUB. RST: Yes, D-RST: No")
XID_79 = ("kmsg", "NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.")


def repaired(step: str) -> tuple[str, str]:
    text = gpu.message(gpu.GpuEvent(9.0, 0, "repaired", name=step), DEVICES[0])
    assert text is not None
    return "nvml", text


def test_a_confirmed_reset_clears_what_a_reset_repairs() -> None:
    assert states(detector_with(XID_95, XID_79)) == {"XID-95": FaultState.OPEN, "XID-79": FaultState.OPEN}
    after = states(detector_with(XID_95, XID_79, repaired("GPU_RESET")))
    assert after == {"XID-95": FaultState.RESOLVED, "XID-79": FaultState.OPEN}  # 79 needs a reboot
    after = states(detector_with(XID_95, XID_79, repaired("REBOOT")))
    assert after == {"XID-95": FaultState.RESOLVED, "XID-79": FaultState.RESOLVED}


@pytest.mark.parametrize("source", ["syslog", "journal", "kmsg", "nvml", "dcgm", "grpc"])
def test_a_successfully_reset_line_clears_nothing(source: str) -> None:
    spoof = (source, "GPU 00000000:18:00.0 was successfully reset.")
    assert not builtin().match(source, spoof[1])
    assert states(detector_with(XID_95, spoof)) == {"XID-95": FaultState.OPEN}


def test_the_repaired_line_is_the_gpu_backends_alone() -> None:
    text = repaired("GPU_RESET")[1]
    for source in ("syslog", "journal", "kmsg", "grpc"):  # what a process on the node can write to
        assert not builtin().match(source, text)
    assert [h.kind for h in builtin().match("dcgm", text)] == ["clear"]


def test_a_simulated_reset_clears_volatile_and_pending_fields_only(tmp_path: Path) -> None:
    backend = simulator.SimulatorBackend("n1", directory=tmp_path, gpus=2)
    try:
        for name, value in (("ecc_dbe_volatile", 1), ("remapped_rows_pending", 1), ("lost", 1),
                            ("ecc_dbe_aggregate", 4)):  # fmt: skip
            simulator.inject("n1", 1, kind="field", value=value, name=name, directory=tmp_path)
        simulator.inject("n1", 1, kind="reset", directory=tmp_path)
        assert backend.wait_events(0.5) == []  # a state change, as a field record is
        fields = backend.read_fields()[1]
        assert fields == {
            "ecc_dbe_volatile": 0,
            "remapped_rows_pending": 0,
            "lost": 1,
            "ecc_dbe_aggregate": 4,
        }
        assert gpu.repair_verdict(fields) == "lost=1"  # a GPU off the bus is not repaired by a reset
        assert gpu.message(gpu.GpuEvent(1.0, 1, "reset"), DEVICES[1]) is None  # a reset writes no line
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("resume", "kept"),
    [
        ((None, {1: {"lost": 1}}, "boot-a"), True),  # the same boot: only changes are reported
        ((None, {1: {"lost": 1}}, "boot-b"), False),  # rebooted: every abnormal state is reported afresh
        ((None, {1: {"lost": 1}}), False),  # a snapshot from before boots were kept
    ],
)
def test_the_fields_of_another_boot_are_not_resumed(
    tmp_path: Path, resume: tuple[object, ...], kept: bool
) -> None:
    source = GpuEventSource(simulator.SimulatorBackend("n1", directory=tmp_path, gpus=2), boot_id="boot-a")
    part = source.build_part("gpu", "gpu", resume)  # type: ignore[arg-type]
    try:
        assert part.fields == ({1: {"lost": 1}} if kept else {})
        assert part.snapshot()[2] == "boot-a"
    finally:
        part.close()
