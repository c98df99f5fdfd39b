"""The node agent's dataflow: GPU backend events and kernel journal -> packs -> per-node detection ->
MongoDB and Kubernetes.

    gpu events ──── match ──┐
    journal (kernel) ─ match ┴─ key ── detect (NodeDetector) ──┬── MongoDB sink (faults by revision)
                                                                 └── Kubernetes sink (conditions, Events)

The detector shell emits, after each batch, every fault of the node and the ones that changed with a
revision number, so both sinks stay idempotent under replays. Step ids are constants.
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink

from faultline import metrics
from faultline.models import Action, Component, Entity, Fault, HealthEvent, event_id, utc_from_epoch
from patterns.compiler import CompiledPacks
from patterns.detectors import NodeDetector
from sources import gpu, scan
from sources.journal import Entry

FLOW_ID = "node"
STEP_INPUT = "gpu"


@dataclass(frozen=True)
class LogInput:
    """A kernel-log input of the node flow: its step id (a recovery contract), the pack source its
    lines are (journal, syslog or kmsg) and the Bytewax source emitting `Entry` items."""

    step_id: str
    kind: str
    source: FixedPartitionedSource[Entry, Any]


class _BatchPartition(StatefulSourcePartition[list[Entry], Any]):
    """Hands a partition's whole batch over as one item: a busy journal then costs the dataflow one
    item per poll, not one per line."""

    def __init__(self, inner: StatefulSourcePartition[Entry, Any]) -> None:
        self.inner = inner

    def next_batch(self) -> list[list[Entry]]:
        batch = self.inner.next_batch()
        return [list(batch)] if batch else []

    def next_awake(self) -> dt.datetime | None:
        return self.inner.next_awake()

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def close(self) -> None:
        self.inner.close()


class Batched(FixedPartitionedSource[list[Entry], Any]):
    def __init__(self, inner: FixedPartitionedSource[Entry, Any]) -> None:
        self.inner = inner

    def list_parts(self) -> list[str]:
        return self.inner.list_parts()

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> _BatchPartition:
        return _BatchPartition(self.inner.build_part(step_id, for_part, resume_state))


def _entry_matcher(
    compiled: CompiledPacks, kind: str, position: int
) -> Callable[[list[Entry]], list[scan.Timed]]:
    def match_entries(entries: list[Entry]) -> list[scan.Timed]:
        out = []
        for entry in entries:
            rec = entry.record
            for hit in compiled.match(kind, rec.message):
                out.append(scan.Timed(rec.ts, (position, 0), hit, rec.message, rec.boot, kind))
        if entries:
            metrics.SOURCE_LAG.labels(source=kind).set(max(0.0, time.time() - entries[-1].record.ts))
        return out

    return match_entries


STEP_MATCH = "match"
STEP_DETECT = "detect"
STEP_MONGO = "mongo_out"
STEP_KUBE = "kube_out"
WAIT_S = 0.5
IDLE_AWAKE_S = 0.02


@dataclass(frozen=True)
class NodeUpdate:
    """A node's faults after a batch, and those that changed (with their new revision)."""

    node: str
    faults: list[Fault]
    changed: list[tuple[Fault, int]]
    events: list[HealthEvent] = field(default_factory=list)


@dataclass(frozen=True)
class GpuPolling:
    """How the GPU source polls health fields and judges its own health (AgentConfig holds the values)."""

    interval: float = 1.0
    hung_after: float = 10.0
    unresponsive_after: float = 300.0


GpuResume = tuple[int | None, dict[int, dict[str, int]]]


