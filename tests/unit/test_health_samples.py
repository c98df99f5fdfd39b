"""The node agent's health samples (`health_samples`): one per GPU of a field read, every field as a number,
with the GPU's UUID and the node's boot id, stored as a healthy event that no pattern and no fault sees,
and read by the cluster analyzer's anomaly scores as they are; off by default. The GPU backends read the
temperature (a gauge: no event of its own), and DCGM's counters go into the samples only."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataflows import node as node_flow
from faultline.config import AgentConfig
from faultline.config.analyzer import ANOMALY_FIELDS
from faultline.models import HealthEvent
from patterns import anomaly, compiler, loader
from sources import dcgm, gpu, simulator
from sources.gpu_source import GpuEventSource, GpuPolling
from tests.unit.test_dcgm import FAKE

DEVICE = gpu.GpuDevice(3, "GPU-3f2a", "0000:5d:00")


def test_a_read_makes_one_sample_per_gpu_with_every_field() -> None:
    read = {
        0: {"temperature": 45, "ecc_sbe_volatile": 12, "pcie_replay": 0},
        1: {"lost": 1},  # off the bus: nothing to sample
        2: {},  # a backend that read nothing of it
        3: {"ecc_sbe_volatile": 1204, "nvlink_crc": 7},
        dcgm.NODE: {"dcgm_nvswitch_fatal_s1_52": 0},  # no GPU's
    }
    samples = gpu.samples(read, 1700000000.0)
    assert [(s.gpu, s.kind, s.ts) for s in samples] == [
        (0, "sample", 1700000000.0),
        (3, "sample", 1700000000.0),
    ]
    assert samples[0].fields == (("ecc_sbe_volatile", 12), ("pcie_replay", 0), ("temperature", 45))
    assert gpu.message(samples[0], DEVICE) is None  # no line: no pattern ever reads a sample


def test_gauges_and_sample_only_fields_make_no_event() -> None:
    before = {0: {"temperature": 40, "pcie_replay": 1, "ecc_sbe_volatile": 3}}
    after = {0: {"temperature": 88, "pcie_replay": 4, "ecc_sbe_volatile": 9}}
    changes = gpu.field_changes(before, after, 2.0)
    assert [(e.kind, e.name, e.value) for e in changes] == [("counter", "pcie_replay", 3),
                                                             ("counter", "ecc_sbe_volatile", 6)]  # fmt: skip
    assert gpu.field_changes(before, after, 2.0, gpu.GAUGES | dcgm.DcgmBackend.sample_only) == []
    assert gpu.field_changes({}, {0: {"temperature": 95}}, 1.0) == []  # not abnormal at a first read either


def test_the_sample_event_carries_numbers_uuid_and_boot_id() -> None:
    (sample,) = gpu.samples({3: {"ecc_sbe_volatile": 1204, "temperature": 61, "nvlink_crc": 0}}, 1700000060.0)
    event = node_flow.health_sample("n1", "nvml", DEVICE, sample, "boot-a")
    assert (event.code, event.check, event.component.value) == (
        "GPU-HEALTH-SAMPLE",
        "gpu-health-sample",
        "GPU",
    )
    assert (event.healthy, event.fatal, event.action.value) == (True, False, "NONE")
    assert [(e.type, e.id) for e in event.entities] == [("GPU", "0000:5d:00")]
    assert event.metadata == {"ecc_sbe_volatile": "1204", "nvlink_crc": "0", "temperature": "61",
                              "source": "nvml", "gpu_uuid": "GPU-3f2a", "boot_id": "boot-a"}  # fmt: skip
    assert event.observed_at.timestamp() == 1700000060.0
    again = node_flow.health_sample("n1", "nvml", DEVICE, sample, "boot-a")
    assert again.id == event.id  # deterministic: a replay stores it once
    assert (
        node_flow.health_sample("n1", "nvml", DEVICE, gpu.samples({3: {"x": 1}}, 1700000120.0)[0]).id
        != event.id
    )
    no_boot = node_flow.health_sample("n1", "dcgm", DEVICE, sample)
    assert "boot_id" not in no_boot.metadata and no_boot.metadata["source"] == "dcgm"

    # the analyzer's anomaly scores read it as it is: the enabled fields, as numbers, and the boot
    fields = ANOMALY_FIELDS
    got = anomaly.sample(event.metadata["gpu_uuid"], 7, 1700000060.0, "n1", event.id, event.metadata, fields)
    assert got == ("GPU-3f2a", 7, 1700000060.0, "n1", "boot-a", event.id,
                   (("ecc_sbe_volatile", 1204.0), ("nvlink_crc", 0.0)))  # fmt: skip
    # (temperature is off by default in the analyzer; switched on, it is read too)


def test_samples_are_stored_and_never_observed() -> None:
    compiled = compiler.compile_packs(loader.load([]))
    logic = node_flow.DetectLogic("n1", compiled, gpu_uuids={DEVICE.pci: DEVICE.uuid})
    samples: list[Any] = [
        node_flow.health_sample("n1", "nvml", DEVICE, s, "b")
        for s in gpu.samples({3: {"ecc_dbe_volatile": 2, "remapped_rows_pending": 1}}, time.time())
    ]  # abnormal values in a sample are the sample's: only a match opens a fault
    (update,), _retain = logic.on_item(samples)
    assert update.faults == [] and update.changed == [] and update.events == samples
    state = logic.snapshot()

    text = f"GPU {DEVICE.pci} health ecc_dbe_volatile=2"
    (hit,) = compiled.match("nvml", text)
    from sources import scan  # noqa: PLC0415

    matched = scan.Timed(time.time(), (0, 0), hit, text, None, "nvml")
    (update,), _retain = logic.on_item([matched, *samples])
    assert [e.code for e in update.events] == ["GPU-ECC-DBE-VOLATILE", "GPU-HEALTH-SAMPLE"]
    assert [f.code for f in update.faults] == ["GPU-ECC-DBE-VOLATILE"]
    assert isinstance(update.events[1], HealthEvent) and state["sequence"] + 1 == logic.sequence


def test_off_by_default() -> None:
    base = {"node": "n1", "mongodb_uri": "mongodb://x"}
    assert AgentConfig.model_validate(base).health_samples is None
    assert AgentConfig.model_validate({**base, "health_samples": "1m"}).health_samples == 60.0
    with pytest.raises(ValueError, match="health_samples"):
        AgentConfig.model_validate({**base, "health_samples": "100ms"})
    assert GpuPolling().samples is None


def _gpu_events(part: Any, kind: str, want: int, timeout: float = 5.0) -> list[gpu.GpuEvent]:
    got: list[gpu.GpuEvent] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += [e for e in part.next_batch() if e.kind == kind]
        time.sleep(0.01)
    return got


def test_the_gpu_source_samples_each_gpu_once_per_interval(tmp_path: Path) -> None:
    simulator.inject("n1", 1, kind="field", name="ecc_sbe_volatile", value=1204, directory=tmp_path)
    backend = simulator.SimulatorBackend("n1", directory=tmp_path, gpus=2)
    polling = GpuPolling(interval=0.02, samples=3600.0)
    part = GpuEventSource(backend, polling, boot_id="boot-a").build_part("gpu", "gpu", None)
    try:
        first = _gpu_events(part, "sample", 2)  # the first read is sampled
        assert [(s.gpu, s.fields) for s in first] == [
            (0, (("temperature", simulator.SIM_TEMPERATURE),)),
            (1, (("ecc_sbe_volatile", 1204), ("temperature", simulator.SIM_TEMPERATURE))),
        ]
        simulator.inject("n1", 0, kind="field", name="temperature", value=90, directory=tmp_path)
        deadline = time.monotonic() + 5
        while part.latest[0].get("temperature") != 90 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert part.latest[0]["temperature"] == 90  # read by the polls that go on
        assert _gpu_events(part, "sample", 1, timeout=0.3) == []  # not due for an hour
        assert _gpu_events(part, "field", 1, timeout=0.3) == []  # a temperature is no event
    finally:
        part.close()
    off = GpuEventSource(simulator.SimulatorBackend("n1", directory=tmp_path, gpus=2), GpuPolling(interval=0.02),
                         boot_id="boot-a").build_part("gpu", "gpu", None)  # fmt: skip
    try:
        assert _gpu_events(off, "monitor", 1) != []  # read at least once
        assert _gpu_events(off, "sample", 1, timeout=0.3) == []
    finally:
        off.close()


@pytest.fixture
def bindings() -> Iterator[dict[str, Any]]:
    modules = dcgm.load_bindings(FAKE)
    state = modules["dcgm_agent"].STATE
    saved = {k: list(v) if isinstance(v, list) else v for k, v in state.items()}
    yield modules
    state.update(saved)


def test_dcgm_reads_counters_and_temperature_as_values(bindings: dict[str, Any]) -> None:
    f, state = bindings["dcgm_fields"], bindings["dcgm_agent"].STATE
    backend = dcgm.DcgmBackend("localhost:5555", bindings)
    watched, update_us = state["watched"]
    assert sorted(watched) == sorted(getattr(f, name) for name in dcgm.VALUES.values())
    assert update_us == dcgm.VALUES_UPDATE_US
    state["values"] = {
        0: {f.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: 1204, f.DCGM_FI_DEV_GPU_TEMP: 61, f.DCGM_FI_DEV_PCIE_REPLAY_COUNTER: 3,
            f.DCGM_FI_DEV_RETIRED_SBE: None},  # blank: DCGM has no value for it
        1: {f.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 5},
        7: {f.DCGM_FI_DEV_GPU_TEMP: 50},  # a GPU not in the group
    }  # fmt: skip
    read = backend.read_fields()
    assert read == {0: {"ecc_sbe_volatile": 1204, "temperature": 61, "pcie_replay": 3},
                    1: {"nvlink_crc": 5}, dcgm.NODE: {}}  # fmt: skip
    assert [(s.gpu, s.fields) for s in gpu.samples(read, 1.0)] == [
        (0, (("ecc_sbe_volatile", 1204), ("pcie_replay", 3), ("temperature", 61))),
        (1, (("nvlink_crc", 5),)),
    ]
    state["values"] = {0: {f.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: 1300}}
    later = backend.read_fields()
    assert later[0] == {"ecc_sbe_volatile": 1300} and later[1] == {}  # gone values are left out, not 0
    quiet = gpu.GAUGES | backend.sample_only
    assert gpu.field_changes(read, later, 2.0, quiet) == []  # DCGM's own watches judge them: samples only
    backend.close()


def test_dcgm_without_field_values_keeps_its_health_watches(bindings: dict[str, Any]) -> None:
    state = bindings["dcgm_agent"].STATE
    state["refuse_watch"] = True
    state["values"] = {0: {bindings["dcgm_fields"].DCGM_FI_DEV_GPU_TEMP: 61}}
    backend = dcgm.DcgmBackend("localhost:5555", bindings)
    assert backend.read_fields() == {0: {}, 1: {}, dcgm.NODE: {}}
    backend.close()


def test_a_climbing_counter_in_the_samples_raises_an_anomaly_on_that_gpu() -> None:
    """The agent's samples of a simulated node, a minute apart, through the analyzer's models: a steady
    GPU raises nothing; the GPU whose correctable-ECC counter starts to climb raises on its UUID."""
    devices = simulator.devices_for("n1", 2)
    models = anomaly.Models(anomaly.Settings(ANOMALY_FIELDS, warmup=10))
    ecc = {0: 50, 1: 1204}
    raised = []
    for minute in range(40):
        if minute >= 30:
            ecc[1] += 30  # 1,800 correctable errors an hour, where the normal was a few
        elif minute % 7 == 0:
            ecc[1] += 1
        read = {i: {"ecc_sbe_volatile": ecc[i], "temperature": 45 + minute % 3} for i in (0, 1)}
        for s in gpu.samples(read, 1700000000.0 + 60 * minute):
            event = node_flow.health_sample("n1", "nvml", devices[s.gpu], s, "boot-a")
            meta = event.metadata
            got = anomaly.sample(meta["gpu_uuid"], minute, s.ts, "n1", event.id, meta, ANOMALY_FIELDS)
            assert got is not None
            raised += [(f.gpu, f.code, f.resolved) for f in models.add(got)]
    assert raised == [(devices[1].uuid, "GPU-ANOMALY-ECC-SBE-VOLATILE", False)]
