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
