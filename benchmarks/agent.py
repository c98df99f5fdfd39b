"""Node agent footprint and latency, against the local control plane and FerretDB.

    python benchmarks/agent.py                 # 60 s steady + 120 XIDs, after 10 s of warm-up
    python benchmarks/agent.py --seconds 20 --faults 40    # a quicker look

Load (issue 4): 8 simulated GPUs whose health fields are read every second, and a real journal file
(written by systemd-journal-remote) receiving 1,000 kernel lines per second, followed by the agent's
journalctl, and the gRPC ingest socket served (`--no-ingest`: without it). The footprint goals are measured
under that steady load; then an XID is injected through the simulator every 0.5 s (far more faults than a
node sees: each is a MongoDB write, a node status patch and an Event) and its latency is the time from the
injection to its health event document in MongoDB (the simulator's control file is
polled every 20 ms: NVML's own event wait blocks instead, so this is an upper bound). The agent reaches the
API server as in its pod, with a ServiceAccount's token and the cluster's CA in a directory and the server's
address in its environment (`--kubeconfig`: with the cluster's kubeconfig instead).

Measured: the agent's RSS (sampled every second) and CPU (user + system of the agent and its journalctl
child, from /proc, over the measured window), printed beside the goals and, for context, NVSentinel's
published requests for its node DaemonSets (500m CPU, 896 Mi).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import store
from faultline.models import event_id, utc_from_epoch
from sources import simulator

REMOTE = Path("/lib/systemd/systemd-journal-remote")
BOOT = "6c1f0e2d3b4a59687766554433221100"
TICK = os.sysconf("SC_CLK_TCK")
NOISE = [
    "mlx5_core 0000:0c:00.0: mlx5_fw_tracer_handle_traces:714: FWTracer: Event {}",
    "IPv4: martian source 10.0.{}.7 from 10.0.0.1, on dev eth0",
    "nfs: server storage-{} OK",
    "EXT4-fs (nvme0n1p{}): re-mounted. Quota mode: none.",
    'audit: type=1400 audit({}.123:45): apparmor="STATUS" operation="profile_replace"',
]


def journal_writer(path: Path, rate: int, stop: threading.Event, work: Path) -> None:
    """`rate` kernel lines per second, in batches every 100 ms (one journal-remote run per batch)."""
    n = 0
    per_batch = max(1, rate // 10)
    next_at = time.monotonic()
    while not stop.is_set():
        now = int(time.time() * 1e6)
        records = []
        for i in range(per_batch):
            text = NOISE[(n + i) % len(NOISE)].format(n + i)
            records.append(
                f"__REALTIME_TIMESTAMP={now + i}\n__MONOTONIC_TIMESTAMP={now + i}\n_BOOT_ID={BOOT}\n"
                f"_HOSTNAME=bench\n_TRANSPORT=kernel\nSYSLOG_FACILITY=0\nMESSAGE={text}\n"
            )
        export = work / "batch.export"
        export.write_text("\n".join(records) + "\n")
        subprocess.run([str(REMOTE), f"--output={path}", str(export)], check=True, capture_output=True)
        n += per_batch
        next_at += 0.1
        stop.wait(max(0.0, next_at - time.monotonic()))


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory (VmRSS), or one of its parts (RssAnon: its own pages, not the
    libraries' mapped files)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_by_owner(pid: int) -> dict[str, float]:
    """The process's resident MiB by what its pages belong to (from /proc/PID/smaps): "anonymous" (its own
    heap, thread stacks and malloc arenas), a Python package under site-packages (its native modules'
    mapped code), or a file's name (the interpreter, the C and TLS libraries)."""
    owners: dict[str, float] = {}
    owner = "anonymous"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if not head:
            continue
        # a mapping's first line: range perms offset dev inode [path]; then its fields ("Rss:", ...)
        if "-" in head[0] and not head[0].endswith(":"):
            path = " ".join(head[5:])
            if not path or (path.startswith("[") and path not in ("[vdso]", "[vvar]", "[vsyscall]")):
                owner = "anonymous"
            elif "site-packages/" in path:
                owner = path.split("site-packages/", 1)[1].split("/", 1)[0]
            else:
                owner = path.rsplit("/", 1)[-1]
        elif head[0] == "Rss:":
            owners[owner] = owners.get(owner, 0.0) + int(head[1]) / 1024
    return owners


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=1000, help="journal lines per second")
    parser.add_argument("--faults", type=int, default=120, help="XIDs injected after the steady window")
    parser.add_argument(
        "--ingest", action=argparse.BooleanOptionalAction, default=True, help="serve the gRPC ingest socket"
    )
    parser.add_argument("--kubeconfig", action="store_true",
                        help="give the agent the cluster's kubeconfig instead of a pod's service account files")  # fmt: skip
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in the agent's environment (repeatable), e.g. MALLOC_ARENA_MAX=2")  # fmt: skip
    args = parser.parse_args()
    env = {**os.environ, **dict(e.split("=", 1) for e in args.env)}
    if not REMOTE.exists():
        sys.exit("systemd-journal-remote is needed (Debian package systemd-journal-remote)")

    work = Path(tempfile.mkdtemp(prefix="faultline-bench-agent-"))
    journal = work / "kernel.journal"
    stop = threading.Event()
    with LocalCluster(nodes=1) as cluster, LocalMongo() as mongo:
        node = cluster.node_names[0]
        writer = threading.Thread(target=journal_writer, args=(journal, args.rate, stop, work), daemon=True)
        writer.start()
        time.sleep(0.5)  # the journal file exists before journalctl opens it
        if args.kubeconfig:
            credentials = ["--kubeconfig", str(cluster.kubeconfig)]
        else:
            credentials, env = [], {**env, **pod_credentials(cluster, work / "serviceaccount")}
        agent = subprocess.Popen(
            [sys.executable, "-m", "faultline", "agent", "--node", node, "--mongodb-uri", mongo.uri,
             "--database", "bench", *credentials, "--sim-dir", str(work / "sim"),
             "--state-dir", str(work / "state"), "--journal-file", str(journal), "--gpu-poll-interval", "1",
             *(["--ingest-socket", str(work / "ingest.sock")] if args.ingest else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        st = store.connect(mongo.uri, "bench")
        try:
            assert agent.stderr is not None
            print(agent.stderr.readline().strip(), file=sys.stderr)
            time.sleep(args.warmup)
            pids = [agent.pid, *children(agent.pid)]
            # Steady load (the goal's condition): GPUs read every second and the journal, no faults.
            steady_rss: list[float] = []
            steady_anon: list[float] = []
            cpu0, own0, t0 = cpu_seconds(pids), cpu_seconds([agent.pid]), time.monotonic()
            while time.monotonic() - t0 < args.seconds:
                steady_rss.append(rss_mib(agent.pid))
                steady_anon.append(rss_mib(agent.pid, "RssAnon"))
                time.sleep(1.0)
            window = time.monotonic() - t0
            owners = rss_by_owner(agent.pid)
            steady = (
                (cpu_seconds(pids) - cpu0) / window * 100,
                (cpu_seconds([agent.pid]) - own0) / window * 100,
            )
            # Faults on top: an XID every 0.5 s, each timed from injection to its MongoDB document.
            rss: list[float] = []
            latencies: list[float] = []
            cpu0, own0, t0 = cpu_seconds(pids), cpu_seconds([agent.pid]), time.monotonic()
            devices = simulator.devices_for(node)
            for i in range(args.faults):
                gpu = i % 8
                path = simulator.inject(node, gpu, kind="xid", value=13, directory=work / "sim")
                injected = time.time()
                ts = float(json.loads(path.read_text().splitlines()[-1])["ts"])
                want = event_id(node, "nvml", "GPU", devices[gpu].pci, "XID-13", utc_from_epoch(ts))
                while not st.has_event(want):
                    if time.time() - injected > 10:
                        raise SystemExit(f"XID {i} did not reach MongoDB within 10 s")
                    time.sleep(0.002)
                latencies.append(time.time() - injected)
                rss.append(rss_mib(agent.pid))
                time.sleep(max(0.0, 0.5 - (time.time() - injected)))
            fault_window = time.monotonic() - t0
            faulted = (
                (cpu_seconds(pids) - cpu0) / fault_window * 100,
                (cpu_seconds([agent.pid]) - own0) / fault_window * 100,
            )
        finally:
            stop.set()
            agent.terminate()
            agent.wait(20)
            if agent.stderr is not None:
                agent.stderr.close()
            st.close()
    lat = sorted(latencies)
    p50, p99 = statistics.median(lat) * 1000, lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))] * 1000
    rows = [
        (f"steady load, {window:.0f} s", "", "", ""),
        ("  RSS, max (MiB)", f"{max(steady_rss):.1f}", "<= 64", "896 Mi"),
        ("    of which its own (RssAnon, MiB)", f"{max(steady_anon):.1f}", "", ""),
        ("  CPU, % of one core (agent+journalctl)", f"{steady[0]:.2f}", "<= 5", "500m = 50 %"),
        ("    of which the agent process", f"{steady[1]:.2f}", "", ""),
        (f"plus an XID every 0.5 s, {fault_window:.0f} s", "", "", ""),
        ("  RSS, max (MiB)", f"{max(rss):.1f}", "", ""),
        ("  CPU, % of one core (agent+journalctl)", f"{faulted[0]:.2f}", "", ""),
        ("    of which the agent process", f"{faulted[1]:.2f}", "", ""),
        ("  XID -> MongoDB p50 (ms)", f"{p50:.1f}", "", ""),
        (f"  XID -> MongoDB p99 (ms), n={len(lat)}", f"{p99:.1f}", "<= 100", ""),
    ]
    print(f"\nagent on 8 simulated GPUs (fields every 1 s) + journal at {args.rate} lines/s"
          f"{' + gRPC ingest socket' if args.ingest else ''}{' with ' + ' '.join(args.env) if args.env else ''}"
          f", {'a kubeconfig' if args.kubeconfig else 'a service account as in its pod'}:")  # fmt: skip
    print(f"  {'':40} {'measured':>10} {'goal':>8} {'NVSentinel requests':>20}")
    for label, value, goal, context in rows:
        print(f"  {label:40} {value:>10} {goal:>8} {context:>20}")
    print(
        f"\nthe agent's resident MiB by owner, at the end of the steady window ({sum(owners.values()):.1f} in all):"
    )
    for name, mib in sorted(owners.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {name:40} {mib:>10.1f}")


def pod_credentials(cluster: LocalCluster, directory: Path) -> dict[str, str]:
    """What the agent has in its pod instead of a kubeconfig: a ServiceAccount's token and the cluster's CA
    in a mounted directory, the API server's address in its environment. The ServiceAccount is bound to
    cluster-admin here: the benchmark measures the agent, not its RBAC (the chart's tests do)."""
    from kubernetes import client  # noqa: PLC0415

    from faultline import kube  # noqa: PLC0415

    api = cluster.api()
    core: Any = kube.core(api)  # the client's models accept the same dicts
    rbac: Any = client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account("default", {"metadata": {"name": "bench-agent"}})
    rbac.create_cluster_role_binding({
        "metadata": {"name": "bench-agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "bench-agent", "namespace": "default"}],
    })  # fmt: skip
    return cluster.service_account_mount("default", "bench-agent", directory)


if __name__ == "__main__":
    main()
