"""The cluster analyzer's own work without a store, in 1 process and in N: how it scales.

    python -m benchmarks.analyzer_scale                       # 200,000 events, 1 process then 2, 3 times
    python -m benchmarks.analyzer_scale --events 50000 --processes 1 2 3

`benchmarks/analyzer.py` measures the analyzer on FerretDB, which shares this machine's cores: there the
store's share of the CPU bounds what a second process can add. Here process 0 holds in memory the feed
documents the store would hand it (the same traffic: 16 events a document, the records compressed, with
their newest time) and hands them on as the feed source does (reads of 1,024 documents, cut into chunks
for the workers, then a tick); every process decodes, routes and keeps windows in the analyzer's own
flow (`dataflows.cluster.build`, Bytewax's cluster mode as `faultline analyzer --processes` runs it),
with the built-in cluster patterns and the benchmark's pack. Derived faults and checkpoints are counted,
not written. Timed in process 0 from its first read to the end of the flow in every process (the
processes' start-up left out); the CPU is every process's over the whole run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import bson
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from benchmarks.analyzer import PACK, traffic
from cli.analyzer import CHUNKS_PER_WORKER
from dataflows import cluster as cluster_flow
from dataflows import runner
from faultline import store
from faultline.store.base import CODEC
from faultline.store.faults import event_doc
from faultline.store.feed import ZLEVEL, newest_of
from patterns import cluster
from sources.feed import Doc, Item, handed_on

BATCH = 16  # events a feed document (an agent's write)
READ = 1024  # feed documents a read (the analyzer's default `batch`)


def documents(events: int) -> list[store.FeedBatch]:
    """The feed documents of `events` events of the benchmark's traffic, as the store holds them."""
    now = dt.datetime.now(dt.UTC)
    docs = [event_doc(e) for e in traffic(events, now - dt.timedelta(hours=1))]
    out = []
    for n, i in enumerate(range(0, len(docs), BATCH), start=1):
        part = docs[i : i + BATCH]
        body = zlib.compress(bson.encode({"events": part, "faults": []}, codec_options=CODEC), ZLEVEL)
        out.append(
            store.FeedBatch(n, now, bson.Binary(body), str(part[0]["node"]), newest_of(part, []), True)
        )
    return out


class _Reads(StatefulSourcePartition[Item, None]):
    def __init__(self, docs: list[store.FeedBatch], chunks: int, started: list[float]) -> None:
        self.docs, self.chunks, self.started = docs, chunks, started
        self.at = self.read = self.seq = 0
        self.watermark = float("-inf")

    def next_batch(self) -> list[Item]:
        if not self.started:
            self.started.append(time.perf_counter())
        if self.at >= len(self.docs):
            raise StopIteration
        taken = self.docs[self.at : self.at + READ]
        self.at += len(taken)
        docs: list[Doc] = []
        for b in taken:
            self.seq += 1
            docs.append((self.seq, self.watermark, float("inf"), b))
            self.watermark = max(self.watermark, b.newest)
        out = handed_on(self.read, docs, self.chunks, self.seq, self.watermark, [])
        self.read += 1
        return out

    def snapshot(self) -> None:
        return None


class MemoryFeed(FixedPartitionedSource[Item, None]):
    """The feed, from memory, read in process 0 only."""

    def __init__(self, docs: list[store.FeedBatch], chunks: int, reader: bool) -> None:
        self.docs, self.chunks, self.reader = docs, chunks, reader
        self.started: list[float] = []

    def list_parts(self) -> list[str]:
        return ["memory"] if self.reader else []

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _Reads:
        return _Reads(self.docs, self.chunks, self.started)


class _Count(StatelessSinkPartition[Any]):
    def write_batch(self, items: list[Any]) -> None:
        pass


class Discard(DynamicSink[Any]):
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Count:
        return _Count()


def child(index: int, addresses: list[str], events: int) -> None:
    """One process of the run; process 0 prints the seconds from its first read to the flow's end."""
    with tempfile.TemporaryDirectory(prefix="faultline-bench-scale-") as tmp:
        pack = Path(tmp) / "bench.yaml"
        pack.write_text(PACK)
        packs = cluster.load([pack])
    workers = max(1, len(addresses))
    docs = documents(events) if index == 0 else []
    source = MemoryFeed(docs, 1 if workers == 1 else workers * CHUNKS_PER_WORKER, reader=index == 0)
    flow = cluster_flow.build(packs, source, Discard(), checkpoints={}, checkpoint_interval=5.0)
    runner.run(flow, process_id=index if len(addresses) > 1 else None,
               addresses=addresses if len(addresses) > 1 else None, handle_signals=False)  # fmt: skip
    if index == 0:
        print(f"took {time.perf_counter() - source.started[0]:.6f}", flush=True)


def run(processes: int, events: int) -> tuple[float, float]:
    """Events/s and the cores used by `processes` processes."""
    from cli.analyzer import _free_port  # noqa: PLC0415 - the analyzer's own way

    addresses = [f"127.0.0.1:{_free_port()}" for _ in range(processes)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.analyzer_scale",
                "--child",
                str(i),
                "--events",
                str(events),
                "--addresses",
                ",".join(addresses),
            ],
            stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
            text=True,
        )
        for i in range(processes)
    ]
    out, _ = procs[0].communicate()
    for p in procs[1:]:
        p.wait(60)
    wall = time.perf_counter() - start
    if any(p.returncode for p in procs):
        raise SystemExit(f"a process of the {processes}-process run failed: {[p.returncode for p in procs]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    took = float(out.strip().rsplit(" ", 1)[1])
    return events / took, cpu / wall


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each process count")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--addresses", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, [a for a in args.addresses.split(",") if a], args.events)
        return
    runs: dict[int, list[tuple[float, float]]] = {n: [] for n in args.processes}
    for _ in range(args.repeat):  # interleaved, so a slow stretch of the machine touches every count
        for n in args.processes:
            runs[n].append(run(n, args.events))
    rates = {n: statistics.median(r for r, _ in got) for n, got in runs.items()}
    one = rates[args.processes[0]]
    print(f"\ncluster analyzer's own work (no store), {args.events:,} events, {os.cpu_count()} cores, "
          f"median of {args.repeat}:")  # fmt: skip
    for n, got in runs.items():
        each = ", ".join(f"{r:.0f}" for r, _ in got)
        cores = statistics.median(c for _, c in got)
        print(f"  {n} process{'es' if n > 1 else '':2} {rates[n]:>10.0f} events/s  {rates[n] / one:5.2f}x  "
              f"(each run: {each}; {cores:.2f} cores busy, start-up included)")  # fmt: skip


if __name__ == "__main__":
    main()
