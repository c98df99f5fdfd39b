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

    def __getattr__(self, name: str) -> _Fn:
        return _Fn(getattr(self, f"_{name}"))

    def _index(self, handle: Any) -> int:
        address = ctypes.addressof(handle.contents)
        return next(i for i, d in enumerate(self.devices) if ctypes.addressof(d) == address)

    def _nvmlInitWithFlags(self, flags: int) -> int:
        return 0

    def _nvmlShutdown(self) -> int:
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
        return 0

    def _nvmlEventSetFree(self, es: Any) -> int:
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
        ref._obj.value = 40
        return 0


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
