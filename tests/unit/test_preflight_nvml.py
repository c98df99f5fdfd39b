"""The NVML backend's inventory (what preflight reads of each GPU: model, PCIe link, NVLinks that exist and
are inactive) through the real pynvml wrappers over the fake NVML library of test_nvml.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from sources.gpu import GpuInfo
from sources.nvml import NvmlBackend
from tests.unit.test_nvml import FakeNvmlLib


class InventoryLib(FakeNvmlLib):
    def __init__(self) -> None:
        super().__init__()
        self.width = [16, 8]
        self.gen = [4, 5]

    def _nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = [b"NVIDIA H100 80GB HBM3", b"NVIDIA L40S"][self._index(handle)]
        return 0

    def _nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, ref: Any) -> int:
        ref._obj.value = self.width[self._index(handle)]
        return 0

    def _nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, ref: Any) -> int:
        ref._obj.value = 16
        return 0

    def _nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, ref: Any) -> int:
        ref._obj.value = self.gen[self._index(handle)]
        return 0

    def _nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, ref: Any) -> int:
        ref._obj.value = 5
        return 0


@pytest.fixture
def fake() -> Iterator[InventoryLib]:
    lib = InventoryLib()
    saved = pynvml.nvmlLib
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    yield lib
    pynvml.nvmlLib = saved
    pynvml._nvmlGetFunctionPointer_cache.clear()


def test_inventory_through_nvml(fake: InventoryLib) -> None:
    backend = NvmlBackend(pynvml)
    fake.links[0][2] = 0  # link 2 exists and is inactive; GPU 1 has no NVLink (a PCIe card)
    assert backend.inventory() == {
        0: GpuInfo("NVIDIA H100 80GB HBM3", 16, 16, 4, 5, nvlink_active=3, nvlink_inactive=1),
        1: GpuInfo("NVIDIA L40S", 8, 16, 5, 5, nvlink_active=-1, nvlink_inactive=-1),
    }
    backend.close()


class IdentityLib(InventoryLib):
    def _nvmlDeviceGetSerial(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = [b"1652022012345", b"1321120099887"][self._index(handle)]
        return 0

    def _nvmlDeviceGetVbiosVersion(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = b"96.00.99.00.01"
        return 0

    def _nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = b"580.95.05"
        return 0


def test_identity_through_nvml() -> None:
    """Serial, VBIOS and driver (what the agent records of each GPU); a library without them gives ""."""
    lib = IdentityLib()
    saved = pynvml.nvmlLib
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        backend = NvmlBackend(pynvml)
        got = {i: (g.serial, g.vbios, g.driver) for i, g in backend.inventory().items()}
        backend.close()
    finally:
        pynvml.nvmlLib = saved
        pynvml._nvmlGetFunctionPointer_cache.clear()
    assert got == {0: ("1652022012345", "96.00.99.00.01", "580.95.05"),
                   1: ("1321120099887", "96.00.99.00.01", "580.95.05")}  # fmt: skip


def test_identity_missing_from_an_older_library(fake: InventoryLib) -> None:
    backend = NvmlBackend(pynvml)
    assert {(g.serial, g.vbios, g.driver) for g in backend.inventory().values()} == {("", "", "")}
    backend.close()
