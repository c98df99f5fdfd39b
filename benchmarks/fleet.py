"""A fleet on one store and one API server: what each node costs, at 1,000, 5,000 and 10,000 nodes.

    python benchmarks/fleet.py                          # 1,000, 5,000 and 10,000 nodes (make bench-fleet)
    python benchmarks/fleet.py --sizes 1000 --steady 30 # a quicker look

Each size runs on a fresh local control plane (etcd, kube-apiserver, controller-manager, scheduler) and a
fresh store (FerretDB on PostgreSQL), with N simulated GPU nodes of 8 GPUs each:

- **Agents**: one simulated agent per node, 1,000 to a process (as many processes as that takes), each
  with what a real agent has of its own: its store client (`sinks.mongo.agent_store`, the agent's one
  client, signing with the node's own key), its Kubernetes sink (`sinks.kube`, its own kept-alive
  connection) and its key published on its Node. They do what an idle agent does, at the product's
  intervals, staggered: read the node's repairs every 30 s (`repair_idle_poll_interval`); store a
  health sample of each GPU every 60 s (what the chart sets with `analyzer.anomaly.enabled`); hand the
  node's state to the Kubernetes sink every 60 s (the detector's resend), which reads the Node's status
  once a minute and rewrites its conditions every 4 minutes (their heartbeat). The store client checks
  the server on its own every 60 s.
- **Faults**: field rates are far too low to measure anything (about 0.003 hardware faults per 8-GPU
  node a day: Meta's Llama 3 run lost 419 jobs in 54 days on 16,384 GPUs, 78 % of them to hardware), so
  one node's agent writes a fatal XID through the same write path (store, then conditions and an Event)
  every `--fault-every` seconds, and its time to cordon is measured (p50, p99) from the fault's write to
  the Node's cordon as a watch on Nodes sees it.
- **Workers** as the chart runs them: the quarantine worker, 2 replicas of 16 threads each, its own
  process each (`faultline worker quarantine`), evidence required (faults signed by their node's key),
  with the circuit breaker opened wide (with the chart's caps it would stop the storm at 50 nodes, which
  is what it is for). No pods run, so the drainer has nothing to do and is not started.
- **A storm**: 5 % of the fleet faulted at once (every agent process writes its share at the same
  moment): seconds until the watch has seen every one cordoned, nodes/s; then, with the workers stopped,
  the same Kubernetes calls per node alone (read, merge patch, Event, from 16 threads), nodes/s: the
  ratio is how much of what the API server allows the quarantine gets.

Measured over the steady window (after a minute's warm-up in which each agent makes its first calls), per
node: store connections (held by the agents' processes, counted by the kernel), store calls/s by kind
(the agents' own, counted by a pymongo listener in each process), store bytes per day (the database's
growth), API requests per minute (the agents' own, and the API server's whole count from its metrics),
and CPU of each component (from /proc: agents, FerretDB, PostgreSQL, kube-apiserver, etcd, quarantine).
The table gives them at each size side by side; flat is the goal. JSON in benchmarks/out/fleet.json.

A size whose every agent the machine cannot carry (their steady load alone, from the CPU per node of every
component at the largest size run whole before it, past three quarters of the cores: 10,000 nodes on 2
cores) is run with the agents that fit, in whole processes of 1,000, and its other Nodes in the API server
only: its fault -> cordon latency and its storm (from nodes with agents) are measured with every Node
there, its per-node costs left out (`-`), and the table says why. `--force` runs every agent.

What the simulation changes: a store client's two threads (its monitor and pymongo's cursor reaper) wake
every 0.5 s to look for work, and the reaper works every second; here they look every 5 s and the reaper
works once a minute. Four wake-ups a second cost one agent nothing measurable, but a thousand clients in
one process would fight for its interpreter lock all the time (a first try at 5,000 nodes made about 900
clients a process in 7 minutes, at a load average of 1,159).

One FerretDB process holds at most this machine's open-file limit of connections (`ulimit -n`, 20,000
here, a hard limit); each agent holds two (one for calls, one for monitoring), so a fleet that needs more
is served by as many FerretDB processes as that takes on the same PostgreSQL database: one store, as a
FerretDB Deployment with replicas would be.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime as dt
import heapq
import json
import math
import multiprocessing as mp
import os
import queue
import random
import re
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymongo
from pymongo import monitoring

from dataflows import node as node_flow
from devtools import cputime, fakelet, procs, sockets, tools
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import evidence, kube
from faultline import store as fstore
from faultline.kube import lite
from faultline.models import Action, Component, Entity, Fault, FaultState, NodeUpdate, fault_id
from sinks import kube as kube_sink
from sinks import mongo as mongo_sink
from sources import gpu
from sources.repairs import from_store
from workers import common

OUT = Path(__file__).resolve().parent / "out" / "fleet.json"
GPUS = 8
AGENTS_PER_PROCESS = 1000
# the share of the machine's cores a size's steady load may take for it to be run: the agents' start and
# the storm come on top of it (at 10,000 nodes on 2 cores the steady load alone was past the machine)
CORES_USABLE = 0.75
REPAIR_READ_S = 30.0  # the agent's repair_idle_poll_interval
SAMPLE_S = 60.0  # health samples (the chart's setting with analyzer.anomaly.enabled)
RESEND_S = 60.0  # the detector re-sends the node's state to the Kubernetes sink
STORE_KINDS = ("insert", "update", "find", "aggregate", "delete")


@dataclasses.dataclass(frozen=True)
class HostSpec:
    index: int
    nodes: list[str]
    uri: str
    database: str
    kubeconfig: str
    state_dir: str
    threads: int
    warmup: float


# -- an agent process (many simulated agents) --------------------------------------------------------------
def _host(spec: HostSpec, commands: Any, results: Any) -> None:
    """Runs in its own process: the simulated agents of `spec.nodes`, until told to stop."""

    calls: dict[str, int] = dict.fromkeys(STORE_KINDS, 0)
    api_calls = [0]
    lock = threading.Lock()

    class Count(monitoring.CommandListener):
        def started(self, event: monitoring.CommandStartedEvent) -> None:
            name = event.command_name.lower()
            with lock:
                calls[name] = calls.get(name, 0) + 1

        def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
            pass

        def failed(self, event: monitoring.CommandFailedEvent) -> None:
            pass

    monitoring.register(Count())  # every client made after this counts its commands (monitoring included)
    # each client's housekeeping thread (pymongo's cursor reaper) wakes every second: nothing for one agent,
    # but a thousand of them in one process fight for its lock all the time and ten thousand take the
    # machine's cores: here it wakes once a minute (the simulator's only change to the agents' client)
    pymongo.common.KILL_CURSOR_FREQUENCY = 60
    pymongo.common.MIN_HEARTBEAT_INTERVAL = 5  # its two threads look for an early wake-up every 0.5 s
    request = lite.Client.request

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            api_calls[0] += 1
        return request(self, *args, **kwargs)

    lite.Client.request = counted  # type: ignore[method-assign]
    kubeconfig = Path(spec.kubeconfig)
    rng = random.Random(spec.index)

    @dataclasses.dataclass
    class Agent:
        node: str
        store: Any
        sink: Any
        repairs: Any
        devices: list[Any]
        revision: int
        faults: list[Any] = dataclasses.field(default_factory=list)
        lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    agents: dict[str, Agent] = {}
    for node in spec.nodes:
        key = evidence.NodeKey.load_or_create(Path(spec.state_dir) / node, node)
        st = mongo_sink.agent_store(spec.uri, spec.database)
        st.signer = key
        devices = [gpu.GpuDevice(i, f"GPU-{node}-{i}", f"0000:{0x18 + i:02x}:00.0") for i in range(GPUS)]
        names = {d.pci: f"GPU {d.index} {d.uuid}" for d in devices}
        sink = kube_sink.KubeSink(kubeconfig, names, annotations={evidence.KEY_ANNOTATION: key.public})
        # the agent's sink partition (its own connection); its thread's work is done by this process's pool
        # (one thread less per agent: 10,000 agents' threads would pass the machine's limit of 32,768)
        part = kube_sink._Partition(
            kubeconfig, names, sink.types, background=False, annotations=sink.annotations
        )
        agents[node] = Agent(node, st, part, from_store(st, node), devices, node_flow.revision_base())

    def repairs(a: Agent) -> None:
        a.repairs()

    def samples(a: Agent) -> None:
        now = time.time()
        events = [
            node_flow.health_sample(
                a.node,
                "nvml",
                d,
                gpu.GpuEvent(
                    now,
                    d.index,
                    "sample",
                    fields=(
                        ("ecc_sbe_volatile", 0),
                        ("temperature", 40 + d.index),
                        ("power_usage", 300),
                        ("sm_clock", 1980),
                        ("xid_last", 0),
                    ),
                ),
                boot_id="b",
            )
            for d in a.devices
        ]
        mongo_sink.write(a.store, events, [], False)

    def resend(a: Agent) -> None:
        with a.lock:
            a.sink.write_batch([NodeUpdate(a.node, list(a.faults), [])])
            if not a.sink.drain():
                raise RuntimeError("the Kubernetes sink's calls failed")

    def fault(a: Agent) -> float:
        """A fatal XID on GPU 0, as the agent's sinks write it: the store, then conditions and an Event."""
        now = dt.datetime.now(dt.UTC)
        pci = a.devices[0].pci
        f = Fault(
            id=fault_id(a.node, "GPU", pci, "XID-79"), node=a.node, entity=Entity(type="GPU", id=pci),
            code="XID-79", component=Component.GPU, count=1, first_seen=now, last_seen=now, fatal=True,
            action=Action.RESTART_BM, state=FaultState.OPEN, description="GPU has fallen off the bus",
        )  # fmt: skip
        written = time.time()
        with a.lock:
            a.revision += 1
            mongo_sink.write(a.store, [], [(f, a.revision)], False)
            a.faults = [f]
            a.sink.write_batch([NodeUpdate(a.node, [f], [(f, a.revision)])])
            a.sink.drain()
        return written

    jobs = {"repairs": (repairs, REPAIR_READ_S), "samples": (samples, SAMPLE_S), "resend": (resend, RESEND_S)}
    heap: list[tuple[float, int, str, str]] = []
    start = time.monotonic()
    n = 0
    for node in spec.nodes:  # each agent's first calls spread over the warm-up, then at its intervals
        for kind, (_, every) in jobs.items():
            heapq.heappush(heap, (start + rng.uniform(0, min(every, spec.warmup)), n, node, kind))
            n += 1
    errors = [0]
    pool = concurrent.futures.ThreadPoolExecutor(spec.threads)
    running = threading.Semaphore(spec.threads * 4)

    def run(kind: str, node: str) -> None:
        try:
            jobs[kind][0](agents[node])
        except Exception as exc:  # noqa: BLE001 - counted and reported; the agent goes on
            with lock:
                errors[0] += 1
                if errors[0] <= 3:
                    print(f"agent host {spec.index}: {kind} on {node} failed: {exc}", file=sys.stderr)
        finally:
            running.release()

    def faulted(node: str) -> None:
        try:
            results.put(("fault", node, fault(agents[node])))
        except Exception as exc:  # noqa: BLE001 - reported: its latency is then missing
            results.put(("fault-error", node, str(exc)))

    results.put(("ready", spec.index, len(agents)))
    while True:
        try:
            command = commands.get_nowait()
        except queue.Empty:
            command = None
        if command is not None:
            what = command[0]
            if what == "stop":
                break
            if what == "fault":
                for node in command[1]:
                    pool.submit(faulted, node)
            elif what == "counts":
                with lock:
                    results.put(("counts", spec.index, dict(calls), api_calls[0], errors[0]))
            continue
        now = time.monotonic()
        if heap and heap[0][0] <= now:
            due, _, node, kind = heapq.heappop(heap)
            running.acquire()
            pool.submit(run, kind, node)
            heapq.heappush(heap, (due + jobs[kind][1], n, node, kind))
            n += 1
            continue
        time.sleep(min(0.01, max(0.0, heap[0][0] - now)) if heap else 0.01)
    pool.shutdown(wait=True, cancel_futures=True)
    for a in agents.values():
        a.store.close()
        a.sink.close()
    results.put(("stopped", spec.index, 0))