class _GpuPartition(StatefulSourcePartition[gpu.GpuEvent, GpuResume]):
    """Two threads block in the backend (events, field polls); `next_batch` hands over what they found
    and checks the poll thread is not stuck. Resume state: the replay position of the backend (the
    simulator's) and the last fields read, so a restart reports only what changed meanwhile."""

    def __init__(self, backend: gpu.GpuBackend, polling: GpuPolling, resume: GpuResume | None) -> None:
        self.backend = backend
        self.polling = polling
        self.position, self.fields = resume if resume is not None else (None, {})
        if self.position is not None:
            backend.resume(self.position)  # before the waiting thread starts
        self.queue: queue.Queue[gpu.GpuEvent] = queue.Queue(maxsize=10_000)
        self.stop = threading.Event()
        self.watch = gpu.MonitorWatch(polling.hung_after, polling.unresponsive_after)
        self.call_started: float | None = None
        self.failure: str | None = None
        self.latest = self.fields
        self.threads = [
            threading.Thread(target=self._wait, name="gpu-events", daemon=True),
            threading.Thread(target=self._poll, name="gpu-fields", daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _wait(self) -> None:  # the backend blocks; Bytewax's next_batch must not
        while not self.stop.is_set():
            with metrics.BACKEND_WAIT.time():
                events = self.backend.wait_events(WAIT_S)
            for event in events:
                self.queue.put(event)

    def _poll(self) -> None:
        previous = self.fields
        while not self.stop.is_set():
            self.call_started = time.monotonic()
            try:
                with metrics.FIELD_READ.time():
                    current = self.backend.read_fields()
            except Exception as exc:  # noqa: BLE001 - any backend failure is the monitor's health, reported
                self.failure = f"{type(exc).__name__}: {exc}"[:200]
            else:
                self.failure = None
                for event in gpu.field_changes(previous, current, time.time()):
                    self.queue.put(event)
                previous = self.latest = current
                self.queue.put(gpu.GpuEvent(time.time(), -1, "fields", 0))  # a marker: the read is done
            finally:
                self.call_started = None
            self.stop.wait(self.polling.interval)

    def next_batch(self) -> list[gpu.GpuEvent]:
        metrics.beat()  # woken at least every IDLE_AWAKE_S: a stalled dataflow stops beating
        out: list[gpu.GpuEvent] = []
        while len(out) < 1000:
            try:
                event = self.queue.get_nowait()
            except queue.Empty:
                break
            if event.kind == "fields":
                self.fields = self.latest  # what the snapshot says was last read
                continue
            out.append(event)
            if event.position is not None:
                self.position = event.position
        out += self.watch.observe(time.monotonic(), self.call_started, self.failure, ts=time.time())
        return out

    def next_awake(self) -> dt.datetime | None:
        return (
            None if not self.queue.empty() else dt.datetime.now(dt.UTC) + dt.timedelta(seconds=IDLE_AWAKE_S)
        )

    def snapshot(self) -> GpuResume:
        return self.position, self.fields

    def close(self) -> None:
        self.stop.set()
        self.backend.close()


class GpuEventSource(FixedPartitionedSource[gpu.GpuEvent, GpuResume]):
    def __init__(self, backend: gpu.GpuBackend, polling: GpuPolling | None = None) -> None:
        self.backend = backend
        self.polling = polling or GpuPolling()

    def list_parts(self) -> list[str]:
        return ["gpu"]

    def build_part(self, step_id: str, for_part: str, resume_state: GpuResume | None) -> _GpuPartition:
        return _GpuPartition(self.backend, self.polling, resume_state)


def health_event(detector: NodeDetector, t: scan.Timed) -> HealthEvent:
    """The stored record of one match (its id is deterministic, so a replay stores it once)."""
    hit = t.hit
    observed = utc_from_epoch(t.ts)
    entities = (Entity(type=hit.entity_type, id=hit.entity_id),) if hit.entity_id else ()
    return HealthEvent(
        id=event_id(detector.node, t.source, hit.entity_type, hit.entity_id, hit.code, observed),
        node=detector.node,
        component=Component(hit.component),
        check=detector.compiled.patterns[hit.pattern].id,
        code=hit.code,
        entities=entities,
        healthy=hit.kind != "fault",
        fatal=hit.fatal,
        action=Action(hit.action),
        message=t.message[:1024],
        metadata={"source": t.source},
        generated_at=dt.datetime.now(dt.UTC),
        observed_at=observed,
    )


class DetectLogic(op.StatefulLogic[list[scan.Timed], NodeUpdate, dict[str, Any]]):
    """The node's detector, its faults' last written signatures and the number of matches observed so
    far; all of it is the recovery snapshot.

    A changed fault is written with that number as its revision: it depends only on how far into the
    input the detector is, not on how the input was cut into batches, so a restarted agent that replays
    from its snapshot (in other batches) reaches the same revisions, and the store keeps the newest."""

    def __init__(self, node: str, compiled: CompiledPacks, resume: dict[str, Any] | None = None) -> None:
        if resume is None:
            self.detector = NodeDetector(node, compiled)
            self.seen: dict[str, tuple[Any, ...]] = {}
            self.sequence = 0
        else:
            self.detector = NodeDetector.restore(node, compiled, resume["detector"])
            self.seen = {k: tuple(v) for k, v in resume["seen"].items()}
            self.sequence = int(resume["sequence"])

    def on_item(self, value: list[scan.Timed]) -> tuple[list[NodeUpdate], bool]:
        events = []
        for t in sorted(value, key=lambda t: (t.ts, t.order)):
            self.detector.observe(t.ts, t.hit, t.message, t.boot)
            self.sequence += 1
            metrics.EVENTS.labels(code=t.hit.code).inc()
            events.append(health_event(self.detector, t))
        faults = self.detector.snapshot_faults()
        open_by_component: dict[str, int] = {}
        for f in faults:
            if f.resolved_at is None:
                open_by_component[f.component.value] = open_by_component.get(f.component.value, 0) + 1
        for component in ("GPU", "NVSWITCH", "NIC", "NODE"):
            metrics.FAULTS_OPEN.labels(component=component).set(open_by_component.get(component, 0))
        changed = []
        for f in faults:
            signature = (f.count, f.last_seen, f.first_seen, f.resolved_at, f.fatal, f.action)
            if self.seen.get(f.id) != signature:
                self.seen[f.id] = signature
                changed.append((f, self.sequence))
        return [NodeUpdate(self.detector.node, faults, changed, events)], op.StatefulLogic.RETAIN

    def snapshot(self) -> dict[str, Any]:
        return {
            "detector": self.detector.state(),
            "seen": dict(self.seen),
            "sequence": self.sequence,
        }


def build(
    node: str,
    backend: gpu.GpuBackend,
    compiled: CompiledPacks,
    sinks: dict[str, DynamicSink[NodeUpdate]],
    *,
    logs: list[LogInput] | None = None,
    polling: GpuPolling | None = None,
    gpu_source: str = "nvml",
) -> Dataflow:
    """`sinks` by step id (STEP_MONGO, STEP_KUBE): each receives every NodeUpdate. `logs` are kernel-log
    inputs (journal, syslog file, kmsg) whose entries are matched as their pack source."""
    devices = {d.index: d for d in backend.devices()}
    flow = Dataflow(FLOW_ID)
    events = op.input(STEP_INPUT, flow, GpuEventSource(backend, polling))

    def match(event: gpu.GpuEvent) -> list[scan.Timed]:
        text = gpu.message(event, devices.get(event.gpu))
        if text is None:
            return []
        metrics.SOURCE_LAG.labels(source="gpu").set(max(0.0, time.time() - event.ts))
        hits = compiled.match(gpu_source, text)  # the simulator stands in for NVML
        return [scan.Timed(event.ts, (0, 0), hit, text, None, gpu_source) for hit in hits]

    hits = op.map(STEP_MATCH, events, match)
    for position, log in enumerate(logs or [], start=1):
        entries = op.input(log.step_id, flow, Batched(log.source))
        matched = op.map(f"{log.step_id}_match", entries, _entry_matcher(compiled, log.kind, position))
        hits = op.merge(f"{log.step_id}_merge", hits, matched)
    keyed = op.map("key", op.filter("nonempty", hits, bool), lambda batch: (node, batch))
    updates = op.stateful(STEP_DETECT, keyed, lambda resume: DetectLogic(node, compiled, resume))
    plain = op.key_rm("unkey", updates)
    for step_id, sink in sinks.items():
        op.output(step_id, plain, sink)
    return flow
