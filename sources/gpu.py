"""The one small interface every GPU backend implements (NVML, DCGM, the simulator), and how its events
become observations the pattern packs classify.

XID events are rendered as the line the NVIDIA driver itself logs for them, so an XID seen through NVML
is classified by exactly the same XID catalogue as one read from the kernel log.

Health fields (ECC, remapped rows, throttling, NVLink, ...) are polled with `read_fields`. Only changes
become events: a state field (`ecc_dbe_volatile=2`, `thermal_slowdown=1`) when its value changes, a
cumulative counter (`pcie_replay`) by how much it rose; a gauge (`temperature`, in degrees C) never
does. With the agent's `health_samples`, a read also becomes, every so often, one sample per GPU
(`samples`): every field it read, as numbers, for the cluster analyzer's anomaly scores. Fields a
backend names in `sample_only` (DCGM's counters, which its own health watches judge) go into samples
only. `MonitorWatch` turns a backend call that fails
or hangs into monitor-health events: the monitor is unhealthy (`GpuMonitorHealthy` False), which is not
a GPU fault. Only where the backend's calls are the node's own driver calls (NVML, in the agent's
process: `driver_in_process`) does a call that stays hung for longer than a configured time become a
node fault (a hung driver). DCGM's calls go to its host engine, a separate process that can be down,
restarting or being upgraded: whatever happens to them stays the monitor's health, and a hung driver
under DCGM shows in the kernel log instead (XIDs, "fallen off the bus", NVRM timeouts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from faultline import bounds


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    pci: str  # bus id, dddd:bb:dd


@dataclass(frozen=True)
class GpuEvent:
    """Something a backend saw happen: `kind` is xid, lost (fallen off the bus), healthy (the backend
    sees the GPU healthy again: resolves all its faults) or repaired (the GPU read healthy after a
    repair the janitor verified: `name` is the step, GPU_RESET or REBOOT; see `sources.repairs`)."""

    ts: float
    gpu: int  # -1: the node (monitor events, node-wide incidents)
    kind: str  # xid | lost | healthy | repaired | field | counter | monitor | sample
    value: int = 0
    position: int | None = None  # where a replayable backend resumes after this event
    name: str = ""  # the field or counter (kind field/counter); what failed (kind monitor)
    fields: tuple[tuple[str, int], ...] = ()  # kind sample: the GPU's fields as read, by name


@dataclass(frozen=True)
class GpuInfo:
    """What a GPU is and how it is attached, read once (preflight, and the agent's record of its GPUs): the
    model's name, the PCIe link's current and maximum width (lanes) and generation, the NVLinks that exist,
    active and not, and its serial number, VBIOS and driver versions. 0 (-1 for the links, "" for the
    identity) where the backend cannot tell: no evidence either way."""

    model: str = ""
    pcie_width: int = 0
    pcie_width_max: int = 0
    pcie_gen: int = 0
    pcie_gen_max: int = 0
    nvlink_active: int = -1
    nvlink_inactive: int = -1
    # the GPU's identity, for reports and RMA bundles ("" where the backend cannot tell)
    serial: str = ""
    vbios: str = ""
    driver: str = ""


class GpuBackend(Protocol):
    def devices(self) -> list[GpuDevice]: ...

    def wait_events(self, timeout: float) -> list[GpuEvent]:
        """Block up to `timeout` seconds for events (call from a thread of its own)."""
        ...

    def read_fields(self) -> dict[int, dict[str, int]]:
        """Current health fields by GPU index (call from a thread of its own: a driver call may hang).
        Names in COUNTERS are cumulative, those in GAUGES measurements (`temperature`, degrees C); the
        others are states whose non-zero values are abnormal."""
        ...

    def inventory(self) -> dict[int, GpuInfo]:
        """Model and links of each GPU by index (call from a thread of its own, like `read_fields`)."""
        ...

    def resume(self, position: int) -> None:
        """Continue after the event that carried `position` (a no-op for live hardware)."""
        ...

    def position(self) -> int | None:
        """Where `resume` would continue from now: a replayable backend's read position (the simulator's
        control file offset), None for live hardware. A snapshot taken before any event carries it, so
        an agent killed before its first event replays what came after its start."""
        ...

    def close(self) -> None: ...


COUNTERS = frozenset(
    {"pcie_replay", "nvlink_replay", "nvlink_recovery", "nvlink_crc", "ecc_sbe_volatile", "ecc_sbe_aggregate"}
)
# Measurements that are neither a state nor a counter: they make no event of their own (a temperature
# follows the workload), only the health samples carry them
GAUGES = frozenset({"temperature"})
# What a GPU must read after a reset or reboot to count as repaired: reachable, no uncorrectable ECC
# error since the reset (the volatile count restarts at the reset), no row remapping or page retirement
# still waiting for one, spare rows left, every NVLink that was up at the start up, not at its shutdown
# temperature. Fields a backend does not report are not evidence either way; a GPU missing from the
# read (not read at all) is not healthy: no evidence.
MUST_BE_ZERO_AFTER_REPAIR = ("lost", "ecc_dbe_volatile", "remapped_rows_pending", "retired_pages_pending",
                             "remapped_rows_failure", "nvlink_down", "thermal_shutdown")  # fmt: skip
REPAIR_STEPS = {"GPU_RESET": "a GPU reset", "REBOOT": "a reboot"}


def repair_verdict(fields: dict[str, int] | None) -> str | None:
    """None when a GPU's fresh read shows it repaired; otherwise why not (for the log)."""
    if fields is None:
        return "not read"
    bad = [f"{name}={fields[name]}" for name in MUST_BE_ZERO_AFTER_REPAIR if fields.get(name, 0) != 0]
    return ", ".join(bad) if bad else None


