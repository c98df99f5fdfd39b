"""The node agent's dataflow: GPU backend events, kernel log, NIC and gRPC ingest -> packs -> per-node
detection -> MongoDB and Kubernetes.

    inputs (gpu, journal | syslog | kmsg, nic, grpc: one Bytewax input, batches tagged by input)
      ── match (each batch as its pack source) ── key ── detect (NodeDetector) ──┬── MongoDB sink
                                                                                 └── Kubernetes sink

All sources sit behind one input partition that sleeps until a source's thread notifies it (see
`Inputs`), so an idle agent costs little CPU and a queued fault is taken at once.

The detector shell emits, after each batch, every fault of the node and the ones that changed with a
revision number, so both sinks stay idempotent under replays. Step ids are constants.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
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
from sources import gpu, scan, wake
from sources.journal import Entry

FLOW_ID = "node"
STEP_INPUT = "inputs"  # one Bytewax input holding every source (see Inputs); recovery keys below
STEP_GPU = "gpu"


@dataclass(frozen=True)
class LogInput:
    """A kernel-log input of the node flow: its step id (a recovery contract), the pack source its
    lines are (journal, syslog or kmsg) and the Bytewax source emitting `Entry` items."""

    step_id: str
    kind: str
    source: FixedPartitionedSource[Entry, Any]


class _InputsPartition(StatefulSourcePartition[tuple[int, list[Any]], dict[str, Any]]):
    """Every input of the agent behind one partition: each call asks each input for its batch and hands
    the non-empty ones over as (input position, batch) items.

    While nothing is pending it blocks in `wake.wait` (the GIL released) until an input's thread
    notifies, a timed input is due, or MAX_WAIT_S passes, instead of letting Bytewax poll the inputs:
    an idle agent then wakes a few times a second, not a thousand. After handing a batch over it first
    answers SPIN_CALLS empty calls without blocking, so the worker carries that batch through the
    downstream steps before it looks again (and sleeps if nothing came). Inputs marked `notifies`
    (their threads call `wake.notify()`) are not scheduled by time. The snapshot holds each input's
    own snapshot under its step id."""

    def __init__(self, parts: list[tuple[str, StatefulSourcePartition[Any, Any]]]) -> None:
        self.parts = parts
        self.spin = 0  # empty answers left before the inputs are looked at again

    def next_batch(self) -> list[tuple[int, list[Any]]]:
        if self.spin > 0 and not wake.pending():
            self.spin -= 1  # the worker is carrying the last batch downstream
            return []
        wake.clear()  # before looking: a notify after the look ends the wait below at once
        out = []
        for position, (_step_id, part) in enumerate(self.parts):
            batch = part.next_batch()
            if batch:
                out.append((position, list(batch)))
        if out:
            self.spin = SPIN_CALLS
            return out
        now = dt.datetime.now(dt.UTC)
        due = [
            awake for _, part in self.parts
            if not getattr(part, "notifies", False) and (awake := part.next_awake()) is not None
        ]  # fmt: skip
        timeout = min([MAX_WAIT_S, *((d - now).total_seconds() for d in due)])
        if timeout > 0:
            wake.wait(timeout)
        return []

    def next_awake(self) -> dt.datetime | None:
        return None  # next_batch paces itself

    def snapshot(self) -> dict[str, Any]:
        return {step_id: part.snapshot() for step_id, part in self.parts}

    def close(self) -> None:
        for _, part in self.parts:
            part.close()


class Inputs(FixedPartitionedSource[tuple[int, list[Any]], dict[str, Any]]):
    """Single-partition sources (by step id, in order) as one source; see `_InputsPartition`."""

    def __init__(self, sources: list[tuple[str, FixedPartitionedSource[Any, Any]]]) -> None:
        self.sources = sources

    def list_parts(self) -> list[str]:
        return ["inputs"]

    def build_part(
        self, step_id: str, for_part: str, resume_state: dict[str, Any] | None
    ) -> _InputsPartition:
        resume = resume_state or {}
        parts = []
        for inner_id, source in self.sources:
            names = source.list_parts()
            if len(names) != 1:
                raise ValueError(f"input {inner_id} has partitions {names}; the agent's inputs have one each")
            parts.append((inner_id, source.build_part(inner_id, names[0], resume.get(inner_id))))
        return _InputsPartition(parts)


def _entry_matcher(
    compiled: CompiledPacks, kind: str, position: int
) -> Callable[[list[Entry]], list[scan.Timed]]:
    lag = metrics.SOURCE_LAG.labels(source=kind)

    def match_entries(entries: list[Entry]) -> list[scan.Timed]:
        """The packs' literal prefilter runs once over the whole batch (messages joined by newlines;
        no literal holds one); only the messages it points at are matched one by one."""
        encoded = [entry.record.message.encode("utf-8", "replace") for entry in entries]
        starts = list(itertools.accumulate((len(m) + 1 for m in encoded[:-1]), initial=0))
        chosen = sorted(
            {bisect.bisect_right(starts, s) - 1 for s, _ in compiled.candidate_lines(b"\n".join(encoded))}
        )
        out = []
        for index in chosen:
            rec = entries[index].record
            for hit in compiled.match(kind, rec.message):
                out.append(scan.Timed(rec.ts, (position, 0), hit, rec.message, rec.boot, kind))
        if entries:
            lag.set(max(0.0, time.time() - entries[-1].record.ts))
        return out

    return match_entries


STEP_MATCH = "match"
STEP_DETECT = "detect"
STEP_MONGO = "mongo_out"
STEP_KUBE = "kube_out"
WAIT_S = 0.5
MAX_WAIT_S = 0.25  # the longest an idle agent sleeps (metrics heartbeat, monitor watchdog)
RESEND_S = 60.0  # the detector re-sends the node's state this often (see DetectLogic.on_notify)
RESTART_GAP = 1 << 32  # added to the match sequence on restore (see DetectLogic)
SPIN_CALLS = 8  # empty calls answered without blocking after a batch (see _InputsPartition)


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
        self.notifies = True  # its threads call wake.notify() after queueing
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
            if events:
                wake.notify()

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
                wake.notify()
            finally:
                self.call_started = None
            self.stop.wait(self.polling.interval)

    def next_batch(self) -> list[gpu.GpuEvent]:
        metrics.beat()  # asked at least every MAX_WAIT_S: a stalled dataflow stops beating
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
        return None if not self.queue.empty() else dt.datetime.now(dt.UTC) + dt.timedelta(seconds=MAX_WAIT_S)

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
        now = dt.datetime.now(dt.UTC)
        if resume is None:
            self.detector = NodeDetector(node, compiled)
            self.seen: dict[str, tuple[Any, ...]] = {}
            self.sequence = 0
            self.resend_at = now + dt.timedelta(seconds=RESEND_S)
        else:
            self.detector = NodeDetector.restore(node, compiled, resume["detector"])
            self.seen = {k: tuple(v) for k, v in resume["seen"].items()}
            # Past anything written before the restart: matches processed after the snapshot were
            # written with higher numbers, and those of sources that cannot replay (NVML events) never
            # come back, so counting on from the snapshot would leave later writes below the stored ones.
            self.sequence = int(resume["sequence"]) + RESTART_GAP
            self.resend_at = now  # the sinks get the whole state again at once

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
        self.resend_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=RESEND_S)
        return [NodeUpdate(self.detector.node, faults, changed, events)], op.StatefulLogic.RETAIN

    def notify_at(self) -> dt.datetime | None:
        return self.resend_at

    def on_notify(self) -> tuple[list[NodeUpdate], bool]:
        """The whole state again (nothing changed): a sink that missed an update (API server away, a
        restart) catches up, even on a node where nothing happens."""
        self.resend_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=RESEND_S)
        return [NodeUpdate(self.detector.node, self.detector.snapshot_faults(), [])], op.StatefulLogic.RETAIN

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
    inputs: list[tuple[str, FixedPartitionedSource[Any, Any]]] = [
        (STEP_GPU, GpuEventSource(backend, polling))
    ]
    inputs += [(log.step_id, log.source) for log in logs or []]
    batches = op.input(STEP_INPUT, flow, Inputs(inputs))

    def match_gpu(events: list[gpu.GpuEvent]) -> list[scan.Timed]:
        out = []
        for event in events:
            text = gpu.message(event, devices.get(event.gpu))
            if text is None:
                continue
            metrics.SOURCE_LAG.labels(source="gpu").set(max(0.0, time.time() - event.ts))
            for hit in compiled.match(gpu_source, text):  # the simulator stands in for NVML
                out.append(scan.Timed(event.ts, (0, 0), hit, text, None, gpu_source))
        return out

    matchers = [match_gpu] + [
        _entry_matcher(compiled, log.kind, position) for position, log in enumerate(logs or [], start=1)
    ]
    hits = op.map(STEP_MATCH, batches, lambda item: matchers[item[0]](item[1]))
    keyed = op.map("key", op.filter("nonempty", hits, bool), lambda batch: (node, batch))
    updates = op.stateful(STEP_DETECT, keyed, lambda resume: DetectLogic(node, compiled, resume))
    plain = op.key_rm("unkey", updates)
    for step_id, sink in sinks.items():
        op.output(step_id, plain, sink)
    return flow
