"""The NVML GPU backend (`nvidia-ml-py`, module `pynvml`): devices, critical XID events waited on
with a timeout, and health fields read on each poll. A GPU that answers "GPU is lost" is reported as
fallen off the bus.

Fields (see `sources.gpu`): `ecc_dbe_volatile`, `ecc_dbe_aggregate`, `ecc_sbe_volatile`,
`remapped_rows_correctable`, `remapped_rows_uncorrectable`, `remapped_rows_pending`,
`remapped_rows_failure`, `retired_pages_dbe`, `retired_pages_sbe`, `retired_pages_pending`,
`temperature` (degrees C, a gauge: it makes no event, only health samples carry it),
`thermal_slowdown` / `thermal_shutdown` (temperature at or above the GPU's own thresholds),
`throttle_hw_slowdown`, `throttle_hw_thermal`, `throttle_sw_thermal`, `throttle_power_brake`,
`nvlink_down` (links that were up and are not), the counters `nvlink_replay`, `nvlink_recovery`,
`nvlink_crc` (summed over links) and `pcie_replay`. A query the GPU or driver does not support is
left out, not reported as zero.

`wait_events` blocks in NVML (ctypes releases the GIL): call it from a thread of its own, as the node
dataflow's GPU source does.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from types import ModuleType
from typing import Any

from faultline.errors import ConfigError
from patterns.templates import pci_bus
from sources.gpu import GpuDevice, GpuEvent, GpuInfo

REMAPPED_ROWS = ("remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
                 "remapped_rows_failure")  # fmt: skip
RETIRED_PAGES = (
    ("retired_pages_dbe", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
    ("retired_pages_sbe", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
)
THROTTLE_REASONS = (("throttle_hw_slowdown", "nvmlClocksEventReasonHwSlowdown"),
                    ("throttle_hw_thermal", "nvmlClocksEventReasonHwThermalSlowdown"),
                    ("throttle_sw_thermal", "nvmlClocksEventReasonSwThermalSlowdown"),
                    ("throttle_power_brake", "nvmlClocksEventReasonHwPowerBrakeSlowdown"))  # fmt: skip


def load_pynvml() -> ModuleType:
    try:
        import pynvml  # noqa: PLC0415 - optional: only nodes with NVIDIA GPUs need it
    except ImportError as exc:
        raise ConfigError("the NVML backend needs nvidia-ml-py: pip install 'faultline[nvml]'") from exc
    module: ModuleType = pynvml
    return module


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class NvmlBackend:
    def __init__(self, nvml: ModuleType | None = None) -> None:
        self.nvml = nvml or load_pynvml()
        n = self.nvml
        n.nvmlInit()
        self.handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
        self._devices = [
            GpuDevice(i, _text(n.nvmlDeviceGetUUID(h)), pci_bus(_text(n.nvmlDeviceGetPciInfo(h).busId)))
            for i, h in enumerate(self.handles)
        ]
        self._index = {_address(h): i for i, h in enumerate(self.handles)}
        self._lost: set[int] = set()
        self._links: dict[int, list[int]] = {}  # NVLinks that exist, by GPU, found on first read
        self._thresholds: dict[int, tuple[int | None, int | None]] = {}
        self.event_set = n.nvmlEventSetCreate()
        for handle in self.handles:
            try:
                n.nvmlDeviceRegisterEvents(handle, n.nvmlEventTypeXidCriticalError, self.event_set)
            except n.NVMLError_NotSupported:
                continue  # this GPU cannot report XIDs through NVML; the kernel log still does

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def wait_events(self, timeout: float) -> list[GpuEvent]:
        n = self.nvml
        try:
            data = n.nvmlEventSetWait_v2(self.event_set, int(timeout * 1000))
        except n.NVMLError_Timeout:
            return []
        except n.NVMLError_GpuIsLost:
            return self._probe_lost()
        if data.eventType & n.nvmlEventTypeXidCriticalError:
            index = self._index.get(_address(data.device))
            if index is not None:
                return [GpuEvent(time.time(), index, "xid", int(data.eventData))]
        return []

    def read_fields(self) -> dict[int, dict[str, int]]:
        out = {}
        for index, handle in enumerate(self.handles):
            fields: dict[str, int] = {}
            try:
                self._read_gpu(index, handle, fields)
            except self.nvml.NVMLError_GpuIsLost:
                fields = {"lost": 1}
            out[index] = fields
        return out

    def _query(self, fields: dict[str, int], name: str, call: Any, *args: Any) -> int | None:
        """One NVML query into `fields[name]` (when `name`); None where this GPU or driver has no answer."""
        n = self.nvml
        try:
            value = int(call(*args))
        except (n.NVMLError_NotSupported, n.NVMLError_FunctionNotFound, n.NVMLError_InvalidArgument,
                n.NVMLError_NoPermission):  # fmt: skip
            return None
        if name:
            fields[name] = value
        return value

    def _read_gpu(self, index: int, h: Any, fields: dict[str, int]) -> None:
        n, q = self.nvml, self._query
        unc, cor = n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_MEMORY_ERROR_TYPE_CORRECTED
        q(fields, "ecc_dbe_volatile", n.nvmlDeviceGetTotalEccErrors, h, unc, n.NVML_VOLATILE_ECC)
        q(fields, "ecc_dbe_aggregate", n.nvmlDeviceGetTotalEccErrors, h, unc, n.NVML_AGGREGATE_ECC)
        q(fields, "ecc_sbe_volatile", n.nvmlDeviceGetTotalEccErrors, h, cor, n.NVML_VOLATILE_ECC)
        try:
            remapped = n.nvmlDeviceGetRemappedRows(h)
            fields.update(zip(REMAPPED_ROWS, (int(v) for v in remapped), strict=True))
        except (n.NVMLError_NotSupported, n.NVMLError_FunctionNotFound):
            pass  # before Ampere: pages are retired instead
        for name, cause in RETIRED_PAGES:
            with contextlib.suppress(n.NVMLError_NotSupported, n.NVMLError_FunctionNotFound):
                fields[name] = len(n.nvmlDeviceGetRetiredPages(h, getattr(n, cause)))
        q(fields, "retired_pages_pending", n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        self._thermal(index, h, fields)
        reasons = q({}, "", n.nvmlDeviceGetCurrentClocksEventReasons, h)
        if reasons is not None:
            for name, bit in THROTTLE_REASONS:
                fields[name] = int(bool(reasons & getattr(n, bit)))
        self._nvlink(index, h, fields)
        q(fields, "pcie_replay", n.nvmlDeviceGetPcieReplayCounter, h)

    def _thermal(self, index: int, h: Any, fields: dict[str, int]) -> None:
        n, q = self.nvml, self._query
        if index not in self._thresholds:
            self._thresholds[index] = (
                q({}, "", n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                q({}, "", n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            )
        slowdown, shutdown = self._thresholds[index]
        temperature = q(fields, "temperature", n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        if temperature is not None and slowdown:
            fields["thermal_slowdown"] = int(temperature >= slowdown)
        if temperature is not None and shutdown:
            fields["thermal_shutdown"] = int(temperature >= shutdown)

    def _nvlink(self, index: int, h: Any, fields: dict[str, int]) -> None:
        n, q = self.nvml, self._query
        if index not in self._links:  # links this GPU has: those that answer and were up at the start
            self._links[index] = [
                link for link in range(n.NVML_NVLINK_MAX_LINKS)
                if q({}, "", n.nvmlDeviceGetNvLinkState, h, link) == n.NVML_FEATURE_ENABLED
            ]  # fmt: skip
        links = self._links[index]
        if not links:
            return  # a PCIe-only GPU: no NVLink evidence either way
        down = sum(1 for link in links if q({}, "", n.nvmlDeviceGetNvLinkState, h, link) == 0)
        fields["nvlink_down"] = down
        for name, counter in (("nvlink_replay", n.NVML_NVLINK_ERROR_DL_REPLAY),
                              ("nvlink_recovery", n.NVML_NVLINK_ERROR_DL_RECOVERY),
                              ("nvlink_crc", n.NVML_NVLINK_ERROR_DL_CRC_FLIT)):  # fmt: skip
            total = 0
            for link in links:
                total += q({}, "", n.nvmlDeviceGetNvLinkErrorCounter, h, link, counter) or 0
            fields[name] = total

    def inventory(self) -> dict[int, GpuInfo]:
        """Name, PCIe link (current and maximum width and generation), the NVLinks that exist but are
        inactive (a link that does not exist answers NotSupported), serial, VBIOS and driver versions. A
        GPU that answers "lost" is left out: `read_fields` reports it."""
        n, q = self.nvml, self._query
        out = {}
        driver = self._text_of(n.nvmlSystemGetDriverVersion)
        for index, h in enumerate(self.handles):
            try:
                try:
                    model = _text(n.nvmlDeviceGetName(h))
                except (n.NVMLError_NotSupported, n.NVMLError_FunctionNotFound):
                    model = ""
                links = [q({}, "", n.nvmlDeviceGetNvLinkState, h, link)
                         for link in range(n.NVML_NVLINK_MAX_LINKS)]  # fmt: skip
                present = [state for state in links if state is not None]
                out[index] = GpuInfo(
                    model=model,
                    serial=self._text_of(n.nvmlDeviceGetSerial, h),
                    vbios=self._text_of(n.nvmlDeviceGetVbiosVersion, h),
                    driver=driver,
                    pcie_width=q({}, "", n.nvmlDeviceGetCurrPcieLinkWidth, h) or 0,
                    pcie_width_max=q({}, "", n.nvmlDeviceGetMaxPcieLinkWidth, h) or 0,
                    pcie_gen=q({}, "", n.nvmlDeviceGetCurrPcieLinkGeneration, h) or 0,
                    pcie_gen_max=q({}, "", n.nvmlDeviceGetMaxPcieLinkGeneration, h) or 0,
                    nvlink_active=sum(1 for state in present if state != 0) if present else -1,
                    nvlink_inactive=sum(1 for state in present if state == 0) if present else -1,
                )
            except n.NVMLError_GpuIsLost:
                continue
        return out

    def _text_of(self, call: Any, *args: Any) -> str:
        """A text the driver reports ("" where it does not: not supported, an older library)."""
        n = self.nvml
        try:
            return _text(call(*args))
        except (n.NVMLError_NotSupported, n.NVMLError_FunctionNotFound, n.NVMLError_NoPermission):
            return ""

    def _probe_lost(self) -> list[GpuEvent]:
        """Which GPUs answer 'lost'; each is reported once until it answers again."""
        n = self.nvml
        events = []
        for i, handle in enumerate(self.handles):
            try:
                n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU)
            except n.NVMLError_GpuIsLost:
                if i not in self._lost:
                    self._lost.add(i)
                    events.append(GpuEvent(time.time(), i, "lost"))
                continue
            except n.NVMLError:
                continue
            self._lost.discard(i)
        return events

    def resume(self, position: int) -> None:
        """Live hardware: events that happened while the agent was down are in the kernel log."""

    def position(self) -> int | None:
        return None  # not replayable

    def close(self) -> None:
        n = self.nvml
        try:
            n.nvmlEventSetFree(self.event_set)
        finally:
            n.nvmlShutdown()
