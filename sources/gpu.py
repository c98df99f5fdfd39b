"""The one small interface every GPU backend implements (NVML, DCGM, the simulator), and how its events
become observations the pattern packs classify.

XID events are rendered as the line the NVIDIA driver itself logs for them, so an XID seen through NVML
is classified by exactly the same XID catalogue as one read from the kernel log.

Health fields (ECC, remapped rows, throttling, NVLink, ...) are polled with `read_fields`. Only changes
become events: a state field (`ecc_dbe_volatile=2`, `thermal_slowdown=1`) when its value changes, a
cumulative counter (`pcie_replay`) by how much it rose. `MonitorWatch` turns a backend call that fails
or hangs into monitor-health events: the monitor is unhealthy, which is not a GPU fault, until it has
been so for longer than a configured time.
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
    gpu: int  # -1: the node (monitor events, node-wide incidents)
    kind: str  # xid | lost | reset | healthy | field | counter | monitor
    value: int = 0
    position: int | None = None  # where a replayable backend resumes after this event
    name: str = ""  # the field or counter (kind field/counter); what failed (kind monitor)


class GpuBackend(Protocol):
    def devices(self) -> list[GpuDevice]: ...

    def wait_events(self, timeout: float) -> list[GpuEvent]:
        """Block up to `timeout` seconds for events (call from a thread of its own)."""
        ...

    def read_fields(self) -> dict[int, dict[str, int]]:
        """Current health fields by GPU index (call from a thread of its own: a driver call may hang).
        Names in COUNTERS are cumulative; the others are states whose non-zero values are abnormal."""
        ...

    def resume(self, position: int) -> None:
        """Continue after the event that carried `position` (a no-op for live hardware)."""
        ...

    def close(self) -> None: ...


COUNTERS = frozenset(
    {"pcie_replay", "nvlink_replay", "nvlink_recovery", "nvlink_crc", "ecc_sbe_volatile", "ecc_sbe_aggregate"}
)
MONITOR_OK, MONITOR_UNHEALTHY, MONITOR_UNRESPONSIVE = 0, 1, 2


def field_changes(
    previous: dict[int, dict[str, int]], current: dict[int, dict[str, int]], ts: float
) -> list[GpuEvent]:
    """Events for what changed between two reads. On the first read (no previous value) only abnormal
    states are reported; counters only ever report a rise (a counter that went down was reset)."""
    out = []
    for index, fields in current.items():
        before = previous.get(index, {})
        for name, value in fields.items():
            old = before.get(name)
            if name in COUNTERS:
                if old is not None and value > old:
                    out.append(GpuEvent(ts, index, "counter", value - old, name=name))
            elif value != (0 if old is None else old):
                out.append(GpuEvent(ts, index, "field", value, name=name))
    return out


class MonitorWatch:
    """The monitor's own health from its polls: unhealthy once a call failed or has been running for
    `hung_after` seconds; unresponsive (a node fault) once unhealthy for `unresponsive_after` seconds;
    healthy again at the next call that succeeds. Emits only transitions."""

    def __init__(self, hung_after: float, unresponsive_after: float) -> None:
        self.hung_after = hung_after
        self.unresponsive_after = unresponsive_after
        self.state = MONITOR_OK
        self.since: float | None = None

    def observe(
        self, now: float, running_since: float | None, failure: str | None, *, ts: float | None = None
    ) -> list[GpuEvent]:
        """`now` and `running_since` on one (monotonic) clock; `ts` stamps the events (default `now`)."""
        stamp = now if ts is None else ts
        if failure is None and (running_since is None or now - running_since < self.hung_after):
            bad, reason = False, ""
        elif failure is not None:
            bad, reason = True, failure
        else:
            assert running_since is not None
            bad, reason = True, f"a GPU backend call has not returned for {now - running_since:.0f} s"
        if not bad:
            self.since = None
            return self._to(stamp, MONITOR_OK, "")
        if self.since is None:
            self.since = running_since if failure is None and running_since is not None else now
        state = MONITOR_UNRESPONSIVE if now - self.since >= self.unresponsive_after else MONITOR_UNHEALTHY
        return self._to(stamp, state, reason)

    def _to(self, ts: float, state: int, reason: str) -> list[GpuEvent]:
        if state == self.state:
            return []
        self.state = state
        return [GpuEvent(ts, -1, "monitor", state, name=reason[:200])]


def message(event: GpuEvent, device: GpuDevice | None) -> str | None:
    """The line packs read for an event; None for kinds packs do not read."""
    if event.kind == "monitor":
        state = {MONITOR_OK: "healthy", MONITOR_UNHEALTHY: "unhealthy", MONITOR_UNRESPONSIVE: "unresponsive"}
        return f"faultline GPU monitor {state.get(event.value, 'unknown')}: {event.name or 'calls succeed'}"
    if device is None:  # node fields: entities that are not GPUs (a DCGM NVSwitch incident)
        return f"node health {event.name}={event.value}" if event.kind == "field" and event.gpu < 0 else None
    if event.kind == "field" and event.name == "lost":  # a poll found the GPU gone
        return message(GpuEvent(event.ts, event.gpu, "lost"), device) if event.value else None
    if event.kind == "field":
        return f"GPU {device.pci} health {event.name}={event.value}"
    if event.kind == "counter":
        return f"GPU {device.pci} health counter {event.name} +{event.value}"
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
