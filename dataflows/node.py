"""The node agent's dataflow: GPU backend events, kernel log, NIC and gRPC ingest -> packs -> per-node
detection -> MongoDB and Kubernetes.

    inputs (gpu, journal | syslog | kmsg, nic, grpc: one Bytewax input, batches tagged by input)
      ── match (each batch as its pack source) ── key ── detect (NodeDetector) ──┬── MongoDB sink
                                                                                 └── Kubernetes sink

All sources sit behind one input partition that sleeps until a source's thread notifies it
(`sources.inputs`), so an idle agent costs little CPU and a queued fault is taken at once; the GPU
backend's source is `sources.gpu_source`, which also re-reads the GPUs of repairs the janitor verified
on this node (`sources.repairs`: how a GPU reset is recognised on real hardware).

The detector shell emits, after each batch, every fault of the node and the ones that changed with a
revision number, so both sinks stay idempotent under replays. Step ids are constants.

Health samples (the agent's `health_samples`: each GPU's fields as read, for the cluster analyzer's
anomaly scores) are no observation: the match step makes each one a healthy event of its own code
(`health_sample`), which the detector hands to the sinks with the batch's events without observing it,
so a sample never opens, counts or resolves a fault.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource
from bytewax.outputs import DynamicSink

from faultline import metrics
from faultline.models import (
    HEALTH_SAMPLE_CODE,
    Action,
    Component,
    Entity,
    HealthEvent,
    NodeUpdate,
    event_id,
    utc_from_epoch,
)
from patterns.compiler import CompiledPacks
from patterns.detectors import NodeDetector
from sources import entry_match, gpu, scan
from sources.gpu_source import GpuEventSource, GpuPolling
from sources.inputs import Inputs, LogInput
from sources.journal import Entry
from sources.repairs import Notices

FLOW_ID = "node"
STEP_INPUT = "inputs"  # one Bytewax input holding every source (sources.inputs); recovery keys below
STEP_GPU = "gpu"


def _entry_matcher(
    compiled: CompiledPacks, kind: str, position: int
) -> Callable[[list[Entry]], list[scan.Timed]]:
    lag = metrics.SOURCE_LAG.labels(source=kind)
    untrusted = metrics.UNTRUSTED_LINES.labels(source=kind)
    matcher = entry_match.EntryMatcher(compiled, kind, position)  # prefilter, records, origins

    def match_entries(entries: list[Entry]) -> list[scan.Timed]:
        before = matcher.untrusted
        out = matcher(entries)
        if matcher.untrusted != before:
            untrusted.inc(matcher.untrusted - before)
        if entries:
            lag.set(max(0.0, time.time() - entries[-1].record.ts))
        return out

    return match_entries


STEP_MATCH = "match"
STEP_DETECT = "detect"
STEP_MONGO = "mongo_out"
STEP_KUBE = "kube_out"
RESEND_S = 60.0  # the detector re-sends the node's state this often (see DetectLogic.on_notify)
RESTART_GAP = 1 << 32  # added to the match sequence on restore (see DetectLogic)
SAMPLE_CODE = HEALTH_SAMPLE_CODE  # a health sample's code and check: no pattern's, no fault's
SAMPLE_CHECK = "gpu-health-sample"
EVENT_MESSAGE = 1024  # characters of the matched line a health event keeps (a line read may be 64 KiB)
Matched = scan.Timed | HealthEvent  # what the match step hands the detector: matches, and health samples


def health_sample(
    node: str, source: str, device: gpu.GpuDevice, event: gpu.GpuEvent, boot_id: str = ""
) -> HealthEvent:
    """The stored record of one GPU's health sample: healthy, action NONE, on the GPU by PCI bus id,
    with every field read as a number in metadata (`ecc_sbe_volatile: "12"`, `temperature: "45"`), the
    GPU's UUID (`gpu_uuid`, the analyzer's key for it across reboots) and the node's boot id (`boot_id`:
    a counter of another boot was reset, not lowered). Its id is deterministic, like a match's."""
    observed = utc_from_epoch(event.ts)
    metadata = {name: str(value) for name, value in event.fields}
    metadata["source"] = source
    if device.uuid:
        metadata["gpu_uuid"] = device.uuid
    if boot_id:
        metadata["boot_id"] = boot_id
    return HealthEvent(
        id=event_id(node, source, "GPU", device.pci, SAMPLE_CODE, observed), node=node,
        component=Component.GPU, check=SAMPLE_CHECK, code=SAMPLE_CODE,
        entities=(Entity(type="GPU", id=device.pci),), healthy=True, fatal=False, action=Action.NONE,
        message=f"GPU {device.pci} health sample ({len(event.fields)} fields)", metadata=metadata,
        generated_at=dt.datetime.now(dt.UTC), observed_at=observed,
    )  # fmt: skip


def health_event(
    detector: NodeDetector, t: scan.Timed, gpu_uuids: Mapping[str, str] | None = None
) -> HealthEvent:
    """The stored record of one match (its id is deterministic, so a replay stores it once). A GPU's
    event carries the GPU's UUID (`gpu_uuids`: PCI bus id -> UUID) in `metadata.gpu_uuid`: the cluster
    analyzer follows a GPU by it across reboots and nodes."""
    hit = t.hit
    observed = utc_from_epoch(t.ts)
    entities = (Entity(type=hit.entity_type, id=hit.entity_id),) if hit.entity_id else ()
    metadata = {"source": t.source}
    uuid = (gpu_uuids or {}).get(hit.entity_id) if hit.entity_type == "GPU" else None
    if uuid:
        metadata["gpu_uuid"] = uuid
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
        message=t.message[:EVENT_MESSAGE],
        metadata=metadata,
        generated_at=dt.datetime.now(dt.UTC),
        observed_at=observed,
    )


