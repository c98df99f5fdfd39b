"""Quarantine speed on the local control plane and FerretDB.

    python benchmarks/quarantine.py                    # 50 single faults, then 500 nodes at once
    python benchmarks/quarantine.py --storm 100        # a quicker look
    python benchmarks/quarantine.py --store sqlite     # FerretDB on SQLite instead of PostgreSQL

1. Fault -> cordon for single faults: a fatal fault is written to MongoDB (as the agent writes it) and
   the time until the Node is cordoned is measured, one fault at a time (p50, p99).
2. A storm: fatal faults on N nodes already in MongoDB when a worker starts; the time from its start
   until the worker has quarantined every node (its own count; the nodes are then checked cordoned)
   gives nodes/s. The circuit breaker is set wide open for this: it is what would stop a real storm.
3. The two sides apart, to show which one limits: the same claim loop taking and completing as many
   faults with no Kubernetes work (the store alone), and the worker's Kubernetes calls per node (read,
   one merge patch, an Event) from as many threads with no store (the Kubernetes side alone).

The worker's API client keeps as many connections as the workers keep for `--threads`
(`faultline.kube.client.pool_size`); `--pool N` keeps N instead (`--pool 10`: the `kubernetes` package's
own default on 2 cores, five per CPU). The connections each phase opened are printed: a call made while
every kept connection is busy opens one of its own, and closes it after its request.

The Nodes are plain Node objects with GPU capacity (no pods; the drainer is not involved). Printed beside
the goals and NVSentinel's published figure (about 2.5 nodes/s cordon) for context.

The store is FerretDB 1.24 on PostgreSQL by default (`--store sqlite` for the other). FerretDB 1.x
pushes only equality filters down to its storage, never `$in`, ranges or sorts, so on either backend a
find by anything but equality reads the whole collection. On SQLite every update does too, even by
_id (its _id index does not match the expression its queries use): 11 ms per update with 1,000 faults
stored, 2 ms with 1,000 small documents, and update_many costs as much per document. PostgreSQL does
the same work over binary JSON several times faster (3.6 ms against 23 ms per update at 1,000
documents of 1.2 KB). Either way, the work items a quarantine updates twice (claim, completion) are small
documents in their own collection (`queue`), and the faults are read with one query for many nodes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import os
import statistics
import sys
import time
from typing import Any

from kubernetes.client import rest

from devtools import cputime, fakelet
from devtools.cluster import LocalCluster, connections_opened
from devtools.mongo import BACKENDS, LocalMongo
from faultline import kube, store
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from workers import breaker, common, quarantine


def fault(node: str, code: str) -> Fault:
    now = dt.datetime.now(dt.UTC)
    return Fault(
        id=fault_id(node, "GPU", "0000:3b:00", code), node=node, entity=Entity(type="GPU", id="0000:3b:00"),
        code=code, component=Component.GPU, count=1, first_seen=now, last_seen=now, fatal=True,
        action=Action.RESTART_BM, state=FaultState.OPEN,
    )  # fmt: skip


def cordoned(api: Any) -> set[str]:
    items = kube.nodes.list_all(api)
    return {n["metadata"]["name"] for n in items if n["spec"].get("unschedulable")}


def client(kubeconfig: Any, threads: int, pool: int | None) -> Any:
    """The API client the worker would have for `threads`, or one keeping `pool` connections."""
    api = kube.api_client(kubeconfig, concurrency=threads)
    if pool is not None:
        api.configuration.connection_pool_maxsize = pool
        api.rest_client = rest.RESTClientObject(api.configuration)  # its pools are sized when it is made
    return api


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--singles", type=int, default=50)
    parser.add_argument("--storm", type=int, default=500)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--store", choices=BACKENDS, default="postgresql", help="where FerretDB stores")
    parser.add_argument("--pool", type=int, help="connections the API client keeps (default: the worker's)")
    args = parser.parse_args()
    with LocalCluster(nodes=0) as cluster, LocalMongo(backend=args.store) as mongo:
        core = kube.core(cluster.api())
        api = client(cluster.kubeconfig, args.threads, args.pool)
        total = args.singles + args.storm
        names = [f"bench-{i:04d}" for i in range(total)]
        t0 = time.monotonic()
        for name in names:
            core.create_node(fakelet.node_manifest(fakelet.SimNode(name, "10.9.0.1"), 8))
        print(f"created {total} nodes in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        st = store.connect(mongo.uri, "bench")
        st.ensure_indexes()
        settings = quarantine.Settings(
            breaker=breaker.BreakerConfig(max_share=None, max_count=None), threads=args.threads,
            qps=1000.0, burst=1000,
        )  # fmt: skip
        worker = quarantine.QuarantineWorker(st, api, settings, "bench")
        threads = worker.start()
        try:
            latencies = []
            for name in names[: args.singles]:
                start = time.monotonic()
                st.write_fault(fault(name, "XID-79"), 1)
                while not kube.nodes.read(api, name)["spec"].get("unschedulable"):
                    if time.monotonic() - start > 30:
                        raise SystemExit(f"{name} not cordoned within 30 s")
                    time.sleep(0.005)
                latencies.append(time.monotonic() - start)
            worker.stop.set()
            for thread in threads:
                thread.join(10)
            storm = names[args.singles :]
            with concurrent.futures.ThreadPoolExecutor(16) as pool:  # as the nodes' agents would, at once
                list(pool.map(lambda n: st.write_fault(fault(n, "XID-48"), 1), storm))
            worker = quarantine.QuarantineWorker(st, api, settings, "bench")
            assert mongo.proc is not None
            assert mongo.postgres is not None
            assert mongo.postgres.proc is not None
            meter = cputime.Meter({
                "worker (this process)": [os.getpid()],
                "FerretDB": [mongo.proc.pid], "PostgreSQL": [mongo.postgres.proc.pid],
                "kube-apiserver": [p.pid for p in cluster.procs if p.name == "kube-apiserver"],
                "etcd": [p.pid for p in cluster.procs if p.name == "etcd"],
            }, alone=frozenset({"worker (this process)"}))  # fmt: skip
            meter.start()
            connections = connections_opened(api)
            start = time.monotonic()
            threads = worker.start()
            quarantined = worker.metrics.actions.labels(result="quarantined")
            while quarantined._value.get() < len(
                storm
            ):  # the worker's own count: polling the API would load it
                if time.monotonic() - start > 600:
                    raise SystemExit("the storm was not cordoned within 10 minutes")
                time.sleep(0.02)
            took = time.monotonic() - start
            storm_cpu = meter.stop()
            storm_opened = connections_opened(api) - connections
            missing = set(storm) - cordoned(api)
            if missing:
                raise SystemExit(f"counted as quarantined but not cordoned: {sorted(missing)[:5]}")
            # The Kubernetes side alone: the same calls per node (read it, one merge patch, an Event), from
            # as many threads, with no store at all; here they release the storm's nodes.
            worker.stop.set()
            for thread in threads:
                thread.join(10)

            def release(name: str) -> None:
                kube.nodes.read(api, name)
                kube.core(api).patch_node(name, {"spec": {"unschedulable": None, "taints": None}},
                                _content_type="application/merge-patch+json")  # fmt: skip
                common.post_event(api, name, reason="BenchRelease", note="benchmark", action="Release",
                                  warning=False, worker="bench", owner="bench")  # fmt: skip

            meter.start()
            start = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
                list(pool.map(release, storm))
            api_only = len(storm) / (time.monotonic() - start)
            api_cpu = meter.stop()
            api_opened = connections_opened(api) - connections - storm_opened
            # The store's own ceiling: the same claims and completions with no Kubernetes work at all.
            worker.stop.set()
            for thread in threads:
                thread.join(10)
            ceiling_faults = [fault(f"store-only-{i:04d}", "XID-48") for i in range(len(storm))]
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda f: st.write_fault(f, 1), ceiling_faults))
            handled = common.WorkerMetrics("ceiling")
            loop = common.ClaimLoop(st, store.Stage.QUARANTINE, "ceiling", lambda _claim: store.State.DONE,
                                    lease=dt.timedelta(seconds=30), threads=args.threads,
                                    metrics=handled, every=3600, collection=store.Work.QUEUE)  # fmt: skip
            start = time.monotonic()
            ceiling_threads = loop.start()
            while handled.claims._value.get() < len(ceiling_faults):  # counted here: a query would load it
                time.sleep(0.02)
            loop.stop.set()
            for thread in ceiling_threads:
                thread.join(10)
            ceiling = len(ceiling_faults) / (time.monotonic() - start)
        finally:
            worker.stop.set()
            for thread in threads:
                thread.join(10)
            st.close()
    lat = sorted(latencies)
    p50, p99 = statistics.median(lat) * 1000, lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))] * 1000
    rate = len(storm) / took
    print(
        f"\nquarantine worker, {args.threads} threads, on the local control plane and FerretDB ({args.store}):"
    )
    print(f"  {'':44} {'measured':>10} {'goal':>10} {'NVSentinel':>12}")
    print(f"  {'fault -> cordon p50 (ms), single faults':44} {p50:>10.0f} {'':>10} {'':>12}")
    print(f"  {'fault -> cordon p99 (ms), n=' + str(len(lat)):44} {p99:>10.0f} {'<= 1000':>10} {'':>12}")
    print(f"  {f'{len(storm)} nodes faulted at once: s to all cordoned':44} {took:>10.1f} {'':>10} {'':>12}")
    print(f"  {'  nodes/s':44} {rate:>10.1f} {'>= 50':>10} {'~2.5':>12}")
    print(f"  {'  the store alone: claim+complete cycles/s':44} {ceiling:>10.1f} {'':>10} {'':>12}")
    print(f"  {'  the Kubernetes calls alone: nodes/s':44} {api_only:>10.1f} {'':>10} {'':>12}")
    print(f"  {'  storm / Kubernetes calls alone':44} {rate / api_only:>10.2f} {'>= 0.85':>10} {'':>12}")
    print(f"\n  CPU ms per node {'storm':>12} {'calls alone':>12}")
    for name in storm_cpu:
        print(
            f"  {name:30} {storm_cpu[name] * 1000 / len(storm):>12.2f} {api_cpu[name] * 1000 / len(storm):>12.2f}"
        )
    total_storm, total_api = sum(storm_cpu.values()), sum(api_cpu.values())
    print(f"  {'all':30} {total_storm * 1000 / len(storm):>12.2f} {total_api * 1000 / len(storm):>12.2f}")
    print(
        f"  cores busy: storm {total_storm / took:.2f}, calls alone {total_api * api_only / len(storm):.2f} "
        f"(of {os.cpu_count()})"
    )
    print(
        f"  API connections opened: storm {storm_opened}, calls alone {api_opened} "
        f"(the client keeps {api.configuration.connection_pool_maxsize})"
    )


if __name__ == "__main__":
    main()