MONITOR_OK, MONITOR_UNHEALTHY, MONITOR_UNRESPONSIVE = 0, 1, 2


def field_changes(
    previous: dict[int, dict[str, int]], current: dict[int, dict[str, int]], ts: float,
    quiet: frozenset[str] = GAUGES,
) -> list[GpuEvent]:  # fmt: skip
    """Events for what changed between two reads. On the first read (no previous value) only abnormal
    states are reported; counters only ever report a rise (a counter that went down was reset). Fields
    in `quiet` (the gauges, and a backend's `sample_only`) report nothing."""
    out = []
    for index, fields in current.items():
        before = previous.get(index, {})
        for name, value in fields.items():
            old = before.get(name)
            if name in quiet:
                continue
            if name in COUNTERS:
                if old is not None and value > old:
                    out.append(GpuEvent(ts, index, "counter", value - old, name=name))
            elif value != (0 if old is None else old):
                out.append(GpuEvent(ts, index, "field", value, name=name))
    return out


def samples(current: dict[int, dict[str, int]], ts: float) -> list[GpuEvent]:
    """One health sample per GPU of a read: every field read, by name. A GPU read as lost, or with no
    field (a backend that reads none of it), has nothing to sample; node fields (index -1) are no GPU's."""
    return [
        GpuEvent(ts, index, "sample", fields=tuple(sorted(fields.items())))
        for index, fields in sorted(current.items())
        if index >= 0 and fields and not fields.get("lost")
    ]


class MonitorWatch:
    """The monitor's own health from its polls: unhealthy once a call failed or has been running for
    `hung_after` seconds; unresponsive (a node fault) once unhealthy for `unresponsive_after` seconds,
    only when `escalates` (the backend's calls are the driver's own); healthy again at the next call
    that succeeds. Emits only transitions."""

    def __init__(self, hung_after: float, unresponsive_after: float, *, escalates: bool = True) -> None:
        self.hung_after = hung_after
        self.unresponsive_after = unresponsive_after
        self.escalates = escalates
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
        hung_long = self.escalates and now - self.since >= self.unresponsive_after
        state = MONITOR_UNRESPONSIVE if hung_long else MONITOR_UNHEALTHY
        return self._to(stamp, state, reason)

    def _to(self, ts: float, state: int, reason: str) -> list[GpuEvent]:
        if state == self.state:
            return []
        self.state = state
        return [GpuEvent(ts, -1, "monitor", state, name=bounds.clip(reason, bounds.EXCERPT))]


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
    if event.kind == "repaired" and event.name in REPAIR_STEPS:
        return f"GPU {device.pci} reads healthy after {REPAIR_STEPS[event.name]} (GPU backend)"
    if event.kind == "healthy":
        return f"GPU {device.pci} reports healthy (GPU backend)"
    return None
