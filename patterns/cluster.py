"""Cluster-scope patterns (`scope: cluster`): what the analyzer concludes from every node's events
together, as plain code with time passed in (the Bytewax shell is `dataflows.cluster`).

A cluster pattern counts the feed's records (health events, or fault changes) that match it in a
sliding window over event time, one window per key: the values of the fields it names (the GPU across
reboots, the node, the NVLink domain, a node label such as the zone or rack, the job). Once `count`
records, or `count` distinct values of `distinct`, fall within `within` before the watermark (the
newest event time of the feed so far, the same for every window, so the outcome does not depend on how
windows are spread over partitions or when quiet ones expire), it fires: a derived fault for the node
of the record that made it fire (`nodes: trigger`) or for every node in the window (`nodes: every`),
carrying the ids of the records behind it. While the condition holds every further record fires again
with the window's new figures (the store keeps the newest revision).

Fields (`field`): `node`, `code`, `component`, `entity` (`type:id`), `entity_id`; `gpu` is the GPU
across reboots and nodes (its UUID from the event's metadata, else its serial, else the node and PCI
address); `gpu_uuid`, `gpu_serial`, `nvlink_domain` (the event's metadata, else the node label
`nvidia.com/gpu.clique`), `job` (the event's metadata, else the job holding the node's GPUs: JOB_KEY
among its labels, `sources.pod_jobs`), `episode` (fault changes: the fault and when it was first
seen, so the updates of one fault count once and a reopened fault anew); `label:<name>` a node label,
`metadata:<key>` an event's metadata. A record without a value for one of a pattern's key fields is
not counted by it; one with the window key's separator (\\x1f) in a value is counted with U+FFFD in
its place.

State is bounded: a window keeps at most MAX_ENTRIES records (the newest), drops those older than
`within` before the watermark, ignores a record older than that (late) or one it holds already (a
replay), and goes when its newest record is older than that too (`Windows.expire`, run at checkpoints:
an expired window is one whose every record the next would drop anyway).
"""

from __future__ import annotations

import bisect
import fnmatch
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultline.errors import PackError
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id, utc_from_epoch
from patterns import loader
from patterns.examples import Failure
from patterns.loader import LoadedClusterPattern, PackSet
from patterns.schema import ClusterPattern, ClusterRecord, key_field
from patterns.templates import Template

PARTITIONS = 32  # window keys are spread over this many partitions (a recovery contract: keep it)
MAX_ENTRIES = 1000  # records one window keeps (the newest); its count saturates there
MAX_IDS = 50  # record ids a derived fault carries (the newest)
EXAMPLE_START = 1_795_000_000.0  # when an example's first record happens (late 2026), epoch seconds
CLIQUE_LABEL = "nvidia.com/gpu.clique"  # GPU feature discovery: NVLink domain (cluster UUID.clique id)
JOB_KEY = "faultline.io/gpu-job"  # the job holding a node's GPUs, in its labels as the analyzer reads them


@dataclass(frozen=True, slots=True)
class Record:
    """One record of the feed, flattened for matching. `position`: the feed number times 2**16 plus
    the record's place in its document (its order, and the derived faults' revision)."""

    position: int
    kind: str  # "events" | "faults"
    id: str  # event id, or `<fault id>@<revision>`
    t: float  # epoch seconds: when observed (events), last seen (faults)
    node: str
    code: str
    component: str = "GPU"
    entity_type: str = ""
    entity_id: str = ""
    healthy: bool = False
    fatal: bool = False
    state: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    opened: float = 0.0  # faults: when the fault was first seen (its episode: a reopened fault has a new one)


def field_value(record: Record, source: str) -> str | None:
    """The value of a key field (`patterns.schema.CLUSTER_FIELDS`, `label:`, `metadata:`), or None."""
    meta = record.metadata
    if source.startswith("label:"):
        return record.labels.get(source[6:]) or None
    if source.startswith("metadata:"):
        return meta.get(source[9:]) or None
    if source == "gpu":
        if meta.get("gpu_uuid"):
            return meta["gpu_uuid"]
        if meta.get("gpu_serial"):
            return meta["gpu_serial"]
        return (
            f"{record.node}/{record.entity_id}" if record.entity_type == "GPU" and record.entity_id else None
        )
    if source == "nvlink_domain":
        return meta.get("nvlink_domain") or record.labels.get(CLIQUE_LABEL) or None
    if source == "job":
        return meta.get("job") or record.labels.get(JOB_KEY) or None
    if source in ("gpu_uuid", "gpu_serial"):
        return meta.get(source) or None
    if source == "entity":
        return f"{record.entity_type}:{record.entity_id}" if record.entity_type else None
    if source == "episode":  # one fault from its opening to its resolution, however often it is updated
        return f"{record.id.rpartition('@')[0]}@{record.opened:.3f}" if record.kind == "faults" else None
    value = {"node": record.node, "code": record.code, "component": record.component,
             "entity_id": record.entity_id}.get(source)  # fmt: skip
    return value or None


