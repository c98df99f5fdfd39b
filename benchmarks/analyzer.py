"""The cluster analyzer's speed on FerretDB, beside the goals and NVSentinel's published figures.

    python benchmarks/analyzer.py                        # history 10k and 1M, 200k events each, PostgreSQL
    python benchmarks/analyzer.py --history 10000 --events 5000 --store sqlite   # a quicker look

1. Throughput, and its cost as the stored history grows: `--history` health events are stored first (as
   old history: in `health_events` only, what a long-running cluster holds), then `--events` events are
   written as the agents write them (`Store.record_batch`, `--batch` events a write, from 8 threads; one
   in ten an XID 79 of a GPU of its own, so windows are made), between a first and a last write that
   each complete a window of the benchmark's pack, and a `faultline analyzer` process is started (its
   settings' defaults: a checkpoint every 5 s); the time from the first derived fault's write to the
   last one's gives events/s (its start-up, and its other processes', left out). Done once per history size, so the per-event cost is printed at
   both ends.
2. Latency: with an analyzer running, events are written at `--rate` events/s for `--seconds`, a write
   every 10 ms; every fifth write primes a fresh GPU with two XID 79s and the next carries its third,
   which completes a window of the benchmark's pack: the time from that write until its derived fault is
   in `faults` is measured (p50, p99).
3. False alarms: `--node-days` of healthy simulated telemetry (non-fatal application XIDs now and then,
   NIC flaps, each node on its own) replayed through the built-in cluster patterns and the benchmark's
   pack, in one process (`patterns.cluster.replay`): the derived faults it makes, and that rate.
4. The feed's concurrent writers (`--writers-only`, alone): 1, then 52 agents at once (a thread and a
   connection each, its own node), 10 batches of `--batch` events each: insert commands sent to `feed`
   per feed document (1.00: no agent raced another for a number), and batches/s altogether.

5. Scale-out: the throughput run of the first history size again with `faultline analyzer --processes
   2` (Bytewax's cluster mode on this machine: one process reads the feed, both decode, route and keep
   windows), and the ratio of the two. The CPU each run used is printed beside it (the analyzer's
   processes, the store, the machine), as the store shares this machine's cores
   (`benchmarks/analyzer_scale.py` measures the analyzer's own work without a store).

Each throughput run starts once the machine has settled after the writes (the store's own background
work, e.g. PostgreSQL's autovacuum, would otherwise count against the run). NVSentinel's figures (its
analyzer runs Mongo aggregation pipelines per event against history): about 57 events/s, 1.9 s per
event at a million stored events.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pymongo
from pymongo import monitoring

from devtools.mongo import BACKENDS, LocalMongo
from faultline import store
from faultline.models import Action, Component, Entity, HealthEvent, event_id, fault_id
from faultline.store.feed import FEED
from patterns import cluster

PACK = """
pack: bench
patterns:
  - id: bench-gpu-repeat
    scope: cluster
    description: one GPU failing three times within an hour
    match: {codes: [XID-79]}
    window: {key: [gpu], within: 1h, count: 3}
    fault: {code: BENCH-GPU-REPEAT, component: GPU, entity: {type: GPU-UUID, id: "{gpu}"}, fatal: true}
    examples:
      match:
        - records:
            - {node: n1, code: XID-79, metadata: {gpu_uuid: G}}
            - {at: 1m, node: n1, code: XID-79, metadata: {gpu_uuid: G}}
            - {at: 2m, node: n2, code: XID-79, metadata: {gpu_uuid: G}}
      no_match:
        - records:
            - {node: n1, code: XID-79, metadata: {gpu_uuid: G}}
            - {at: 2h, node: n1, code: XID-79, metadata: {gpu_uuid: G}}
"""
NOISE = ("XID-13", "XID-31", "XID-43", "XID-45", "NIC-LINK-DOWN", "NIC-LINK-UP")


def ev(node: str, i: int, code: str, t: dt.datetime, uuid: str = "") -> HealthEvent:
    gpu = code.startswith("XID")
    return HealthEvent(
        id=event_id(node, "bench", "GPU" if gpu else "NIC", str(i), code, t), node=node,
        component=Component.GPU if gpu else Component.NIC, check="bench", code=code,
        entities=(Entity(type="GPU" if gpu else "NIC", id=f"0000:{i % 256:02x}:00"),), healthy=False,
        fatal=code == "XID-79", action=Action.RESTART_BM if code == "XID-79" else Action.NONE,
        metadata={"gpu_uuid": uuid} if uuid else {}, generated_at=t, observed_at=t,
    )  # fmt: skip


def traffic(n: int, start: dt.datetime, nodes: int = 1000) -> list[HealthEvent]:
    """`n` events over `nodes`: every tenth an XID 79 of a GPU of its own (a window each, none firing),
    the others of kinds no pattern of the benchmark's pack counts."""
    return [
        ev(f"node-{i % nodes:04d}", i, "XID-79", start + dt.timedelta(milliseconds=i), f"G{i}") if i % 10 == 0
        else ev(f"node-{i % nodes:04d}", i, NOISE[i % len(NOISE)], start + dt.timedelta(milliseconds=i))
        for i in range(n)
    ]  # fmt: skip


