"""A simulated GPU backend: the same interface as NVML, driven by a scenario and by `faultline sim inject`.

Control records are JSON lines appended to `<dir>/<node>.jsonl` (by `inject`); the backend follows the
file from where it was when the backend started. A scenario is a YAML timeline run from that start:

    - {at: 5s, gpu: 3, xid: 79}
    - {at: 20s, gpu: 1, field: ecc_dbe_volatile=1}
    - {at: 60s, gpu: 3, clear: true}

Health fields are state: the simulated GPUs' fields are the fold of every field record in the control
file (a restarted backend knows them), and `read_fields` returns them the way NVML would be read, with
each GPU's `temperature` (SIM_TEMPERATURE until a field record sets it; a clear record puts it back;
a lost GPU, as on NVML, reads none). A
`hang` record makes the next reads block for that many seconds, as a stuck driver call does. A
`reset` record (`{gpu: 3, reset: true}`, `sim inject --reset`) resets a GPU: its volatile error and
pending fields return to 0, and nothing is logged (see `RESET_CLEARS`).

`inventory` (what preflight reads) gives every simulated GPU the model SIM_MODEL, a PCIe Gen5 x16 link
and 18 NVLinks, less the `nvlink_down` field's count. The link fields in LINK_FIELDS are set like the
others (`sim inject --field pcie_width=8`) but are link state, not health fields: `read_fields` leaves
them out, as NVML's health read does, and a `clear` record puts them back to their maximum.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import select
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from faultline import yamldoc
from faultline.errors import ConfigError
from faultline.models import stable_id
from sources.gpu import GAUGES, GpuDevice, GpuEvent, GpuInfo

POLL_S = 0.02
WATCH_MAX_S = 0.25  # inotify waits are cut this short too, so that close() is noticed
_IN_MODIFY, _IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE = 0x2, 0x8, 0x80, 0x100
_IN_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then the name, padded)
FIELD_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_INTEGER = re.compile(r"\s*-?[0-9]{1,18}\s*", re.ASCII)  # a field's value: not '²', not 5000 digits
# What a GPU reset does to a simulated GPU's fields: the volatile uncorrectable count restarts, pending
# remappings and page retirements take effect, links come back up. A lost GPU stays lost. A reset writes
# no line (a real one writes none to the kernel log either): the agent sees its effect in the next read.
RESET_CLEARS = frozenset(
    {"ecc_dbe_volatile", "remapped_rows_pending", "retired_pages_pending", "nvlink_down"}
)

SIM_MODEL = "NVIDIA H100 80GB HBM3"
SIM_VBIOS = "96.00.99.00.01"  # the form nvidia-smi prints
SIM_DRIVER = "580.95.05"
SIM_TEMPERATURE = 45  # degrees C: an idle simulated GPU
SIM_NVLINKS = 18
LINK_FIELDS = {"pcie_width": 16, "pcie_gen": 5}  # name -> the link's maximum (and its healthy value)


def default_dir() -> Path:
    return Path(
        os.environ.get("FAULTLINE_SIM_DIR", Path(tempfile.gettempdir()) / f"faultline-sim-{os.getuid()}")
    )


def sim_serial(uuid: str) -> str:
    """A simulated GPU's 13-digit board serial number (as `nvidia-smi -q` prints them), from its UUID."""
    return str(int(stable_id("serial", uuid)[:12], 16) % 10**13).zfill(13)


def devices_for(node: str, count: int = 8) -> list[GpuDevice]:
    """Deterministic GPUs for a simulated node: bus ids like an 8-GPU HGX board, UUIDs from the node name."""
    buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
    return [
        GpuDevice(
            i,
            f"GPU-{stable_id('gpu', node, i)[:8]}-sim0-{stable_id('gpu', node, i)[8:20]}",
            f"0000:{buses[i % 8]}:00",
        )
        for i in range(count)
    ]


def parse_field(text: str) -> tuple[str, int]:
    """`NAME=VALUE` (an integer) as given to `sim inject --field`."""
    name, sep, value = text.partition("=")
    if not sep or not FIELD_NAME.fullmatch(name) or not _INTEGER.fullmatch(value):
        raise ValueError(f"field {text!r}: expected NAME=INTEGER, e.g. ecc_dbe_volatile=1")
    return name, int(value)


def inject(node: str, gpu: int, *, kind: str, value: int = 0, name: str = "",
           directory: Path | None = None) -> Path:  # fmt: skip
    """Append a control record for the node's simulator (the `faultline sim inject` command)."""
    target = (directory or default_dir()) / f"{node}.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    record = {"ts": time.time(), "gpu": gpu, "kind": kind, "value": value, "name": name}
    with target.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    return target