@dataclass(frozen=True, slots=True)
class Routed:
    """A record as one pattern's window sees it (small: it crosses the key exchange as a tuple)."""

    pattern: str
    key: str  # the key fields' values, joined by \\x1f
    position: int
    t: float
    id: str
    node: str
    distinct: str  # the `distinct` field's value ("" without one)
    watermark: float  # the newest event time in the feed so far: windows' clock, the same in every partition


class CompiledClusterPattern:
    def __init__(self, loaded: LoadedClusterPattern) -> None:
        spec: ClusterPattern = loaded.pattern
        self.spec = spec
        self.id = spec.id
        self.file = loaded.file
        self.keys = [key_field(k) for k in spec.window.key]
        self.distinct = key_field(spec.window.distinct)[1] if spec.window.distinct else None
        self.within = spec.window.within
        self.count = spec.window.count
        m = spec.match
        self.kind = m.records
        self.codes = tuple(c.upper() for c in m.codes)
        self.components = None if m.components is None else {c.value for c in m.components}
        self.code = Template(spec.fault.code)
        entity = spec.fault.entity
        self.entity_type = entity.type if entity else "NODE"
        self.entity_id = Template(entity.id if entity else "{node}")

    def matches(self, r: Record) -> bool:
        m = self.spec.match
        if r.kind != self.kind or not any(fnmatch.fnmatchcase(r.code.upper(), c) for c in self.codes):
            return False
        if self.components is not None and r.component not in self.components:
            return False
        if r.kind == "events" and m.healthy is not None and r.healthy != m.healthy:
            return False
        if m.fatal is not None and r.fatal != m.fatal:
            return False
        if r.kind == "faults" and m.states is not None and r.state not in m.states:
            return False
        return all(fnmatch.fnmatchcase(r.labels.get(k, ""), v) for k, v in m.labels.items())

    def route(self, r: Record, watermark: float) -> Routed | None:
        """The record as this pattern's window takes it, or None (no match, or a key field missing)."""
        if not self.matches(r):
            return None
        values = [field_value(r, source) for _, source in self.keys]
        if any(v is None for v in values):
            return None
        distinct = ""
        if self.distinct is not None:
            distinct = field_value(r, self.distinct) or ""
            if not distinct:
                return None
        # a value holding the separator (an event's metadata is anyone's text) would split into more
        # names than the key has when the window fires: it stands for itself with U+FFFD in its place
        key = "\x1f".join(v.replace("\x1f", "\ufffd") for v in values if v is not None)
        return Routed(self.id, key, r.position, r.t, r.id, r.node, distinct, watermark)


class ClusterPacks:
    """The loaded packs' cluster patterns, compiled; `route` gives every window a record goes to."""

    def __init__(self, packs: PackSet) -> None:
        self.packs = packs
        self.patterns = {lp.pattern.id: CompiledClusterPattern(lp) for lp in packs.cluster.values()}

    def route(self, r: Record, watermark: float) -> list[Routed]:
        """The record as each pattern that counts it sees it; `watermark`: the newest event time of the
        feed up to this record (its own included)."""
        return [routed for p in self.patterns.values() if (routed := p.route(r, watermark)) is not None]


def partition(pattern: str, key: str) -> int:
    """Which partition a window lives in (stable across processes and restarts, unlike `hash`)."""
    return zlib.adler32(f"{pattern}\x1f{key}".encode()) % PARTITIONS


@dataclass(frozen=True)
class Derived:
    """A fault a cluster pattern concluded: `revision` is the position of the record that fired it."""

    pattern: str
    node: str
    code: str
    component: Component
    entity_type: str
    entity_id: str
    fatal: bool
    action: Action
    description: str
    count: int
    first_seen: float
    last_seen: float
    records: tuple[str, ...]
    key: str
    revision: int
    suppresses: tuple[str, ...] = ()  # code globs the quarantine worker leaves alone on its node
    suppress_for: float = 0.0  # seconds before and after the window that holds

    def fault(self) -> Fault:
        """As stored in `faults`, like any fault: keyed by node, entity and code; `pattern` the cluster
        pattern's id; `metadata.records` the ids of the records behind it (the newest MAX_IDS); with
        `suppresses`, `metadata.suppresses` (comma-separated globs) and `metadata.suppress_for` (seconds),
        which `workers.suppression` reads."""
        metadata = {
            "scope": "cluster",
            "window": self.key.replace("\x1f", "/"),
            "records": ",".join(self.records),
        }
        if self.suppresses:
            metadata |= {"suppresses": ",".join(self.suppresses), "suppress_for": f"{self.suppress_for:g}"}
        return Fault(
            id=fault_id(self.node, self.entity_type, self.entity_id, self.code), node=self.node,
            entity=Entity(type=self.entity_type, id=self.entity_id), code=self.code, component=self.component,
            count=self.count, first_seen=utc_from_epoch(self.first_seen),
            last_seen=utc_from_epoch(self.last_seen), fatal=self.fatal, action=self.action,
            state=FaultState.OPEN, description=self.description, pattern=self.pattern, metadata=metadata,
        )  # fmt: skip


