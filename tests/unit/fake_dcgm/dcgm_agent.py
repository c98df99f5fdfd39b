"""A stand-in for DCGM's `dcgm_agent` binding: a host engine with GPUs, NVSwitches and incidents the test
sets in STATE."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

STATE: dict[str, Any] = {
    "gpus": [(b"GPU-d0", b"00000000:18:00.0"), (b"GPU-d1", b"00000000:2A:00.0")],
    "switches": [0, 1],
    "incidents": [],  # dcgm_structs.Incident items the next health check reports
    "watches": 0,
    "entities": [],
    "connected": None,
    "diag": None,  # what the next RunDiagnostic answers (a DiagResponse), or an exception it raises
    "diag_runs": [],  # (level, gpu ids) of each diagnostic run
    "groups": 0,  # groups alive (created and not deleted)
    "refuse": False,  # the host engine is not there: DcgmHandle raises
    "values": {},  # gpu id -> {field id: its latest value, None: blank}
    "watched": None,  # (field ids, update interval in microseconds) of the watched field group
    "refuse_watch": False,  # the host engine refuses to watch field values
    # the device attributes' other identifiers, by gpu id (bytes, as the binding's c_char arrays read)
    "identity": {
        0: {
            "deviceName": b"NVIDIA H100 80GB HBM3",
            "serial": b"1652022012345",
            "vbios": b"96.00.99.00.01",
            "driverVersion": b"580.95.05",
        }
    },
}


def dcgmGetEntityGroupEntities(handle: Any, group: int, flags: int) -> list[int]:
    return list(STATE["switches"]) if group == 3 else list(range(len(STATE["gpus"])))


def dcgmGetDeviceAttributes(handle: Any, gpu: int) -> Any:
    uuid, bus = STATE["gpus"][gpu]
    return SimpleNamespace(
        identifiers=SimpleNamespace(uuid=uuid, pciBusId=bus, **STATE["identity"].get(gpu, {}))
    )
