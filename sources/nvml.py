"""The NVML GPU backend (`nvidia-ml-py`, module `pynvml`): devices, and critical XID events waited on
with a timeout. A GPU that answers "GPU is lost" is reported as fallen off the bus.

`wait_events` blocks in NVML (ctypes releases the GIL): call it from a thread of its own, as the node
dataflow's GPU source does.
"""

from __future__ import annotations

import ctypes
import time
from types import ModuleType
from typing import Any

from faultline.errors import ConfigError
from patterns.templates import pci_bus
from sources.gpu import GpuDevice, GpuEvent


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

    def close(self) -> None:
        n = self.nvml
        try:
            n.nvmlEventSetFree(self.event_set)
        finally:
            n.nvmlShutdown()