def revision_base() -> int:
    """Revisions an agent starting now writes above: milliseconds since the epoch times 2**20 (an earlier
    agent would need over a million matches per millisecond of its life to get past it; about 2**61 today,
    inside BSON's int64)."""
    return int(time.time() * 1000) << 20


class DetectLogic(op.StatefulLogic[list[Matched], NodeUpdate, dict[str, Any]]):
    """The node's detector, its faults' last written signatures and the number of matches observed so
    far; all of it is the recovery snapshot.

    A changed fault is written with that number as its revision: it depends only on how far into the
    input the detector is, not on how the input was cut into batches, so a restarted agent that replays
    from its snapshot (in other batches) reaches the same revisions, and the store keeps the newest.
    The count starts at the wall clock's milliseconds times 2**20 (`revision_base`), not at 0: an agent
    that starts with no snapshot (its state directory lost, a new node of the same name) must still write
    above what an earlier agent of the node stored, or its faults would be ignored by the store."""

    def __init__(
        self, node: str, compiled: CompiledPacks, resume: dict[str, Any] | None = None,
        gpu_uuids: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        now = dt.datetime.now(dt.UTC)
        self.gpu_uuids = dict(gpu_uuids or {})
        if resume is None:
            self.detector = NodeDetector(node, compiled)
            self.seen: dict[str, tuple[Any, ...]] = {}
            self.sequence = revision_base()
            self.resend_at = now + dt.timedelta(seconds=RESEND_S)
        else:
            self.detector = NodeDetector.restore(node, compiled, resume["detector"])
            self.seen = {k: tuple(v) for k, v in resume["seen"].items()}
            # Past anything written before the restart: matches processed after the snapshot were
            # written with higher numbers, and those of sources that cannot replay (NVML events) never
            # come back, so counting on from the snapshot would leave later writes below the stored ones.
            self.sequence = max(int(resume["sequence"]) + RESTART_GAP, revision_base())
            self.resend_at = now  # the sinks get the whole state again at once

    def on_item(self, value: list[Matched]) -> tuple[list[NodeUpdate], bool]:
        events = []
        matches = [t for t in value if isinstance(t, scan.Timed)]
        for t in sorted(matches, key=lambda t: (t.ts, t.order)):
            self.detector.observe(t.ts, t.hit, t.message, t.boot)
            self.sequence += 1
            metrics.EVENTS.labels(code=t.hit.code).inc()
            events.append(health_event(self.detector, t, self.gpu_uuids))
        events += [e for e in value if isinstance(e, HealthEvent)]  # health samples: stored, not observed
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
    stop: threading.Event | None = None,
    repairs: Notices | None = None,
) -> Dataflow:
    """`sinks` by step id (STEP_MONGO, STEP_KUBE): each receives every NodeUpdate. `logs` are kernel-log
    inputs (journal, syslog file, kmsg) whose entries are matched as their pack source. Setting `stop`
    ends the flow in order once what was read is handled (the last snapshot is written). `repairs`: the
    node's verified repairs (`sources.repairs.from_store`), whose GPUs the GPU source re-reads."""
    devices = {d.index: d for d in backend.devices()}
    flow = Dataflow(FLOW_ID)
    gpu_events = GpuEventSource(backend, polling, repairs)
    inputs: list[tuple[str, FixedPartitionedSource[Any, Any]]] = [(STEP_GPU, gpu_events)]
    inputs += [(log.step_id, log.source) for log in logs or []]
    batches = op.input(STEP_INPUT, flow, Inputs(inputs, stop))

    def match_gpu(events: list[gpu.GpuEvent]) -> list[Matched]:
        out: list[Matched] = []
        for event in events:
            if event.kind == "sample":
                if event.gpu in devices:
                    out.append(health_sample(node, gpu_source, devices[event.gpu], event, gpu_events.boot_id))
                continue
            text = gpu.message(event, devices.get(event.gpu))
            if text is None:
                continue
            metrics.SOURCE_LAG.labels(source="gpu").set(max(0.0, time.time() - event.ts))
            for hit in compiled.match(gpu_source, text):  # the simulator stands in for NVML
                out.append(scan.Timed(event.ts, (0, 0), hit, text, None, gpu_source))
        return out

    matchers: list[Callable[[Any], list[Any]]] = [match_gpu] + [
        _entry_matcher(compiled, log.kind, position) for position, log in enumerate(logs or [], start=1)
    ]
    hits = op.map(STEP_MATCH, batches, lambda item: matchers[item[0]](item[1]))
    keyed = op.map("key", op.filter("nonempty", hits, bool), lambda batch: (node, batch))
    uuids = {d.pci: d.uuid for d in devices.values() if d.uuid}
    updates = op.stateful(STEP_DETECT, keyed, lambda resume: DetectLogic(node, compiled, resume, uuids))
    plain = op.key_rm("unkey", updates)
    for step_id, sink in sinks.items():
        op.output(step_id, plain, sink)
    return flow
