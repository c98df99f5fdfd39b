"""The replay dataflow: file sources -> scan (prefilter, parse, match) -> per-node detection -> sinks.

    files ──scan──┬─ hits per node ── key ── detect (NodeDetector per node) ── faults sink
                  └─ stats and diagnostics ───────────────────────────────── info sink

Scanning happens on the worker that read the chunk; only the few matched lines, grouped per node and
chunk, cross the key exchange.  Step ids are constants: they are the recovery contract.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink

from dataflows import runner
from faultline.models import Fault
from patterns.compiler import CompiledPacks
from patterns.detectors import Counters, NodeDetector
from sinks.collect import CallbackSink
from sources import files, scan
from sources.replay import ProgressFn, ReplaySource

FLOW_ID = "replay"
STEP_INPUT = "files"
STEP_SCAN = "scan"
STEP_SPLIT = "split"
STEP_KEY = "key"
STEP_DETECT = "detect"
STEP_FAULTS = "faults_out"
STEP_INFO = "info_out"

EPOCH_INTERVAL_S = 10.0


@dataclass(frozen=True)
class Outputs:
    faults: DynamicSink[Any]
    info: DynamicSink[Any]


class DetectLogic(op.StatefulLogic[tuple[str, list[scan.Timed]], tuple[list[Fault], Counters], None]):
    """Thin shell around NodeDetector: feed each chunk's hits in time order, emit faults at EOF."""

    def __init__(self, compiled: CompiledPacks) -> None:
        self.compiled = compiled
        self.detector: NodeDetector | None = None

    def on_item(self, value: tuple[str, list[scan.Timed]]) -> tuple[list[Any], bool]:
        node, batch = value
        if self.detector is None:
            self.detector = NodeDetector(node, self.compiled)
        observe = self.detector.observe
        batch.sort(key=lambda t: (t.ts, t.order))
        for t in batch:
            observe(t.ts, t.hit, t.message, t.boot)
        return [], op.StatefulLogic.RETAIN

    def on_eof(self) -> tuple[list[tuple[list[Fault], Counters]], bool]:
        if self.detector is None:
            return [], op.StatefulLogic.DISCARD
        return [(self.detector.snapshot_faults(), self.detector.counters)], op.StatefulLogic.DISCARD

    def snapshot(self) -> None:
        return None  # replay runs without recovery; the input is replayed from the start


def build(
    groups: list[list[files.FileInfo]],
    compiled: CompiledPacks,
    outputs: Outputs,
    *,
    node_override: str | None = None,
    progress: ProgressFn | None = None,
) -> Dataflow:
    flow = Dataflow(FLOW_ID)
    chunks = op.input(STEP_INPUT, flow, ReplaySource(groups, progress))

    def scan_chunk(chunk: files.Chunk) -> list[tuple[Any, ...]]:
        result = scan.scan(chunk, compiled, node_override)
        out: list[tuple[Any, ...]] = [("hits", node, batch) for node, batch in result.by_node.items()]
        out.append(("info", result.stats, result.diags))
        return out

    scanned = op.flat_map(STEP_SCAN, chunks, scan_chunk)
    split = op.branch(STEP_SPLIT, scanned, lambda item: item[0] == "hits")
    keyed = op.map(STEP_KEY, split.trues, lambda item: (item[1], (item[1], item[2])))
    detected = op.stateful(STEP_DETECT, keyed, lambda _resume: DetectLogic(compiled))
    op.output(STEP_FAULTS, detected, outputs.faults)
    op.output(STEP_INFO, split.falses, outputs.info)
    return flow


@dataclass
class ReplayResult:
    faults: list[Fault] = field(default_factory=list)
    stats: scan.Stats = field(default_factory=scan.Stats)
    counters: Counters = field(default_factory=Counters)
    diags: list[str] = field(default_factory=list)
    seconds: float = 0.0
    regex_timeouts: int = 0


def sort_key(fault: Fault) -> tuple[str, str, str, str]:
    return (fault.node, fault.entity.type, fault.entity.id, fault.code)


def run(
    groups: list[list[files.FileInfo]],
    compiled: CompiledPacks,
    *,
    workers: int = 1,
    node_override: str | None = None,
    progress: ProgressFn | None = None,
    on_diag: Callable[[str], None] | None = None,
) -> ReplayResult:
    """Run the replay dataflow in this process with `workers` worker threads and gather its results."""
    result = ReplayResult()

    def take_faults(items: Iterable[tuple[str, tuple[list[Fault], Counters]]]) -> None:
        for _node, (faults, counters) in items:
            result.faults.extend(faults)
            for name in counters.__dataclass_fields__:
                setattr(result.counters, name, getattr(result.counters, name) + getattr(counters, name))

    def take_info(items: Iterable[tuple[str, scan.Stats, list[str]]]) -> None:
        for _tag, stats, diags in items:
            result.stats.add(stats)
            result.diags.extend(diags)
            if on_diag is not None:
                for d in diags:
                    on_diag(d)

    outputs = Outputs(CallbackSink(take_faults), CallbackSink(take_info))
    flow = build(groups, compiled, outputs, node_override=node_override, progress=progress)
    started = time.perf_counter()
    timeouts_before = compiled.timeouts
    epoch = timedelta(seconds=EPOCH_INTERVAL_S)
    runner.run(
        flow, workers=max(1, workers), epoch_interval=epoch, handle_signals=False
    )  # Ctrl-C: interrupted
    result.seconds = time.perf_counter() - started
    result.regex_timeouts = compiled.timeouts - timeouts_before
    result.stats.files = sum(len(g) for g in groups)
    result.faults.sort(key=sort_key)
    return result