MARK_NODE = "a-mark"  # the feed's first writer by name: its first document is read first (the reader
# starts at the earliest of the first writers' next documents, and reads the others' earlier ones later)


def marker(gpu: str, at: dt.datetime) -> list[HealthEvent]:
    """Three XID 79s of GPU `gpu` on one node: the benchmark pack's window fires on the third, a derived
    fault (`marked`) whose write says when the analyzer got there."""
    return [ev(MARK_NODE, 10**9 + k, "XID-79", at + dt.timedelta(milliseconds=k), gpu) for k in range(3)]


def marked(gpu: str) -> str:
    return fault_id(MARK_NODE, "GPU-UUID", gpu, "BENCH-GPU-REPEAT")


def write(st: store.Store, events: list[HealthEvent], batch: int, threads: int = 8) -> None:
    chunks = [events[i : i + batch] for i in range(0, len(events), batch)]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda c: st.record_batch(c, []), chunks))


def history(st: store.Store, n: int, start: dt.datetime) -> None:
    """`n` stored events that are history: in `health_events`, not in the feed."""
    for i in range(0, n, 10_000):
        st.record_events(ev(f"old-{j % 1000:04d}", j, NOISE[j % 4], start + dt.timedelta(milliseconds=j))
                         for j in range(i, min(n, i + 10_000)))  # fmt: skip


def analyzer(
    mongo: LocalMongo, database: str, pack: Path, log: Path, processes: int = 1
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "faultline", "analyzer", "--mongodb-uri", mongo.uri, "--database", database,
         "--pack", str(pack), "--no-node-labels", "--poll", "50ms", "--owner", "bench",
         "--processes", str(processes)],
        stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@dataclass(frozen=True)
class Cpu:
    """CPU seconds over a stretch of wall time: the analyzer's process, this benchmark's, the machine's
    (every core: the store's FerretDB and PostgreSQL are most of the rest)."""

    wall: float
    analyzer: float
    bench: float
    machine: float

    @property
    def store(self) -> float:
        return max(0.0, self.machine - self.analyzer - self.bench)