# -- measuring ---------------------------------------------------------------------------------------------
def _api_requests(cluster: LocalCluster) -> float:
    """The API server's own count of the requests it served (apiserver_request_total, summed)."""
    text = cluster._get("/metrics")  # the admin's TLS context
    return sum(
        float(m.group(1)) for m in re.finditer(r"^apiserver_request_total\{[^}]*\} (\S+)$", text, re.M)
    )


def _store_bytes(uri: str, database: str) -> int:
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        stats = client[database].command("dbStats")
    return int(stats.get("totalSize") or stats.get("storageSize", 0) + stats.get("indexSize", 0))


class Cordons:
    """A watch on Nodes (raw JSON lines): when each one was first seen cordoned."""

    def __init__(self, api: Any) -> None:
        self.core = kube.core(api)
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        listed = json.loads(self.core.list_node(_preload_content=False, limit=1).data)
        self.version = listed["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, name="cordons", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                response = self.core.list_node(watch=True, resource_version=self.version, timeout_seconds=60,
                                               allow_watch_bookmarks=True, _preload_content=False)  # fmt: skip
                for line in response:
                    if self.stop.is_set():
                        return
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    self.version = (obj.get("metadata") or {}).get("resourceVersion", self.version)
                    if event.get("type") == "MODIFIED" and (obj.get("spec") or {}).get("unschedulable"):
                        name = obj["metadata"]["name"]
                        with self.lock:
                            self.seen.setdefault(name, time.time())
            except Exception as exc:  # noqa: BLE001 - watched again from the last version
                print(f"node watch: {exc}", file=sys.stderr)
                time.sleep(0.5)

    def wait(self, nodes: set[str], timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if nodes <= self.seen.keys():
                    return {n: self.seen[n] for n in nodes}
            time.sleep(0.05)
        with self.lock:
            missing = sorted(nodes - self.seen.keys())
        raise SystemExit(f"{len(missing)} nodes not cordoned within {timeout:.0f} s: {missing[:5]}")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- one size ----------------------------------------------------------------------------------------------
def run_size(size: int, args: argparse.Namespace, agents: int | None = None) -> dict[str, Any]:
    """One size; `agents`: simulate the agents of only the first `agents` nodes (the rest are Nodes in the
    API server only), for a size whose every agent the machine cannot run: its faults and its storm come
    from nodes with agents, and only what the whole cluster does is reported (per node: nothing)."""
    n_agents = size if agents is None else min(size, agents)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    front_ends = max(1, math.ceil((n_agents * 2 + 200) / (limit * 0.9)))
    work = Path(tempfile.mkdtemp(prefix="faultline-fleet-"))
    database = "fleet"
    with LocalCluster(nodes=0) as cluster, LocalMongo(backend="postgresql") as mongo:
        extra = []
        assert mongo.postgres is not None
        for _ in range(front_ends - 1):  # more FerretDB processes on the same PostgreSQL database
            port = procs.free_port()
            extra.append((port, procs.Proc("ferretdb", [str(tools.binary("ferretdb")), f"-listen-addr=127.0.0.1:{port}",
                                                        f"-postgresql-url={mongo.postgres.url}"], work / f"ferretdb-{port}.log")))  # fmt: skip
        ports = [mongo.port, *(p for p, _ in extra)]
        uris = [mongo.uri.replace(f":{mongo.port}/", f":{p}/") for p in ports]
        for port in ports[1:]:
            procs.wait_for("FerretDB", lambda p=port: _accepting(p), 30)
        api = cluster.api()
        core = kube.core(api)
        names = [f"fleet-{i:05d}" for i in range(size)]
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: core.create_node(fakelet.node_manifest(fakelet.SimNode(n, "10.9.0.1"), GPUS),
                                                     _preload_content=False), names))  # fmt: skip
        created = time.monotonic() - t0
        print(
            f"[{size}] {size} Nodes created in {created:.0f} s; {front_ends} FerretDB process(es)",
            file=sys.stderr,
        )
        admin = fstore.connect(uris[0], database)
        admin.ensure_indexes()
        admin.ensure_fleet_indexes()
        # the agent processes
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        hosts = []
        with_agents = names[:n_agents]  # a prefix: a node's host is its index // AGENTS_PER_PROCESS
        chunks = [with_agents[i : i + AGENTS_PER_PROCESS] for i in range(0, n_agents, AGENTS_PER_PROCESS)]
        for i, chunk in enumerate(chunks):
            spec = HostSpec(i, chunk, uris[i % len(uris)], database, str(cluster.kubeconfig), str(work / "agents"),
                            args.agent_threads, args.warmup)  # fmt: skip
            commands = ctx.Queue()
            proc = ctx.Process(target=_host, args=(spec, commands, results), name=f"agents-{i}", daemon=True)
            proc.start()
            hosts.append((proc, commands))
        ready = 0
        t0 = time.monotonic()
        while ready < len(hosts):
            kind, *rest = results.get(timeout=600)
            if kind == "ready":
                ready += 1
        print(f"[{size}] {n_agents} agents in {len(hosts)} processes, started in {time.monotonic() - t0:.0f} s",
              file=sys.stderr)  # fmt: skip
        # the quarantine worker, as the chart runs it
        config = work / "quarantine.yaml"
        config.write_text(json.dumps({
            "require_evidence": True, "threads": 16, "breaker_max_share": None, "breaker_max_held_share": None,
            "breaker_max_held": 0,
        }))  # fmt: skip
        workers = [
            procs.Proc(
                f"quarantine-{i}",
                [
                    sys.executable,
                    "-m",
                    "faultline",
                    "--log-format",
                    "json",
                    "worker",
                    "quarantine",
                    "--config",
                    str(config),
                    "--mongodb-uri",
                    uris[i % len(uris)],
                    "--database",
                    database,
                    "--kubeconfig",
                    str(cluster.kubeconfig),
                    "--owner",
                    f"quarantine-{i}",
                ],
                work / f"quarantine-{i}.log",
            )
            for i in range(2)
        ]
        cordons = Cordons(api)
        time.sleep(args.warmup + 10)  # every agent made its first calls (their first writes of conditions)

        # the steady window
        def counts() -> tuple[dict[str, int], int, int]:
            for _, commands in hosts:
                commands.put(("counts",))
            total: dict[str, int] = {}
            api_total = errors = 0
            got = 0
            while got < len(hosts):
                kind, *rest = results.get(timeout=60)
                if kind == "counts":
                    got += 1
                    for k, v in rest[1].items():
                        total[k] = total.get(k, 0) + v
                    api_total += rest[2]
                    errors += rest[3]
                elif kind == "fault":
                    pending_faults[rest[0]] = rest[1]
            return total, api_total, errors

        pending_faults: dict[str, float] = {}
        components = {
            "agents": [p.pid for p, _ in hosts],
            "FerretDB": [mongo.proc.pid, *(p.pid for _, p in extra)] if mongo.proc else [],
            "PostgreSQL": [mongo.postgres.proc.pid] if mongo.postgres.proc else [],
            "kube-apiserver": [p.pid for p in cluster.procs if p.name == "kube-apiserver"],
            "etcd": [p.pid for p in cluster.procs if p.name == "etcd"],
            "quarantine": [w.pid for w in workers],
        }
        cpu0 = {k: cputime.of_trees(v) for k, v in components.items()}
        calls0, agent_api0, errors0 = counts()
        api0 = _api_requests(cluster)
        bytes0 = _store_bytes(uris[0], database)
        start = time.monotonic()
        conns = []
        while time.monotonic() - start < args.steady:  # the agents' own load: no faults
            conns.append(
                sum(sockets.connections_to(p.pid, port) for p, _ in hosts for port in ports if p.pid)
            )
            time.sleep(min(5.0, args.steady / 10))
        took = time.monotonic() - start
        cpu1 = {k: cputime.of_trees(v) for k, v in components.items()}
        calls1, agent_api1, errors1 = counts()
        api1 = _api_requests(cluster)
        bytes1 = _store_bytes(uris[0], database)
        accepted = sum(sockets.accepted_on(p) for p in ports)
        # single faults, one every `fault_every` seconds, each on another node (of the fleet's second half)
        injected = with_agents[n_agents // 2 :][: args.faults]
        for node in injected:
            hosts[names.index(node) // AGENTS_PER_PROCESS][1].put(("fault", [node]))
            time.sleep(args.fault_every)
        cordoned = cordons.wait(set(injected), 120)
        while len(pending_faults) < len(injected):  # the write times of the faults
            kind, *rest = results.get(timeout=60)
            if kind == "fault":
                pending_faults[rest[0]] = rest[1]
            elif kind == "fault-error":
                raise SystemExit(f"a fault's write failed on {rest[0]}: {rest[1]}")
        latencies = [cordoned[n] - pending_faults[n] for n in injected]

        # the storm: 5 % of the fleet at once, from every agent process
        storm = names[: max(1, size // 20)]
        assert len(storm) <= n_agents, "the storm's nodes have agents"
        by_host: dict[int, list[str]] = {}
        for node in storm:
            by_host.setdefault(names.index(node) // AGENTS_PER_PROCESS, []).append(node)
        t_storm = time.time()
        for i, nodes in by_host.items():
            hosts[i][1].put(("fault", nodes))
        seen = cordons.wait(set(storm), 600)
        storm_s = max(seen.values()) - t_storm
        for w in workers:
            w.stop()

        def release(name: str) -> None:
            kube.nodes.read(api, name)
            core.patch_node(name, {"spec": {"unschedulable": None, "taints": None}},
                            _content_type="application/merge-patch+json", _preload_content=False)  # fmt: skip
            common.post_event(api, name, reason="BenchRelease", note="benchmark", action="Release",
                              warning=False, worker="bench", owner="bench")  # fmt: skip

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(release, storm))
        api_alone = len(storm) / (time.monotonic() - t0)
        for _, commands in hosts:
            commands.put(("stop",))
        for proc, _ in hosts:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
        cordons.stop.set()
        admin.close()
        for _, p in extra:
            p.stop()
    minutes = took / 60
    per_node: dict[str, float | None] = {
        "store connections (agents)": max(conns) / size,
        "store connections (all, accepted)": accepted / size,
        **{f"store {k}/s": (calls1.get(k, 0) - calls0.get(k, 0)) / took / size for k in STORE_KINDS},
        "store bytes/day": (bytes1 - bytes0) / took * 86400 / size,
        "API requests/min (agents)": (agent_api1 - agent_api0) / minutes / size,
        "API requests/min (all)": (api1 - api0) / minutes / size,
        **{f"CPU ms/min {k}": (cpu1[k] - cpu0[k]) * 1000 / minutes / size for k in components},
    }
    if n_agents < size:  # a node's cost needs every node's agent: the cluster's figures only
        per_node = dict.fromkeys(per_node)
    whole = {
        "agents": n_agents,
        "agent errors": errors1 - errors0,
        "faults": len(latencies),
        "fault -> cordon p50 ms": statistics.median(latencies) * 1000,
        "fault -> cordon p99 ms": _pct(latencies, 0.99) * 1000,
        "storm nodes": len(storm),
        "storm s": storm_s,
        "storm nodes/s": len(storm) / storm_s,
        "Kubernetes calls alone nodes/s": api_alone,
        "storm / Kubernetes alone": len(storm) / storm_s / api_alone,
        "cores": {k: (cpu1[k] - cpu0[k]) / took for k in components},
        "FerretDB processes": front_ends,
        "nodes created in s": created,
        "steady s": took,
    }
    return {"size": size, "per_node": per_node, "whole": whole}


def _accepting(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def cores_needed(measured: dict[str, Any], size: int) -> float:
    """The cores a fleet of `size` nodes keeps busy in its steady window, from a run's CPU per node (every
    component's): a floor, as the agents' start and the storm cost more."""
    per_node_ms_min = sum(v for k, v in measured["per_node"].items() if k.startswith("CPU ms/min "))
    return per_node_ms_min * size / 60_000


def plan(runs: list[dict[str, Any]], size: int, cores: int) -> tuple[int, str | None]:
    """How many of a `size`-node fleet's agents to simulate on a machine of `cores` cores, and why not all
    (None: all). Every one, unless their steady load alone, from the CPU per node of the largest size run
    whole so far, would take more than CORES_USABLE of the cores: that run would measure the machine (a load
    in the thousands, the API server timing out), not the fleet. Then as many as fit, in whole agent
    processes, and at least the storm's nodes; 0 when not even those fit (the size is not run). Nothing is
    known before the first size has run: it is run whole."""
    measured = [r for r in runs if "per_node" in r and r["whole"]["agents"] == r["size"]]
    if not measured:
        return size, None
    base = max(measured, key=lambda r: r["size"])
    need = cores_needed(base, size)
    if need <= CORES_USABLE * cores:
        return size, None
    fit = int(size * CORES_USABLE * cores / need) // AGENTS_PER_PROCESS * AGENTS_PER_PROCESS
    storm = max(1, size // 20)
    agents = fit if fit >= storm else 0
    why = (
        f"its steady load with every agent needs {need:.2f} cores (the CPU per node of every component at "
        f"{base['size']:,} nodes, times {size:,}); this machine has {cores}, and a load past "
        f"{CORES_USABLE:.0%} of them measures the machine, not the fleet"
    )
    if agents:
        return agents, (
            f"{agents:,} agents simulated, the other Nodes in the API server only: {why} (--force runs "
            "every agent); its per-node figures are left out, the cluster's measured with every Node"
        )
    return 0, f"not run: {why} (--force runs it anyway)"


def _table(runs: list[dict[str, Any]]) -> str:
    sizes = [r["size"] for r in runs]
    done = [r for r in runs if "per_node" in r]
    width = 44

    def row(label: str, value: Callable[[dict[str, Any]], Any], spec: str) -> str:
        cells = (value(r) if "per_node" in r else None for r in runs)
        return f"  {label:{width}}" + "".join(f"{'-':>12}" if v is None else f"{v:>12{spec}}" for v in cells)

    lines = [f"  {'per node':{width}}" + "".join(f"{s:>12,}" for s in sizes)]
    for key in done[0]["per_node"] if done else []:
        lines.append(row(key, lambda r, k=key: r["per_node"][k], ".4g"))
    lines.append(f"  {'the whole':{width}}")
    for key, value in done[0]["whole"].items() if done else []:
        if isinstance(value, dict):
            for sub in value:
                lines.append(row("cores " + sub, lambda r, k=key, c=sub: r["whole"][k][c], ".3f"))
        else:
            lines.append(row(key, lambda r, k=key: r["whole"][k], ".4g"))
    for r in runs:
        if r.get("note"):
            lines.append(f"  {r['size']:,} nodes: {r['note']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000,5000,10000", help="fleet sizes, comma-separated")
    parser.add_argument("--steady", type=float, default=120.0, help="seconds measured at each size")
    parser.add_argument(
        "--warmup", type=float, default=60.0, help="seconds over which agents make their first calls"
    )
    parser.add_argument(
        "--faults", type=int, default=100, help="single faults (fault -> cordon), after the window"
    )
    parser.add_argument("--fault-every", type=float, default=0.5, help="seconds between single faults")
    parser.add_argument("--agent-threads", type=int, default=8, help="threads of each agent process")
    parser.add_argument(
        "--agents", type=int, default=None,
        help="simulate at most this many agents at each size (the other nodes: Nodes only)",
    )  # fmt: skip
    parser.add_argument(
        "--force",
        action="store_true",
        help="every agent of every size, even where their steady load alone needs more cores than there are",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:  # the storm (5 % of the fleet) comes from nodes with agents
        if args.agents is not None and args.agents < min(size, max(1, size // 20)):
            parser.error(
                f"--agents {args.agents} is fewer than the storm's {max(1, size // 20):,} nodes at {size:,}"
            )
    tools.ensure("etcd", "kubernetes", "ferretdb")
    runs: list[dict[str, Any]] = []
    cores = len(os.sched_getaffinity(0))  # the cores this benchmark may use (a container's, a taskset's)
    for size in sizes:
        agents, note = (size, None) if args.force else plan(runs, size, cores)
        if args.agents is not None and args.agents < agents:
            agents, note = args.agents, f"{args.agents:,} agents simulated (--agents), the other Nodes only"
        if note:
            print(f"\nfleet of {size:,} nodes: {note}", file=sys.stderr)
        runs.append(
            {**run_size(size, args, agents), "note": note} if agents else {"size": size, "note": note}
        )
        print(f"\nfleet of {size:,} nodes:\n" + _table(runs[-1:]), file=sys.stderr)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(runs, indent=2))
    print(f"\nfleet benchmark on {cores} cores, FerretDB on PostgreSQL (JSON: {OUT}):")
    print(_table(runs))


if __name__ == "__main__":
    main()
