"""The NVML backend through the real pynvml wrappers, with a fake NVML library underneath (no GPU here):
the ctypes plumbing, XID events, timeouts and a lost GPU."""

from __future__ import annotations

import ctypes
import queue
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from sources.nvml import NvmlBackend

GPUS = [("GPU-aaaa", b"00000000:18:00.0"), ("GPU-bbbb", b"00000000:3B:00.0")]


class _Fn:
    """What ctypes would return for a symbol: a callable with a settable `restype`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.restype: Any = None

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class FakeNvmlLib:
    def __init__(self) -> None:
        self.devices = [pynvml.struct_c_nvmlDevice_t() for _ in GPUS]
        self.event_set = pynvml.struct_c_nvmlEventSet_t()
        self.events: queue.Queue[tuple[int, int] | str] = queue.Queue()
        self.lost: set[int] = set()
        self.registered: list[int] = []
        self.inits = self.event_sets = 0  # what the process holds open in the driver
        # health state per GPU; GPU 1 has no NVLink (PCIe card) and no row remapper (answers NotSupported)
        self.ecc = [{(1, 0): 3, (1, 1): 3, (0, 0): 7}, {(1, 0): 0, (1, 1): 0, (0, 0): 0}]
        self.remap: list[tuple[int, int, int, int] | None] = [(2, 0, 0, 0), None]
        self.temperature = [40, 40]
        self.reasons = [0, 0]
        self.links = [{0: 1, 1: 1, 2: 1, 3: 1}, {}]
        self.link_errors = [0, 0]
        self.replay = [5, 0]
        self.hang: Any = None  # a threading.Event the next field read blocks on

    def __getattr__(self, name: str) -> _Fn:
        if name.startswith("_"):
            raise AttributeError(name)  # a symbol this library lacks (NVML: FunctionNotFound)
        return _Fn(getattr(self, f"_{name}"))

    def _index(self, handle: Any) -> int:
        address = ctypes.addressof(handle.contents)
        return next(i for i, d in enumerate(self.devices) if ctypes.addressof(d) == address)

    def _nvmlInitWithFlags(self, flags: int) -> int:
        self.inits += 1  # the driver keeps its device nodes open while any init is not shut down
        return 0

    def _nvmlShutdown(self) -> int:
        self.inits -= 1
        return 0

    def _nvmlErrorString(self, code: int) -> bytes:
        return f"fake NVML error {code}".encode()

    def _nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        ref._obj.value = len(GPUS)
        return 0

    def _nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        ref._obj.contents = self.devices[index.value]
        return 0

    def _nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = GPUS[self._index(handle)][0].encode()
        return 0

    def _nvmlDeviceGetPciInfo_v3(self, handle: Any, ref: Any) -> int:
        ref._obj.busId = GPUS[self._index(handle)][1]
        return 0

    def _nvmlEventSetCreate(self, ref: Any) -> int:
        ref._obj.contents = self.event_set
        self.event_sets += 1
        return 0

    def _nvmlEventSetFree(self, es: Any) -> int:
        self.event_sets -= 1
        return 0

    def _nvmlDeviceRegisterEvents(self, handle: Any, types: Any, es: Any) -> int:
        self.registered.append(self._index(handle))
        return 0

    def _nvmlEventSetWait_v2(self, es: Any, ref: Any, timeout_ms: Any) -> int:
        try:
            item = self.events.get(timeout=timeout_ms.value / 1000)
        except queue.Empty:
            return pynvml.NVML_ERROR_TIMEOUT
        if item == "lost":
            return pynvml.NVML_ERROR_GPU_IS_LOST
        assert isinstance(item, tuple)
        gpu, xid = item
        ref._obj.device = ctypes.pointer(self.devices[gpu])
        ref._obj.eventType = pynvml.nvmlEventTypeXidCriticalError
        ref._obj.eventData = xid
        return 0

    def _nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, ref: Any) -> int:
        if self._index(handle) in self.lost:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        ref._obj.value = self.temperature[self._index(handle)]
        return 0

    def _nvmlDeviceGetTotalEccErrors(self, handle: Any, etype: Any, ctype: Any, ref: Any) -> int:
        gpu = self._index(handle)
        if gpu in self.lost:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        if self.hang is not None:
            self.hang.wait()
        ref._obj.value = self.ecc[gpu][(_v(etype), _v(ctype))]
        return 0

    def _nvmlDeviceGetRemappedRows(self, handle: Any, *refs: Any) -> int:
        rows = self.remap[self._index(handle)]
        if rows is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        for ref, value in zip(refs, rows, strict=True):
            ref._obj.value = value
        return 0

    def _nvmlDeviceGetTemperatureThreshold(self, handle: Any, which: Any, ref: Any) -> int:
        ref._obj.value = {pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 87,
                          pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92}[_v(which)]  # fmt: skip
        return 0

    def _nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, ref: Any) -> int:
        ref._obj.value = self.reasons[self._index(handle)]
        return 0

    def _nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, ref: Any) -> int:
        links = self.links[self._index(handle)]
        if _v(link) not in links:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        ref._obj.value = links[_v(link)]
        return 0

    def _nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: Any, counter: Any, ref: Any) -> int:
        gpu = self._index(handle)
        ref._obj.value = self.link_errors[gpu] if _v(counter) == pynvml.NVML_NVLINK_ERROR_DL_RECOVERY else 0
        return 0

    def _nvmlDeviceGetPcieReplayCounter(self, handle: Any, ref: Any) -> int:
        ref._obj.value = self.replay[self._index(handle)]
        return 0


def _v(value: Any) -> int:
    return int(getattr(value, "value", value))


@pytest.fixture
def fake() -> Iterator[FakeNvmlLib]:
    lib = FakeNvmlLib()
    saved = pynvml.nvmlLib
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    yield lib
    pynvml.nvmlLib = saved
    pynvml._nvmlGetFunctionPointer_cache.clear()


def test_devices_from_nvml(fake: FakeNvmlLib) -> None:
    backend = NvmlBackend(pynvml)
    assert [(d.index, d.uuid, d.pci) for d in backend.devices()] == [
        (0, "GPU-aaaa", "0000:18:00"),
        (1, "GPU-bbbb", "0000:3b:00"),
    ]
    assert fake.registered == [0, 1]
    backend.close()


def test_xid_event_timeout_and_lost_gpu(fake: FakeNvmlLib) -> None:
    backend = NvmlBackend(pynvml)
    assert backend.wait_events(0.01) == []  # NVML timed out: nothing happened
    fake.events.put((1, 79))
    (event,) = backend.wait_events(1.0)
    assert (event.gpu, event.kind, event.value) == (1, "xid", 79)
    fake.lost.add(0)
    fake.events.put("lost")
    (lost,) = backend.wait_events(1.0)
    assert (lost.gpu, lost.kind) == (0, "lost")
    fake.events.put("lost")
    assert backend.wait_events(1.0) == []  # reported once while it stays lost
    backend.close()


def test_health_fields_read_through_nvml(fake: FakeNvmlLib) -> None:
    backend = NvmlBackend(pynvml)
    first = backend.read_fields()
    assert first[0] == {
        "ecc_dbe_volatile": 3, "ecc_dbe_aggregate": 3, "ecc_sbe_volatile": 7,
        "remapped_rows_correctable": 2, "remapped_rows_uncorrectable": 0, "remapped_rows_pending": 0,
        "remapped_rows_failure": 0, "temperature": 40, "thermal_slowdown": 0, "thermal_shutdown": 0,
        "throttle_hw_slowdown": 0, "throttle_hw_thermal": 0, "throttle_sw_thermal": 0, "throttle_power_brake": 0,
        "nvlink_down": 0, "nvlink_replay": 0, "nvlink_recovery": 0, "nvlink_crc": 0, "pcie_replay": 5,
    }  # fmt: skip
    # retired pages are not in this fake library: left out, not zero; GPU 1 has no NVLink, no remapper
    assert "nvlink_down" not in first[1] and "remapped_rows_pending" not in first[1]
    fake.temperature[0] = 88
    fake.reasons[0] = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    fake.links[0][2] = 0
    fake.link_errors[0] = 2  # per link: 4 links
    fake.lost.add(1)
    second = backend.read_fields()
    assert second[0]["temperature"] == 88
    assert (second[0]["thermal_slowdown"], second[0]["thermal_shutdown"]) == (1, 0)
    assert (second[0]["throttle_hw_thermal"], second[0]["throttle_hw_slowdown"]) == (1, 0)
    assert (second[0]["nvlink_down"], second[0]["nvlink_recovery"]) == (1, 8)
    assert second[1] == {"lost": 1}
    backend.close()


def test_closing_the_backend_leaves_nothing_open_in_the_driver(fake: FakeNvmlLib) -> None:
    """What the agent holds while it runs (one NVML init, one event set on every GPU) it gives back when
    it stops: a driver upgrade or a GPU reset finds no handle of faultline's once its pod is gone (the
    agent leaves the node for both: the chart's step-aside affinity)."""
    backend = NvmlBackend(pynvml)
    assert (fake.inits, fake.event_sets) == (1, 1)
    backend.read_fields()
    backend.close()
    assert (fake.inits, fake.event_sets) == (0, 0)