def _ticks() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    busy = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """CPU seconds of process `pid` and of its children (the analyzer's other processes)."""
    total = 0.0
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if stat_file.parent.name == str(pid) or stat[1] == str(pid):  # itself, or its parent is it
            total += (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def settle(cores: float = 0.25, longest: float = 60.0) -> None:
    """Wait until the machine is nearly idle for a second (at most `longest` seconds)."""
    deadline = time.monotonic() + longest
    while time.monotonic() < deadline:
        before = _ticks()
        time.sleep(1.0)
        if _ticks() - before < cores:
            return


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def throughput(
    mongo: LocalMongo, pack: Path, work: Path, stored: int, events: int, batch: int, processes: int = 1
) -> tuple[float, Cpu]:
    database = f"bench_analyzer_{stored}_{processes}"
    st = store.connect(mongo.uri, database, timeout=30)
    try:
        st.db.client.drop_database(database)
        st.ensure_indexes()
        now = dt.datetime.now(dt.UTC)
        history(st, stored, now - dt.timedelta(days=3))
        start_at = now - dt.timedelta(hours=1)
        write(st, marker("START", start_at - dt.timedelta(seconds=1)), batch)  # first in the feed
        write(st, traffic(events, start_at), batch)
        write(st, marker("END", start_at + dt.timedelta(milliseconds=events + 1000)), batch)  # last
        settle()
        log = work / f"throughput-{stored}-{processes}.log"
        proc = analyzer(mongo, database, pack, log, processes)
        try:
            for gpu in ("START", "END"):  # timed from the first derived fault: not its start-up
                while st.faults.find_one({"_id": marked(gpu)}, {"_id": 1}) is None:
                    if proc.poll() is not None:
                        raise SystemExit(f"the analyzer exited: see {log}")
                    time.sleep(0.005)
                if gpu == "START":
                    start = time.monotonic()
                    cpu0 = (_proc_cpu(proc.pid), _self_cpu(), _ticks())
            took = time.monotonic() - start
            cpu = Cpu(took, _proc_cpu(proc.pid) - cpu0[0], _self_cpu() - cpu0[1], _ticks() - cpu0[2])
        finally:
            proc.terminate()
            proc.wait(30)
        st.db.client.drop_database(database)
        return events / took, cpu
    finally:
        st.close()


def latency(mongo: LocalMongo, pack: Path, work: Path, rate: float, seconds: float) -> list[float]:
    database = "bench_analyzer_latency"
    st = store.connect(mongo.uri, database, timeout=30)
    st.db.client.drop_database(database)
    st.ensure_indexes()
    proc = analyzer(mongo, database, pack, work / "latency.log")
    out: list[float] = []
    try:
        while (status := st.analyzer_status(cluster.PARTITIONS)) is None or status.owner is None:
            time.sleep(0.1)  # until it holds the lease
        # every 10 ms a write of rate/100 events (as agents batch); every fifth one also primes a fresh
        # GPU with two XID 79s, and the next carries its third, whose derived fault is awaited
        step = 0.01
        per = max(1, round(rate * step))
        start, n, gpu, k = time.monotonic(), 0, 0, 0
        waiting: dict[str, float] = {}
        primed: str | None = None
        while time.monotonic() - start < seconds:
            now = dt.datetime.now(dt.UTC)
            batch = [ev(f"node-{(n + j) % 100}", n + j, NOISE[(n + j) % 4], now) for j in range(per)]
            n += per
            third = None
            if primed is not None:
                third = ev("node-2", n, "XID-79", now, primed)
                batch.append(third)
            elif k % 5 == 0:
                primed = f"GPU-{gpu}"
                gpu += 1
                batch += [
                    ev(f"node-{j}", n + j, "XID-79", now - dt.timedelta(seconds=2 - j), primed)
                    for j in range(2)
                ]
            st.record_batch(batch, [])
            if third is not None:
                waiting[fault_id("node-2", "GPU-UUID", str(primed), "BENCH-GPU-REPEAT")] = time.monotonic()
                primed = None
            k += 1
            for fid in [f for f in waiting if st.faults.find_one({"_id": f}, {"_id": 1}) is not None]:
                out.append(time.monotonic() - waiting.pop(fid))
            time.sleep(max(0.0, start + k * step - time.monotonic()))
        deadline = time.monotonic() + 30
        while waiting and time.monotonic() < deadline:
            for fid in [f for f in waiting if st.faults.find_one({"_id": f}, {"_id": 1}) is not None]:
                out.append(time.monotonic() - waiting.pop(fid))
            time.sleep(0.01)
        if waiting:
            raise SystemExit(f"{len(waiting)} derived faults never came")
    finally:
        proc.terminate()
        proc.wait(30)
        st.db.client.drop_database(database)
        st.close()
    return out


class _FeedInserts(monitoring.CommandListener):
    """Counts the insert commands sent to `feed` (tries, duplicates included)."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "insert" and event.command.get("insert") == FEED:
            with self.lock:
                self.n += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def writers(mongo: LocalMongo, count: int, batches: int, batch: int) -> tuple[float, float]:
    """`count` agents at once (a thread and a connection each, its own node), each writing `batches`
    batches of `batch` events: inserts sent to `feed` per feed document, and batches/s altogether."""
    database = f"bench_feed_writers_{count}"
    st = store.connect(mongo.uri, database, timeout=30)
    st.db.client.drop_database(database)
    st.ensure_indexes()
    listener = _FeedInserts()
    now = dt.datetime.now(dt.UTC)
    agents = [store.Store(pymongo.MongoClient(mongo.uri, event_listeners=[listener])[database])
              for _ in range(count)]  # fmt: skip
    start_line = threading.Barrier(count)

    def agent(w: int) -> None:
        start_line.wait()
        for b in range(batches):
            agents[w].record_batch(
                [ev(f"node-{w:04d}", b * batch + i, NOISE[i % 4], now) for i in range(batch)], []
            )

    try:
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            list(pool.map(agent, range(count)))
        took = time.monotonic() - start
        docs = st.feed.count_documents({})
    finally:
        for a in agents:
            a.db.client.close()
        st.db.client.drop_database(database)
        st.close()
    return listener.n / docs, count * batches / took


def false_alarms(packs: cluster.ClusterPacks, node_days: int, seed: int = 7) -> tuple[int, int]:
    """Derived faults from healthy telemetry: per node and day a few application XIDs (a job's own
    bugs, on one node) and NIC flaps; records, derived faults."""
    rng = random.Random(seed)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()
    nodes = max(1, node_days // 30)
    records = []
    for d in range(node_days):
        node = f"node-{d % nodes:04d}"
        day = start + (d // nodes) * 86400
        for k in range(rng.randint(0, 6)):
            code = rng.choice(NOISE)
            records.append(cluster.Record(
                position=0, kind="events", id=f"{d}-{k}", t=day + rng.uniform(0, 86400), node=node, code=code,
                component="GPU" if code.startswith("XID") else "NIC", entity_type="GPU",
                entity_id=f"0000:{rng.randint(0, 7):02x}:00", metadata={"gpu_uuid": f"{node}-{rng.randint(0, 7)}"},
                labels={"topology.kubernetes.io/zone": f"zone-{d % 3}"},
            ))  # fmt: skip
    records.sort(key=lambda r: r.t)
    ordered = [cluster.Record(**{**{s: getattr(r, s) for s in cluster.Record.__slots__}, "position": (i + 1) << 16})
               for i, r in enumerate(records)]  # fmt: skip
    return len(ordered), len(cluster.replay(packs, ordered))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--history", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=16, help="events per agent write")
    parser.add_argument("--rate", type=float, default=1000.0, help="events/s in the latency run")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the latency run")
    parser.add_argument("--node-days", type=int, default=1000)
    parser.add_argument("--store", choices=BACKENDS, default="postgresql")
    parser.add_argument("--writers-only", action="store_true",
                        help="only the feed's concurrent writers: 1 and 52 agents, 10 batches each")  # fmt: skip
    args = parser.parse_args()
    if args.writers_only:
        with LocalMongo(backend=args.store) as mongo:
            for count in (1, 52):
                inserts, rate = writers(mongo, count, 10, args.batch)
                print(f"feed, {count} writers x 10 batches on FerretDB ({args.store}): "
                      f"{inserts:.2f} inserts a feed document, {rate:.0f} batches/s")  # fmt: skip
        return
    with tempfile.TemporaryDirectory(prefix="faultline-bench-analyzer-") as tmp:
        work = Path(tmp)
        pack = work / "bench.yaml"
        pack.write_text(PACK)
        records, derived = false_alarms(cluster.load([pack]), args.node_days)
        with LocalMongo(backend=args.store) as mongo:
            runs = {h: throughput(mongo, pack, work, h, args.events, args.batch) for h in args.history}
            two = throughput(mongo, pack, work, args.history[0], args.events, args.batch, processes=2)
            lat = sorted(latency(mongo, pack, work, args.rate, args.seconds))
    p50 = statistics.median(lat) * 1000
    p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))] * 1000
    print(f"\ncluster analyzer, one process, on FerretDB ({args.store}), {args.events} events a run:")
    print(f"  {'':48} {'measured':>10} {'goal':>10} {'NVSentinel':>12}")
    for h, (rate, _cpu) in runs.items():
        print(f"  {f'events/s with {h:,} events stored':48} {rate:>10.0f} {'>= 5000':>10} {'~57':>12}")
        print(f"  {'  ms per event':48} {1000 / rate:>10.3f} {'flat':>10} {'~1900 at 1M':>12}")
    print(f"  {f'event -> derived fault p50 (ms), {args.rate:.0f} ev/s':48} {p50:>10.0f} {'':>10} {'':>12}")
    print(f"  {f'event -> derived fault p99 (ms), n={len(lat)}':48} {p99:>10.0f} {'<= 1000':>10} {'':>12}")
    one = runs[args.history[0]][0]
    print(f"  {f'events/s, 2 processes, {args.history[0]:,} stored':48} {two[0]:>10.0f} {'':>10} {'':>12}")
    print(f"  {'2 processes / 1':48} {two[0] / one:>9.2f}x {'>= 1.7x':>10} {'':>12}")
    first = runs[args.history[0]][1]
    used = (first.analyzer + first.store) / first.wall
    print(f"  {'  the most it can be here: cores / 1 run used':48} {os.cpu_count() / used:>9.2f}x {'':>10} "
          f"{'':>12}  ({os.cpu_count()} cores / {used:.2f}: the analyzer's and the store's)")  # fmt: skip
    cpus = [(f"{h:,} stored", cpu) for h, (_rate, cpu) in runs.items()]
    for label, cpu in [*cpus, (f"{args.history[0]:,} stored, 2 processes", two[1])]:
        print(f"  CPU, {label}: the analyzer {cpu.analyzer / cpu.wall:.2f} cores, the store (FerretDB, "
              f"{args.store}) {cpu.store / cpu.wall:.2f}, the machine {cpu.machine / cpu.wall:.2f} of "
              f"{os.cpu_count()} busy over {cpu.wall:.1f} s")  # fmt: skip
    print(f"  {f'derived faults, {args.node_days} healthy node-days':48} {derived:>10} {'0':>10} {'':>12}"
          f"  ({records} records)")  # fmt: skip


if __name__ == "__main__":
    main()