Entry = tuple[float, int, str, str, str]  # (t, position, record id, node, distinct value)


class Window:
    """One pattern's window for one key: its entries in time order, with the ids it holds and how many
    entries hold each distinct value (so a record costs a look-up, not a pass over the window)."""

    __slots__ = ("entries", "ids", "values")

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self.entries: list[Entry] = []
        self.ids: set[str] = set()
        self.values: Counter[str] = Counter()
        for e in sorted(entries):
            self.insert(e)

    @property
    def newest(self) -> float:
        return self.entries[-1][0] if self.entries else float("-inf")

    def insert(self, e: Entry) -> None:
        bisect.insort(self.entries, e)
        self.ids.add(e[2])
        self.values[e[4]] += 1

    def trim(self, cutoff: float, cap: int) -> None:
        """Drop the entries older than `cutoff`, and the oldest past `cap`."""
        start = max(bisect.bisect_left(self.entries, (cutoff,)), len(self.entries) - cap)
        for e in self.entries[:start]:
            self.ids.discard(e[2])
            self.values[e[4]] -= 1
            if not self.values[e[4]]:
                del self.values[e[4]]
        del self.entries[:start]


class Windows:
    """The windows of one partition, and how far into the feed they are (`upto`, a position)."""

    def __init__(self, packs: ClusterPacks) -> None:
        self.packs = packs
        self.windows: dict[tuple[str, str], Window] = {}
        self.upto = 0
        self.watermark = float("-inf")  # the newest event time of the feed seen here
        self.late = 0  # records ignored as older than their window
        self.repeats = 0  # records a window held already (a replay)

    def add(self, item: Routed) -> list[Derived]:
        """Count one record; the derived faults it makes (none unless its pattern fires)."""
        p = self.packs.patterns.get(item.pattern)
        if p is None:
            return []  # a pattern removed since the record was routed (a restore)
        self.watermark = max(self.watermark, item.watermark)
        if item.t < item.watermark - p.within:
            self.late += 1
            return []
        w = self.windows.get((item.pattern, item.key))
        if w is None:
            w = self.windows[(item.pattern, item.key)] = Window()
        elif item.id in w.ids:
            self.repeats += 1
            return []
        w.insert((item.t, item.position, item.id, item.node, item.distinct))
        w.trim(max(w.newest, item.watermark) - p.within, MAX_ENTRIES)
        measure = len(w.values) if p.distinct is not None else len(w.entries)
        if measure < p.count or item.id not in w.ids:
            return []
        return self._fire(p, item, w, measure)

    def _fire(self, p: CompiledClusterPattern, item: Routed, w: Window, measure: int) -> list[Derived]:
        names = dict(zip((n for n, _ in p.keys), item.key.split("\x1f"), strict=True))
        nodes = sorted({e[3] for e in w.entries}) if p.spec.fault.nodes == "every" else [item.node]
        out = []
        ids = tuple(e[2] for e in w.entries[-MAX_IDS:])
        for node in nodes:
            values = {**names, "key": item.key.replace("\x1f", "/"), "node": node}
            code, entity_id = p.code.render(values), p.entity_id.render(values)
            if not code or entity_id is None:  # a field the template names is missing, or it made no code
                continue
            f = p.spec.fault
            out.append(Derived(
                pattern=p.id, node=node, code=code, component=f.component, entity_type=p.entity_type,
                entity_id=entity_id, fatal=f.fatal, action=f.action, description=f.description, count=measure,
                first_seen=w.entries[0][0], last_seen=w.entries[-1][0], records=ids, key=item.key,
                revision=item.position, suppresses=tuple(f.suppresses.codes) if f.suppresses else (),
                suppress_for=f.suppresses.for_ if f.suppresses else 0.0,
            ))  # fmt: skip
        return out

    def expire(self, watermark: float) -> int:
        """Drop the windows whose newest record is older than their `within` before `watermark`."""
        self.watermark = max(self.watermark, watermark)
        gone = [
            k for k, w in self.windows.items()
            if (p := self.packs.patterns.get(k[0])) is None or w.newest < self.watermark - p.within
        ]  # fmt: skip
        for k in gone:
            del self.windows[k]
        return len(gone)

    def state(self) -> dict[str, Any]:
        """A JSON-able copy: no dict keys but plain words (MongoDB keys may not hold dots), a window's
        entries as columns (FerretDB stores no nested arrays)."""
        return {
            "upto": self.upto,
            "watermark": self.watermark if self.watermark != float("-inf") else None,
            "windows": [
                {"pattern": p, "key": k, **_columns(w.entries)} for (p, k), w in self.windows.items()
            ],
        }

    @classmethod
    def restore(cls, packs: ClusterPacks, state: Mapping[str, Any] | None) -> Windows:
        out = cls(packs)
        if not state:
            return out
        out.upto = int(state.get("upto") or 0)
        wm = state.get("watermark")
        out.watermark = float("-inf") if wm is None else float(wm)
        for w in state.get("windows") or ():
            if w["pattern"] in packs.patterns:  # a pattern removed from the packs leaves its windows behind
                entries = zip(w["t"], w["position"], w["id"], w["node"], w["distinct"], strict=True)
                out.windows[(w["pattern"], w["key"])] = Window(
                    (float(t), int(p), str(i), str(n), str(d)) for t, p, i, n, d in entries
                )
        return out


