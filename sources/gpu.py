"""The one small interface every GPU backend implements (NVML, DCGM, the simulator), and how its events
become observations the pattern packs classify.

XID events are rendered as the line the NVIDIA driver itself logs for them, so an XID seen through NVML
is classified by exactly the same XID catalogue as one read from the kernel log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    pci: str  # bus id, dddd:bb:dd


@dataclass(frozen=True)
class GpuEvent:
    """Something a backend saw happen: `kind` is xid, lost (fallen off the bus), reset (a GPU reset
    completed) or healthy (the backend sees the GPU healthy again: resolves all its faults)."""

    ts: float
    gpu: int
    kind: str
    value: int = 0
    position: int | None = None  # where a replayable backend resumes after this event


class GpuBackend(Protocol):
    def devices(self) -> list[GpuDevice]: ...

    def wait_events(self, timeout: float) -> list[GpuEvent]:
        """Block up to `timeout` seconds for events (call from a thread of its own)."""
        ...

    def resume(self, position: int) -> None:
        """Continue after the event that carried `position` (a no-op for live hardware)."""
        ...

    def close(self) -> None: ...


def message(event: GpuEvent, device: GpuDevice) -> str | None:
    """The driver-format line for an event, for the pattern packs; None for kinds packs do not read."""
    if event.kind == "xid":
        return (
            f"NVRM: Xid (PCI:{device.pci}): {event.value}, pid=0, name=faultline, reported by the GPU backend"
        )
    if event.kind == "lost":
        return f"NVRM: GPU {device.pci}.0: GPU has fallen off the bus."
    if event.kind == "reset":
        domain, bus, dev = device.pci.split(":")
        return f"GPU 0000{domain}:{bus.upper()}:{dev.upper()}.0 was successfully reset."
    if event.kind == "healthy":
        return f"GPU {device.pci} reports healthy (GPU backend)"
    return None