class SimulatorBackend:
    def __init__(self, node: str, *, directory: Path | None = None, gpus: int = 8,
                 scenario: list[dict[str, Any]] | None = None) -> None:  # fmt: skip
        self.node = node
        self.path = (directory or default_dir()) / f"{node}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._devices = devices_for(node, gpus)
        self._lock = threading.Lock()
        self._fields: dict[int, dict[str, int]] = {d.index: {} for d in self._devices}
        self._links: dict[int, dict[str, int]] = {d.index: dict(LINK_FIELDS) for d in self._devices}
        self._hang_until = 0.0
        self._offset = 0
        self._read_control()  # the fields the GPUs have now; events before the start are history
        self._started = time.time()
        self._timeline = sorted(_parse_scenario(scenario or []), key=lambda e: e.ts)
        self._closed = threading.Event()
        self._watch = _FileWatch.create(self.path)

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def wait_events(self, timeout: float) -> list[GpuEvent]:
        """Blocks like NVML's event wait: on inotify for the control file (where the kernel has it),
        else polling every POLL_S; the scenario's next record bounds the wait."""
        deadline = time.monotonic() + timeout
        while True:
            events = self._due() + self._read_control()
            now = time.monotonic()
            if events or self._closed.is_set() or now >= deadline:
                return events
            wait = deadline - now
            if self._timeline:
                wait = min(wait, max(0.0, self._started + self._timeline[0].ts - time.time()))
            if self._watch is None:
                time.sleep(min(wait, POLL_S))
            else:
                self._watch.wait(min(wait, WATCH_MAX_S))

    def read_fields(self) -> dict[int, dict[str, int]]:
        while not self._closed.is_set() and time.time() < self._hang_until:
            time.sleep(POLL_S)  # a stuck driver call
        with self._lock:
            return {index: fields if fields.get("lost") else {"temperature": SIM_TEMPERATURE, **fields}
                    for index, fields in self._fields.items()}  # fmt: skip

    def inventory(self) -> dict[int, GpuInfo]:
        while not self._closed.is_set() and time.time() < self._hang_until:
            time.sleep(POLL_S)  # a stuck driver call
        out = {}
        with self._lock:
            for index, links in self._links.items():
                down = min(SIM_NVLINKS, max(0, self._fields[index].get("nvlink_down", 0)))
                out[index] = GpuInfo(
                    model=SIM_MODEL, pcie_width=links["pcie_width"], pcie_width_max=LINK_FIELDS["pcie_width"],
                    pcie_gen=links["pcie_gen"], pcie_gen_max=LINK_FIELDS["pcie_gen"],
                    nvlink_active=SIM_NVLINKS - down, nvlink_inactive=down,
                    serial=sim_serial(self._devices[index].uuid), vbios=SIM_VBIOS, driver=SIM_DRIVER,
                )  # fmt: skip
        return out

    def history(self) -> list[GpuEvent]:
        """The XID and fallen-off-the-bus records of the control file (this simulated boot's kernel log, as
        preflight reads it), less those of a GPU before its last clear record (a reset, like a real one,
        leaves the kernel log as it was)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        out: list[GpuEvent] = []
        for line in data.splitlines():
            try:
                rec = json.loads(line)
                event = GpuEvent(
                    float(rec["ts"]), int(rec["gpu"]), str(rec["kind"]), int(rec.get("value", 0))
                )
            except (ValueError, KeyError, TypeError):
                continue
            if event.kind == "healthy":
                out = [e for e in out if e.gpu != event.gpu]
            elif event.kind in ("xid", "lost"):
                out.append(event)
        return out

    def resume(self, position: int) -> None:
        self._offset = min(position, self._offset)  # replay events after `position`; fields are state

    def position(self) -> int:
        return self._offset

    def close(self) -> None:
        self._closed.set()
        if self._watch is not None:
            self._watch.close()

    def _due(self) -> list[GpuEvent]:
        now = time.time() - self._started
        due = [e for e in self._timeline if e.ts <= now]
        self._timeline = self._timeline[len(due) :]
        return self._apply([GpuEvent(self._started + e.ts, e.gpu, e.kind, e.value, name=e.name) for e in due])

    def _apply(self, events: list[GpuEvent]) -> list[GpuEvent]:
        """Field and hang records change the simulated state; the other records are events."""
        out = []
        with self._lock:
            for e in events:
                fields = self._fields.get(e.gpu)
                if e.kind == "field" and e.name in LINK_FIELDS and e.gpu in self._links:
                    self._links[e.gpu][e.name] = e.value  # link state, not a health field
                elif e.kind == "field" and fields is not None:
                    fields[e.name] = e.value
                elif e.kind == "hang":
                    self._hang_until = e.ts + e.value
                elif e.kind == "reset" and fields is not None:
                    fields.update(dict.fromkeys(RESET_CLEARS & fields.keys(), 0))  # no line: see RESET_CLEARS
                else:
                    if e.kind == "healthy" and fields is not None:
                        for name in GAUGES & fields.keys():
                            del fields[name]  # back to the simulated GPU's own
                        fields.update(dict.fromkeys(fields, 0))
                        self._links[e.gpu] = dict(LINK_FIELDS)
                    out.append(e)
        return out

    def _read_control(self) -> list[GpuEvent]:
        try:
            if self.path.stat().st_size <= self._offset:
                return []  # nothing appended: a stat instead of an open and a read on every poll
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # only whole records
        start = self._offset
        self._offset += end
        events = []
        for line in data[:end].splitlines(keepends=True):
            start += len(line)
            try:
                rec = json.loads(line)
                events.append(
                    GpuEvent(float(rec["ts"]), int(rec["gpu"]), str(rec["kind"]), int(rec.get("value", 0)),
                             position=start, name=str(rec.get("name", "")))
                )  # fmt: skip
            # (OverflowError: int() of Infinity, float() of an integer of 400 digits)
            except (ValueError, KeyError, TypeError, OverflowError):
                continue  # a torn or foreign line: ignore it, as a driver would ignore garbage
        return self._apply(events)


class _FileWatch:
    """inotify on the file's directory, reporting writes to that one file (ctypes on libc: no
    dependency). `create` returns None where inotify is not available."""

    def __init__(self, fd: int, name: bytes) -> None:
        self.fd = fd
        self.name = name

    @classmethod
    def create(cls, path: Path) -> _FileWatch | None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return None
            mask = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE
            if libc.inotify_add_watch(fd, os.fsencode(path.parent), mask) < 0:
                os.close(fd)
                return None
        except (OSError, AttributeError):
            return None
        return cls(fd, os.fsencode(path.name))

    def wait(self, timeout: float) -> bool:
        """True when the file changed within `timeout` (other files in the directory are ignored)."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            try:
                ready, _, _ = select.select([self.fd], [], [], left)
                if not ready:
                    return False
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            except (OSError, ValueError):  # closed under us: the backend is closing
                return False
            offset = 0
            while offset + _IN_EVENT.size <= len(data):
                _wd, _mask, _cookie, length = _IN_EVENT.unpack_from(data, offset)
                name = data[offset + _IN_EVENT.size : offset + _IN_EVENT.size + length].rstrip(b"\0")
                offset += _IN_EVENT.size + length
                if name == self.name:
                    return True
        return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _parse_scenario(items: list[dict[str, Any]]) -> list[GpuEvent]:
    return [_scenario_event(item) for item in items]


