"""Drain speed on the local control plane and FerretDB: evictions per second.

    python benchmarks/drain.py                        # 2,000 pods on 200 simulated GPU nodes
    python benchmarks/drain.py --nodes 50 --pods 500  # a quicker look
    python benchmarks/drain.py --store sqlite         # FerretDB on SQLite instead of PostgreSQL

Pods (bare, grace period 0) are bound to simulated nodes run by the fakelet, which marks them Running and
completes their deletion. All nodes are then recorded as quarantined (as the quarantine worker records
them) and cordoned, and one drainer (`--threads` nodes at once, namespaces in Immediate mode) is started:
the figure is pods / seconds from its start until it has evicted every pod (its own count, so that
measuring loads nothing); the time until the simulated kubelet has removed them all is printed too. Printed beside the goal and
NVSentinel's published figure (about 5 evictions/s) for context. The store is FerretDB on PostgreSQL
unless `--store sqlite` (see benchmarks/quarantine.py for why the two differ).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import socket
import subprocess
import sys
import time
import urllib.request

from devtools.cluster import LocalCluster
from devtools.mongo import BACKENDS, LocalMongo
from faultline import kube, store
from faultline.errors import NotFoundError
from workers import drainer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--store", choices=BACKENDS, default="postgresql", help="where FerretDB stores")
    args = parser.parse_args()
    with (
        LocalCluster(nodes=args.nodes, node_prefix="drain") as cluster,
        LocalMongo(backend=args.store) as mongo,
    ):
        api = cluster.api()
        core = kube.core(api)
        core.create_namespace({"metadata": {"name": "bench", "labels": {drainer.MODE_LABEL: "Immediate"}}})
        while True:
            try:
                kube.client.call("get", "ServiceAccount bench/default", core.read_namespaced_service_account,
                                 "default", "bench")  # fmt: skip
                break
            except NotFoundError:  # made by the controller manager soon after the namespace
                time.sleep(0.2)
        nodes = cluster.node_names

        def make(i: int) -> None:
            core.create_namespaced_pod("bench", {
                "metadata": {"name": f"p-{i:05d}"},
                "spec": {"nodeName": nodes[i % len(nodes)], "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "c", "image": "trainer:1"}]},
            })  # fmt: skip

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(make, range(args.pods)))
        while sum(p.status.phase == "Running" for p in core.list_namespaced_pod("bench").items) < args.pods:
            time.sleep(0.5)
        print(
            f"{args.pods} pods running on {len(nodes)} nodes after {time.monotonic() - t0:.0f} s",
            file=sys.stderr,
        )
        st = store.connect(mongo.uri, "bench")
        st.ensure_indexes()
        now = store.utcnow()
        for name in nodes:
            core.patch_node(name, {"spec": {"unschedulable": True}})
            st.record_hold(name, faults=[], owned=store.Owned(cordoned=True), at=now, newly=True)
        # The drainer runs as it is deployed, in its own process: here it would share the interpreter with
        # the simulated kubelets, which turn every pod of the cluster into Python objects several times a
        # second.
        port = _free_port()
        argv = [sys.executable, "-m", "faultline", "worker", "drain", "--mongodb-uri", mongo.uri,
                "--database", "bench", "--kubeconfig", str(cluster.kubeconfig), "--threads", str(args.threads),
                "--poll", "0.2s", "--metrics-port", str(port)]  # fmt: skip
        start = time.monotonic()
        worker = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
        try:
            # Timed by the drainer's own count of evictions: listing 2,000 pods every 0.1 s would load the
            # API server and this process more than the drain itself. The pods are then checked gone.
            while (evicted := _evicted(port)) < args.pods:
                if time.monotonic() - start > 1200 or worker.poll() is not None:
                    raise SystemExit(f"{evicted:.0f} of {args.pods} pods evicted, drainer {worker.poll()}")
                time.sleep(0.05)
            evicted_in = time.monotonic() - start
            while kube.client.read_json("list", "pods in bench", core.list_namespaced_pod, "bench", limit=1)[
                "items"
            ]:
                if time.monotonic() - start > 1200:
                    raise SystemExit("pods still there after 20 minutes")
                time.sleep(0.2)
            took = time.monotonic() - start
            deadline = time.monotonic() + 10  # the last drains are recorded after their last pod went
            while (drained := st.count_drained()) < len(nodes):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        finally:
            worker.terminate()
            worker.wait(10)
            st.close()
    rate = args.pods / evicted_in
    print(
        f"\ndrainer, {args.threads} nodes at once, Immediate mode, on the local control plane and FerretDB"
        f" ({args.store}):"
    )
    print(f"  {'':46} {'measured':>10} {'goal':>8} {'NVSentinel':>11}")
    label = f"{args.pods} pods on {len(nodes)} nodes: s until all evicted"
    print(f"  {label:46} {evicted_in:>10.1f} {'':>8} {'':>11}")
    print(f"  {'  evictions/s':46} {rate:>10.1f} {'>= 50':>8} {'~5':>11}")
    print(f"  {'  s until all gone (the simulated kubelet)':46} {took:>10.1f} {'':>8} {'':>11}")
    print(f"  {'  nodes recorded drained (of ' + str(len(nodes)) + ')':46} {drained:>10} {'':>8} {'':>11}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _evicted(port: int) -> float:
    """The drainer's count of evictions, from its /metrics (0 until it serves them)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith('faultline_drain_actions_total{result="evicted"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


if __name__ == "__main__":
    main()