def _columns(entries: list[Entry]) -> dict[str, list[Any]]:
    names = ("t", "position", "id", "node", "distinct")
    return {name: [e[i] for e in entries] for i, name in enumerate(names)}


def replay(packs: ClusterPacks, records: Iterable[Record]) -> list[Derived]:
    """Every derived fault the records make, in order, in one process (examples, `analyzer replay`)."""
    windows = Windows(packs)
    out: list[Derived] = []
    watermark = float("-inf")
    for r in records:
        watermark = max(watermark, r.t)
        for routed in packs.route(r, watermark):
            out.extend(windows.add(routed))
    return out


def example_records(records: Iterable[ClusterRecord], start: float = EXAMPLE_START) -> list[Record]:
    """An example's records as the feed would give them (one feed document each)."""
    out = []
    for i, r in enumerate(records, start=1):
        entity_type, _, entity_id = r.entity.partition(":")
        out.append(Record(
            position=i << 16, kind="events", id=f"example-{i}",
            t=start + r.at, node=r.node, code=r.code, component=r.component.value, entity_type=entity_type,
            entity_id=entity_id, healthy=r.healthy, fatal=r.fatal, state=r.state, metadata=dict(r.metadata),
            labels=dict(r.labels), opened=start + (r.at if r.opened is None else r.opened),
        ))  # fmt: skip
    return out


def check_examples(packs: ClusterPacks) -> list[Failure]:
    """Each cluster pattern's examples, run on that pattern alone: a positive one must make a derived
    fault with the expected fields (`code`, `nodes`: those given it, `entity_id`, `count`: the last
    figure), a negative one none."""
    failures = []
    for p in packs.patterns.values():
        alone = ClusterPacks(PackSet(cluster={p.id: packs.packs.cluster[p.id]}))
        for n, example in enumerate(p.spec.examples.match, start=1):
            derived = replay(alone, _as_kind(p, example_records(example.records)))
            if not derived:
                failures.append(Failure(p.file, p.id, f"example {n} makes no fault"))
                continue
            got = {"code": derived[-1].code, "nodes": sorted({d.node for d in derived}),
                   "entity_id": derived[-1].entity_id, "count": derived[-1].count}  # fmt: skip
            for name, want in example.expect.items():
                if name not in got:
                    failures.append(Failure(p.file, p.id, f"example {n} expects unknown field {name!r} "
                                                          f"(use {', '.join(got)})"))  # fmt: skip
                elif got[name] != want:
                    failures.append(Failure(p.file, p.id, f"example {n}: expected {name}={want!r}, "
                                                          f"got {got[name]!r}"))  # fmt: skip
        for n, example in enumerate(p.spec.examples.no_match, start=1):
            derived = replay(alone, _as_kind(p, example_records(example.records)))
            if derived:
                failures.append(Failure(p.file, p.id, f"negative example {n} makes {derived[0].code} on "
                                                      f"{derived[0].node}"))  # fmt: skip
    return failures


def _as_kind(p: CompiledClusterPattern, records: list[Record]) -> list[Record]:
    """Examples of a pattern over fault changes are fault changes."""
    if p.kind != "faults":
        return records
    return [Record(**{**{s: getattr(r, s) for s in Record.__slots__}, "kind": "faults",
                      "state": r.state or "open"}) for r in records]  # fmt: skip


def load(user_dirs: Iterable[Path] = (), *, builtin: bool = True, check: bool = True) -> ClusterPacks:
    """The cluster patterns of the built-in packs and the user's (merged by id like node patterns);
    `check`: every pattern's examples must pass (the first failure raises PackError)."""
    packs = ClusterPacks(loader.load(list(user_dirs), builtin=builtin))
    if check:
        failures = check_examples(packs)
        if failures:
            raise PackError(failures[0].file, failures[0].reason, failures[0].pattern_id)
    return packs