def _scenario_event(item: object) -> GpuEvent:
    """One scenario item as the event it schedules; ValueError saying what is wrong with it."""
    from patterns.schema import parse_duration  # noqa: PLC0415 - durations are spelled as in packs

    if not isinstance(item, dict):
        raise ValueError(f"an event is a mapping such as {{at: 5s, gpu: 3, xid: 79}}, not {item!r}")
    at = parse_duration(item.get("at", 0.001))
    gpu = _whole(item, "gpu")
    if "xid" in item:
        return GpuEvent(at, gpu, "xid", _whole(item, "xid"))
    if item.get("lost"):
        return GpuEvent(at, gpu, "lost")
    if item.get("reset"):
        return GpuEvent(at, gpu, "reset")
    if item.get("clear"):
        return GpuEvent(at, gpu, "healthy")
    if "field" in item:
        name, value = parse_field(str(item["field"]))
        return GpuEvent(at, gpu, "field", value, name=name)
    raise ValueError(f"a scenario event needs xid, field, lost, reset or clear: {item}")


def _whole(item: dict[str, Any], key: str) -> int:
    value = item.get(key)
    if isinstance(value, str) and _INTEGER.fullmatch(value):
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 10**18:
        raise ValueError(f"{key} must be a whole number, not {value!r}")
    return value


def load_scenario(path: Path) -> list[dict[str, Any]]:
    """The scenario file's events, each checked: a ConfigError names the file and the event."""
    try:
        data = yamldoc.parse(path.read_text(encoding="utf-8")) or []
    except (OSError, UnicodeDecodeError, yamldoc.YamlError) as exc:
        raise ConfigError(f"{path}: cannot read the scenario: {exc}") from exc
    if not isinstance(data, list):
        raise ConfigError(f"{path}: a scenario is a YAML list of events")
    for number, item in enumerate(data, start=1):
        try:
            _scenario_event(item)
        except ValueError as exc:
            raise ConfigError(f"{path}: event {number}: {exc}") from exc
    return data
