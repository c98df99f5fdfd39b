"""The DCGM GPU backend: health watches of a standalone DCGM host engine (as the GPU Operator runs it with
`dcgm.enabled=true`, service port 5555), through DCGM's own Python bindings (`pydcgm`, `dcgm_structs`,
`dcgm_fields`, `dcgm_agent`), found on the node under `/usr/local/dcgm/bindings/python3` or the
directory in FAULTLINE_DCGM_BINDINGS.

Each poll runs one health check of a group holding every GPU (and every NVSwitch DCGM knows). An incident
becomes a health field `dcgm_<system>_<error code>` on its GPU, valued 1 for a warning and 2 for a
failure (NVSwitch incidents are node fields `dcgm_<system>_s<switch>_<error code>`); a field reported
once and absent from a later check is reported 0, which resolves it. The `dcgm` pack maps systems and
severities to codes and actions. XIDs reach the agent through the kernel log, so `wait_events` only
waits.

Each poll also reads the latest values of a field group the host engine watches (VALUES): the error
counters and the temperature under the names the NVML backend gives them, for the health samples.
DCGM's health watches already judge these counters (its pcie, nvlink and mem incidents), so they are
`sample_only`: they make no event of their own, and one problem is not reported twice. A value DCGM
has not got (blank, or a field this GPU or DCGM version lacks) is left out, never read as 0.

`diagnose` (preflight) runs DCGM's diagnostics at a level (1-4, as `dcgmi diag -r`) on some GPUs only, in
a group of their own: the GPUs a pod was given, never another pod's. It reads the response shape of
DCGM 4 (`c_dcgmDiagResponse_v11`/`v12`: tests, each with its result and the indices of its errors).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from faultline import bounds
from faultline.errors import ConfigError
from patterns.templates import pci_bus
from sources.gpu import GpuDevice, GpuEvent, GpuInfo

BINDINGS = Path("/usr/local/dcgm/bindings/python3")
# DCGM_HEALTH_WATCH_* bit -> the system's name in field names (ConnectX only where the bindings have it)
SYSTEMS = {
    "PCIE": "pcie", "NVLINK": "nvlink", "PMU": "pmu", "MCU": "mcu", "MEM": "mem", "SM": "sm",
    "INFOROM": "inforom", "THERMAL": "thermal", "POWER": "power", "DRIVER": "driver",
    "NVSWITCH_NONFATAL": "nvswitch_nonfatal", "NVSWITCH_FATAL": "nvswitch_fatal", "CONNECTX": "connectx",
}  # fmt: skip
NODE = -1  # fields of entities that are not GPUs (NVSwitches, ConnectX)
# health field -> the DCGM field read as its value (names as the NVML backend's; sources.gpu)
VALUES = {
    "ecc_sbe_volatile": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "retired_pages_sbe": "DCGM_FI_DEV_RETIRED_SBE",
    "remapped_rows_correctable": "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "nvlink_crc": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "nvlink_replay": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "nvlink_recovery": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "pcie_replay": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "temperature": "DCGM_FI_DEV_GPU_TEMP",
}
VALUES_UPDATE_US = 5_000_000  # how often the host engine refreshes them (microseconds, as DCGM takes it)
VALUES_KEEP_S = 60.0  # how long it keeps them (seconds): only the latest is read

log = logging.getLogger(__name__)


def load_bindings(directory: Path | None = None) -> dict[str, ModuleType]:
    where = directory or Path(os.environ.get("FAULTLINE_DCGM_BINDINGS", str(BINDINGS)))
    if where.is_dir() and str(where) not in sys.path:
        sys.path.append(str(where))
    try:
        return {name: importlib.import_module(name) for name in ("pydcgm", "dcgm_structs", "dcgm_fields",
                                                                 "dcgm_agent")}  # fmt: skip
    except ImportError as exc:
        raise ConfigError(
            f"the DCGM backend needs DCGM's Python bindings ({exc.name} not found in {where} or on the path)"
        ) from exc


class DcgmBackend:
    # calls go to the host engine, another process: their failures and hangs are the monitor's health,
    # never a node fault by themselves (sources.gpu)
    driver_in_process = False
    sample_only = frozenset(VALUES)  # judged by DCGM's own health watches: samples only (see above)

    def __init__(self, host: str = "localhost:5555", bindings: dict[str, ModuleType] | None = None) -> None:
        b = bindings or load_bindings()
        self.pydcgm, self.structs, self.fields, self.agent = (
            b["pydcgm"], b["dcgm_structs"], b["dcgm_fields"], b["dcgm_agent"]
        )  # fmt: skip
        s = self.structs
        self.handle = self.pydcgm.DcgmHandle(ipAddress=host, opMode=s.DCGM_OPERATION_MODE_AUTO)
        self.group = self.pydcgm.DcgmGroup(self.handle, groupName="faultline", groupType=s.DCGM_GROUP_DEFAULT)
        switches = self.agent.dcgmGetEntityGroupEntities(self.handle.handle, self.fields.DCGM_FE_SWITCH, 0)
        for switch in switches:
            self.group.AddEntity(self.fields.DCGM_FE_SWITCH, switch)
        self.bits = {
            getattr(s, f"DCGM_HEALTH_WATCH_{name}"): system
            for name, system in SYSTEMS.items()
            if hasattr(s, f"DCGM_HEALTH_WATCH_{name}")
        }
        mask = 0
        for bit in self.bits:
            mask |= bit
        self.group.health.Set(mask)
        self._devices = []
        self._models: dict[int, str] = {}
        self._identity: dict[int, tuple[str, ...]] = {}  # serial, VBIOS, driver (the device attributes)
        for gpu_id in self.group.GetGpuIds():
            attrs = self.agent.dcgmGetDeviceAttributes(self.handle.handle, gpu_id)
            ident = attrs.identifiers
            self._devices.append(GpuDevice(int(gpu_id), _text(ident.uuid), pci_bus(_text(ident.pciBusId))))
            self._models[int(gpu_id)] = _text(getattr(ident, "deviceName", ""))
            self._identity[int(gpu_id)] = tuple(
                _text(getattr(ident, f, "")) for f in ("serial", "vbios", "driverVersion")
            )
        self._index = {d.index: d.index for d in self._devices}
        self._seen: dict[int, set[str]] = {}
        self._closed = threading.Event()
        self._values = self._watch_values()

    def _watch_values(self) -> tuple[Any, dict[int, str]] | None:
        """The field group of VALUES these bindings know, watched by the host engine, with each field id's
        name; None where the host engine refuses it (the health watches go on; samples then carry the
        incidents' fields only)."""
        ids = {int(getattr(self.fields, name)): field for field, name in VALUES.items()
               if hasattr(self.fields, name)}  # fmt: skip
        if not ids:
            return None
        try:
            group = self.pydcgm.DcgmFieldGroup(self.handle, name="faultline-samples", fieldIds=list(ids))
            self.group.samples.WatchFields(group, VALUES_UPDATE_US, VALUES_KEEP_S, 0)
        except Exception as exc:  # noqa: BLE001 - DCGM's bindings raise their own classes
            log.warning("DCGM field values not watched (health samples carry no counters): %s", exc)
            return None
        return group, ids

    def _read_values(self, out: dict[int, dict[str, int]]) -> None:
        """The latest VALUES of each GPU into its fields (blank values left out)."""
        if self._values is None:
            return
        group, ids = self._values
        latest = self.group.samples.GetLatest_v2(group).values.get(self.fields.DCGM_FE_GPU, {})
        for entity, series in latest.items():
            fields = out.get(int(entity))
            if fields is None:
                continue
            for field_id, values in series.items():
                name = ids.get(int(field_id))
                if name is None or not len(values):
                    continue
                value = values[-1]
                if not value.isBlank and isinstance(value.value, int | float) and math.isfinite(value.value):
                    fields[name] = int(value.value)

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def wait_events(self, timeout: float) -> list[GpuEvent]:
        self._closed.wait(timeout)  # XIDs come from the kernel log; health comes from read_fields
        return []

    def read_fields(self) -> dict[int, dict[str, int]]:
        s, f = self.structs, self.fields
        response = self.group.health.Check()
        out: dict[int, dict[str, int]] = {d.index: {} for d in self._devices}
        out[NODE] = {}
        for i in range(int(response.incidentCount)):
            incident = response.incidents[i]
            severity = {s.DCGM_HEALTH_RESULT_WARN: 1, s.DCGM_HEALTH_RESULT_FAIL: 2}.get(int(incident.health))
            system = self.bits.get(int(incident.system))
            if severity is None or system is None:
                continue
            group, entity = int(incident.entityInfo.entityGroupId), int(incident.entityInfo.entityId)
            code = int(incident.error.code)
            if group == f.DCGM_FE_GPU and entity in out:
                name, index = f"dcgm_{system}_{code}", entity
            else:
                name, index = f"dcgm_{system}_s{entity}_{code}", NODE
            out[index][name] = max(severity, out[index].get(name, 0))
        for index, fields in out.items():  # what was reported and is gone passed again
            seen = self._seen.setdefault(index, set())
            seen.update(fields)
            for name in seen - fields.keys():
                fields[name] = 0
        self._read_values(out)  # after the incidents' passing: a value left out is not a 0
        return out

    def inventory(self) -> dict[int, GpuInfo]:
        """The model, serial, VBIOS and driver from the device attributes; links are not read through DCGM
        (0: unknown)."""
        out = {}
        for d in self._devices:
            serial, vbios, driver = self._identity.get(d.index, ("", "", ""))
            out[d.index] = GpuInfo(
                model=self._models.get(d.index, ""), serial=serial, vbios=vbios, driver=driver
            )
        return out

    def resume(self, position: int) -> None:
        """Live hardware: nothing to replay."""

    def position(self) -> int | None:
        return None  # not replayable

    def close(self) -> None:
        self._closed.set()
        try:
            del self.group
        finally:
            self.handle.Shutdown()


DIAG_LEVELS = {
    1: "DCGM_DIAG_LVL_SHORT",
    2: "DCGM_DIAG_LVL_MED",
    3: "DCGM_DIAG_LVL_LONG",
    4: "DCGM_DIAG_LVL_XLONG",
}


@dataclass(frozen=True)
class DiagFailure:
    test: str  # the diagnostic's test name, e.g. "memory"
    uuid: str  # the GPU it failed on ("" : not one GPU's)
    message: str


@dataclass(frozen=True)
class Diagnosis:
    failures: list[DiagFailure]
    note: str = ""  # why nothing could be concluded (no host engine, unsupported answer), for the log


def diagnose(
    host: str, level: int, uuids: list[str], bindings: dict[str, ModuleType] | None = None
) -> Diagnosis:
    """DCGM diagnostics at `level` on the GPUs with these UUIDs. No host engine answering, a GPU DCGM does
    not know, a diagnostic that cannot run (another one running) or an answer of an unknown shape
    conclude nothing (a note): only a test that ran and failed is a failure."""
    if level not in DIAG_LEVELS:
        raise ConfigError(f"DCGM diagnostic level {level}: expected 1-4 (as dcgmi diag -r)")
    b = bindings or load_bindings()
    pydcgm, s, f, agent = b["pydcgm"], b["dcgm_structs"], b["dcgm_fields"], b["dcgm_agent"]
    try:
        handle = pydcgm.DcgmHandle(ipAddress=host, opMode=s.DCGM_OPERATION_MODE_AUTO)
    except Exception as exc:  # noqa: BLE001 - DCGM's bindings raise their own classes for "not there"
        return Diagnosis([], f"no DCGM host engine at {host}: {exc}")
    try:
        known = {}
        for gpu_id in agent.dcgmGetEntityGroupEntities(handle.handle, f.DCGM_FE_GPU, 0):
            attrs = agent.dcgmGetDeviceAttributes(handle.handle, gpu_id)
            known[_text(attrs.identifiers.uuid)] = int(gpu_id)
        missing = [u for u in uuids if u not in known]
        if missing or not uuids:
            return Diagnosis([], f"DCGM at {host} does not know the GPUs {missing or uuids}")
        group = pydcgm.DcgmGroup(handle, groupName=f"faultline-preflight-{os.getpid()}",
                                 groupType=s.DCGM_GROUP_EMPTY)  # fmt: skip
        try:
            for uuid in uuids:
                group.AddGpu(known[uuid])
            try:
                response = group.action.RunDiagnostic(getattr(s, DIAG_LEVELS[level]))
            except Exception as exc:  # noqa: BLE001 - e.g. a diagnostic already running: nothing concluded
                return Diagnosis([], f"DCGM diagnostics did not run: {exc}")
        finally:
            group.Delete()
        by_id = {gpu_id: uuid for uuid, gpu_id in known.items()}
        return _failures(response, s, by_id, f.DCGM_FE_GPU)
    finally:
        handle.Shutdown()


def _failures(response: Any, s: ModuleType, by_id: dict[int, str], gpu_group: int) -> Diagnosis:
    if not hasattr(response, "numTests"):
        return Diagnosis(
            [], f"DCGM answered a diagnostic response of an unsupported shape ({type(response).__name__})"
        )
    out = []
    for i in range(int(response.numTests)):
        test = response.tests[i]
        if int(test.result) != s.DCGM_DIAG_RESULT_FAIL:
            continue
        name = _text(test.name)
        errors = [response.errors[int(j)] for j in list(test.errorIndices)[: int(test.numErrors)]]
        if not errors:
            out.append(DiagFailure(name, "", "failed"))
        for error in errors:
            gpu = (
                by_id.get(int(error.entity.entityId), "")
                if int(error.entity.entityGroupId) == gpu_group
                else ""
            )
            said = " ".join(_text(error.msg).split())
            out.append(DiagFailure(name, gpu, bounds.clip(said, bounds.ERROR_TEXT)))
    return Diagnosis(out)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
