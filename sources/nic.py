"""NIC health from sysfs: InfiniBand port state and error counters, Ethernet carrier and operstate.

Each poll compares with the previous one and reports *changes* as short messages the `nic` pack
classifies (`nic <port>: link down`, `nic <port>: counter link_downed +2`). Only positive evidence counts:
a device that is absent (a node type without InfiniBand) reports nothing, and the first poll only
records a baseline, except for a port that is already down.
The sysfs root is configurable, so tests use a real directory tree.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from sources import formats
from sources.journal import Entry

IB_COUNTERS = ("link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors")


@dataclass(frozen=True)
class PortState:
    up: bool
    counters: tuple[tuple[str, int], ...] = ()


def _read(path: Path) -> str | None:
    try:  # sysfs writes ASCII; anything else is no evidence, never an exception in the agent's flow
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def read_ports(root: Path) -> dict[str, PortState]:
    """Every IB port (`mlx5_0/1`) and Ethernet interface (`eth0`) under `root` (usually /sys)."""
    ports: dict[str, PortState] = {}
    for port in sorted((root / "class" / "infiniband").glob("*/ports/*")):
        state = _read(port / "state") or ""  # e.g. "4: ACTIVE"
        counters = []
        for name in IB_COUNTERS:
            value = formats.uint(_read(port / "counters" / name) or "")  # a u64; not '²' or 5000 digits
            if value is not None:
                counters.append((name, value))
        ports[f"{port.parent.parent.name}/{port.name}"] = PortState("ACTIVE" in state, tuple(counters))
    for iface in sorted((root / "class" / "net").glob("*")):
        if iface.name == "lo" or not (iface / "device").exists():
            continue  # virtual interfaces (veth, bridges) have no device: not a NIC port
        carrier = _read(iface / "carrier")
        operstate = _read(iface / "operstate")
        ports[iface.name] = PortState(carrier == "1" and operstate in ("up", "unknown"))
    return ports


@dataclass
class NicWatcher:
    root: Path
    previous: dict[str, PortState] = field(default_factory=dict)
    primed: bool = False

    def poll(self) -> list[str]:
        """Messages for what changed since the last poll."""
        now = read_ports(self.root)
        messages: list[str] = []
        for name, state in now.items():
            before = self.previous.get(name)
            if before is None:
                if not state.up:  # already down when first seen: that is evidence too
                    messages.append(f"nic {name}: link down")
                continue
            if before.up != state.up:
                messages.append(f"nic {name}: link {'up' if state.up else 'down'}")
            old = dict(before.counters)
            for counter, value in state.counters:
                if counter in old and value > old[counter]:
                    messages.append(f"nic {name}: counter {counter} +{value - old[counter]}")
        self.previous = now
        self.primed = True
        return messages


class _NicPartition(StatefulSourcePartition[Entry, None]):
    def __init__(self, source: NicSource) -> None:
        self.watcher = NicWatcher(source.root)
        self.interval = source.interval
        self.next_poll = dt.datetime.now(dt.UTC)

    def next_batch(self) -> list[Entry]:
        now = dt.datetime.now(dt.UTC)
        if now < self.next_poll:
            return []
        self.next_poll = now + dt.timedelta(seconds=self.interval)
        ts = now.timestamp()
        return [
            Entry(f"nic:{ts}", formats.Parsed(ts, None, message, None)) for message in self.watcher.poll()
        ]

    def next_awake(self) -> dt.datetime | None:
        return self.next_poll

    def snapshot(self) -> None:
        return None  # the next poll after a restart takes a fresh baseline


class NicSource(FixedPartitionedSource[Entry, None]):
    """Polls the NIC ports under a sysfs root every `interval` seconds; emits change messages."""

    def __init__(self, root: Path, *, interval: float = 1.0) -> None:
        self.root = root
        self.interval = interval

    def list_parts(self) -> list[str]:
        return ["nic"]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _NicPartition:
        return _NicPartition(self)
