"""The DCGM backend through stand-ins for DCGM's Python bindings (no host engine here): devices, health
watches set, incidents as fields, passing again as 0, and what the `dcgm` pack makes of them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faultline.errors import ConfigError
from patterns import compiler, loader
from patterns.detectors import NodeDetector
from sources import dcgm, gpu

FAKE = Path(__file__).parent / "fake_dcgm"


@pytest.fixture
def bindings() -> Iterator[dict[str, Any]]:
    modules = dcgm.load_bindings(FAKE)
    state = modules["dcgm_agent"].STATE
    saved = {k: list(v) if isinstance(v, list) else v for k, v in state.items()}
    yield modules
    state.update(saved)


def incident(b: dict[str, Any], system: str, health: int, code: int, entity: int, group: int = 1) -> Any:
    s = b["dcgm_structs"]
    return s.Incident(getattr(s, f"DCGM_HEALTH_WATCH_{system}"), health, s.ErrorDetail(b"x", code),
                      s.EntityPair(group, entity))  # fmt: skip


def test_devices_watches_and_incidents_as_fields(bindings: dict[str, Any]) -> None:
    state = bindings["dcgm_agent"].STATE
    backend = dcgm.DcgmBackend("nvidia-dcgm:5555", bindings)
    assert state["connected"] == "nvidia-dcgm:5555"
    assert [(d.index, d.uuid, d.pci) for d in backend.devices()] == [(0, "GPU-d0", "0000:18:00"),
                                                                    (1, "GPU-d1", "0000:2a:00")]  # fmt: skip
    assert state["watches"] == 0xFFF  # every system these bindings know
    assert state["entities"] == [(3, 0), (3, 1)]  # the NVSwitches are in the group
    assert backend.read_fields() == {0: {}, 1: {}, dcgm.NODE: {}}
    s = bindings["dcgm_structs"]
    state["incidents"] = [
        incident(bindings, "PCIE", s.DCGM_HEALTH_RESULT_FAIL, 23, 1),
        incident(bindings, "THERMAL", s.DCGM_HEALTH_RESULT_WARN, 14, 0),
        incident(bindings, "NVSWITCH_FATAL", s.DCGM_HEALTH_RESULT_FAIL, 52, 1, group=3),
    ]
    assert backend.read_fields() == {0: {"dcgm_thermal_14": 1}, 1: {"dcgm_pcie_23": 2},
                                     dcgm.NODE: {"dcgm_nvswitch_fatal_s1_52": 2}}  # fmt: skip
    state["incidents"] = state["incidents"][:1]
    assert backend.read_fields() == {0: {"dcgm_thermal_14": 0}, 1: {"dcgm_pcie_23": 2},
                                     dcgm.NODE: {"dcgm_nvswitch_fatal_s1_52": 0}}  # fmt: skip
    backend.close()
    assert state["connected"] is None


def test_identity_from_the_device_attributes(bindings: dict[str, Any]) -> None:
    """Model, serial, VBIOS and driver from DCGM's device attributes ("" where a GPU's are not given)."""
    backend = dcgm.DcgmBackend("localhost:5555", bindings)
    got = {i: (g.model, g.serial, g.vbios, g.driver) for i, g in backend.inventory().items()}
    backend.close()
    assert got == {0: ("NVIDIA H100 80GB HBM3", "1652022012345", "96.00.99.00.01", "580.95.05"),
                   1: ("", "", "", "")}  # fmt: skip


def test_dcgm_fields_through_the_pack(bindings: dict[str, Any]) -> None:
    backend = dcgm.DcgmBackend("localhost:5555", bindings)
    devices = {d.index: d for d in backend.devices()}
    compiled = compiler.compile_packs(loader.load([]))
    detector = NodeDetector("n", compiled)
    s, state = bindings["dcgm_structs"], bindings["dcgm_agent"].STATE
    previous: dict[int, dict[str, int]] = {}
    steps = [
        [incident(bindings, "MEM", s.DCGM_HEALTH_RESULT_FAIL, 4, 0),
         incident(bindings, "NVSWITCH_FATAL", s.DCGM_HEALTH_RESULT_FAIL, 15, 0, group=3)],
        [incident(bindings, "NVSWITCH_FATAL", s.DCGM_HEALTH_RESULT_FAIL, 15, 0, group=3)],
    ]  # fmt: skip
    for ts, incidents in enumerate(steps, start=1):
        state["incidents"] = incidents
        current = backend.read_fields()
        for event in gpu.field_changes(previous, current, float(ts)):
            text = gpu.message(event, devices.get(event.gpu))
            assert text is not None
            for hit in compiled.match("dcgm", text):
                detector.observe(float(ts), hit, text)
        previous = current
    got = {(f.entity.type, f.entity.id, f.code, f.fatal, f.action.value, f.state.value)
           for f in detector.snapshot_faults()}  # fmt: skip
    assert got == {
        ("GPU", "0000:18:00", "DCGM-MEM-4", True, "COMPONENT_RESET", "resolved"),
        ("NVSWITCH", "0", "DCGM-NVSWITCH-FATAL-15", True, "RESTART_BM", "open"),
    }


def test_missing_bindings_are_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(FAKE)])
    for name in ("pydcgm", "dcgm_structs", "dcgm_fields", "dcgm_agent"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ConfigError, match="DCGM's Python bindings"):
        dcgm.load_bindings(tmp_path / "nowhere-with-no-pydcgm-either")
