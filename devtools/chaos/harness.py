"""The chaos environment and one scenario's run.

The environment: the local control plane with simulated GPU nodes and the API server's audit log on
(`audit.POLICY`), FerretDB on one backend, two `NetProxy`s in front of it (one for the agents, one for
the workers: a partition cuts both, a delay only the agents'), a namespace of workload pods, and the
cloud provider's fake (half the nodes have an AWS providerID and are rebooted through its API, the
others by a repair Job).

A scenario, on a fresh database: the four workers and every node's agent start, each node gets its pods,
the injector writes the schedule's events to the nodes' simulated GPUs while the scenario's fault is
injected at its moment and undone (the recovery), then the truth is polled until it holds (converged)
or `converge_timeout_s` passes. Convergence is timed from the recovery or the last injected event,
whichever is later. Then lost events and duplicate actions are counted, and everything the scenario
left is removed (pods, repair Jobs and requests, anything of faultline's on the nodes, the database).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from devtools import procs
from devtools.chaos import audit, plan, truth
from devtools.chaos.fleet import JANITOR_ACCOUNT, JANITOR_NAMESPACE, WORKER_SETTINGS, Fleet
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from devtools.netproxy import NetProxy
from faultline import kube, store
from faultline.errors import ConflictError, NotFoundError
from sources import simulator

WORKLOAD_NAMESPACE = "chaos-load"
DRAIN_MODE_LABEL = "faultline.io/drain-mode"
PROBLEMS_SHOWN = 20  # problems a scenario's result lists when it did not converge (the rest are alike)
STAGE_OF = {"quarantine": (store.Work.QUEUE, store.Stage.QUARANTINE),
            "drain": (store.Work.DRAINS, store.Stage.NODEDRAIN),
            "remediation": (store.Work.REPAIRS, store.Stage.REMEDIATION),
            "janitor": (store.Work.REPAIRS, store.Stage.JANITOR)}  # fmt: skip


class Cloud(Protocol):
    """The provider fake (tests/fakes/cloud.py's FakeCloud): its URL, the calls it took, a reboot hook."""

    url: str
    calls: list[tuple[str, str, str]]
    on_reboot: Callable[[str], None]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # noqa: T201 - progress of a long run


class Environment:
    def __init__(
        self, knobs: plan.Knobs, backend: str, cloud: Cloud, cloud_env: dict[str, str], *,
        work: Path | None = None, node_prefix: str = "chaos", keep_logs: Path | None = None,
    ) -> None:  # fmt: skip
        """`keep_logs`: where the processes' logs of a scenario that misses a goal are copied."""
        self.knobs = knobs
        self.keep_logs = keep_logs
        self.backend = backend
        self.cloud = cloud
        self.cloud_env = cloud_env
        self.work = work or Path(tempfile.mkdtemp(prefix="faultline-chaos-"))
        self.cluster = LocalCluster(knobs.nodes, node_prefix=node_prefix, audit_policy=audit.POLICY)
        self.mongo = LocalMongo(backend=backend)
        self.agent_proxy: NetProxy | None = None
        self.worker_proxy: NetProxy | None = None
        self.cloud_nodes: dict[str, str] = {}  # node -> EC2 instance id
        self.fleet_pids: list[int] = []  # every agent and worker process the scenarios started

    @property
    def nodes(self) -> list[str]:
        return self.cluster.node_names

    def start(self) -> Environment:
        try:
            self.cluster.start()
            self.mongo.start()
            self.agent_proxy = NetProxy(self.mongo.port).start()
            self.worker_proxy = NetProxy(self.mongo.port).start()
            self._prepare()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proxy in (self.agent_proxy, self.worker_proxy):
            if proxy is not None:
                proxy.stop()
        self.mongo.stop()
        self.cluster.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def pids(self) -> list[int]:
        """The environment's processes now (the control plane's, FerretDB's, PostgreSQL's)."""
        found = [p.pid for p in self.cluster.procs]
        found += [p.pid for p in (self.mongo.proc, self.mongo.postgres and self.mongo.postgres.proc) if p]
        return found

    def uri(self, port: int) -> str:
        return f"mongodb://127.0.0.1:{port}/?retryWrites=false&directConnection=true"

    def _prepare(self) -> None:
        api = self.cluster.api()
        core: Any = kube.core(api)  # bodies as plain JSON, which the client takes
        kube.resources.ensure_crds(api)
        for ns, labels in ((JANITOR_NAMESPACE, {}), (WORKLOAD_NAMESPACE, {DRAIN_MODE_LABEL: "Immediate"})):
            with contextlib.suppress(ConflictError), kube.client.translated("create", f"Namespace {ns}"):
                core.create_namespace({"metadata": {"name": ns, "labels": labels}})
        with contextlib.suppress(ConflictError), kube.client.translated("create", "ServiceAccount"):
            core.create_namespaced_service_account(JANITOR_NAMESPACE, {"metadata": {"name": JANITOR_ACCOUNT}})
        for i, node in enumerate(self.nodes):  # every other node is an EC2 instance
            if i % 2 == 0:
                instance = f"i-{i + 1:017x}"
                core.patch_node(node, {"spec": {"providerID": f"aws:///us-east-1a/{instance}"}})
                self.cloud_nodes[node] = instance
        by_instance = {i: n for n, i in self.cloud_nodes.items()}

        def reboot(instance: str) -> None:
            if instance in by_instance:
                self.cluster.fakelet.reboot(by_instance[instance])

        self.cloud.on_reboot = reboot

    def janitor_settings(self) -> dict[str, Any]:
        return {"cloud": "aws", "cloud_endpoint": f"{self.cloud.url}/aws/ec2/", "reboot_via": "cloud"}


@dataclass
class Result:
    scenario: str
    backend: str
    events_sent: int
    lost: int
    dup_cordons: int
    dup_evictions: int
    dup_jobs: int
    dup_cloud: int
    dup_requests: int
    converge_s: float | None
    goal_met: bool
    details: dict[str, Any] = field(default_factory=dict)


def run(env: Environment, scenario: plan.Scenario, index: int) -> Result:
    """One scenario on a fresh database (named after it), everything it left removed afterwards."""
    knobs = env.knobs
    sched = plan.schedule(scenario, knobs, env.nodes)
    database = f"chaos{index}_{scenario.name.replace('-', '_')}"
    work = env.work / f"{index:02d}-{scenario.name}"
    assert env.agent_proxy is not None
    assert env.worker_proxy is not None
    fleet = Fleet(
        work, kubeconfig=env.cluster.kubeconfig, agent_uri=env.uri(env.agent_proxy.port),
        worker_uri=env.uri(env.worker_proxy.port), database=database, knobs=knobs,
        janitor=env.janitor_settings(), worker_env=env.cloud_env,
    )  # fmt: skip
    st = store.connect(env.mongo.uri, database, timeout=5.0)
    api = env.cluster.api()
    sent = truth.Sent()
    details: dict[str, Any] = {"what": scenario.what, "fault_at_s": sched.fault_at, "load_s": sched.load_end,
                               "fatal_nodes": len(sched.fatal)}  # fmt: skip
    result: Result | None = None
    try:
        say(f"[{env.backend}] {scenario.name}: starting the workers and {len(env.nodes)} agents")
        fleet.spawn_workers()
        pods = _create_pods(api, env.nodes, knobs.pods_per_node, index)
        fleet.start_agents(env.nodes)
        fleet.wait_workers()
        time.sleep(knobs.snapshot_s + 1.0)  # each agent's first recovery snapshot is written
        world = truth.World(sched, env.nodes, pods, env.cloud_nodes, WORKLOAD_NAMESPACE)
        marks = audit.offset(env.cluster.audit_log), len(env.cloud.calls)
        t0 = time.monotonic()
        injector = Injector(sched, fleet.sim_dir, t0, sent)
        injector.start()
        say(f"[{env.backend}] {scenario.name}: {len(sched.injections)} events over {sched.load_end:.0f} s, "
            f"the fault at {sched.fault_at:.1f} s")  # fmt: skip
        time.sleep(max(0.0, t0 + sched.fault_at - time.monotonic()))
        recovered = _fault(env, fleet, scenario, sched, st, details)
        details["recovered_at_s"] = round(recovered - t0, 2)
        injector.join()
        since = max(recovered, sent.last_at)
        converged, left = _converge(world, st, api, sent, since + knobs.converge_timeout_s)
        details["problems"] = left[:PROBLEMS_SHOWN]
        converge_s = None if converged is None else round(converged - since, 1)
        result = _measure(env, scenario, world, st, sent, marks, converge_s, details)
        # and, where it did not converge, each worker's last warnings (a CI run's kept logs are out of reach)
        result.details.update(
            errors=fleet.errors(), **({"warnings": fleet.warnings()} if converge_s is None else {})
        )
        return result
    finally:
        fleet.stop()
        env.fleet_pids.extend(fleet.pids)
        if env.keep_logs is not None and (result is None or not result.goal_met):
            kept = env.keep_logs / f"{env.backend}-{index:02d}-{scenario.name}"
            shutil.copytree(work / "logs", kept, dirs_exist_ok=True)
            say(f"[{env.backend}] {scenario.name}: logs kept in {kept}")
        _undo(env)
        _clean(api, env.nodes)
        with contextlib.suppress(Exception):
            st.db.client.drop_database(database)
        st.close()


def _measure(
    env: Environment, scenario: plan.Scenario, world: truth.World, st: store.Store, sent: truth.Sent,
    marks: tuple[int, int], converge_s: float | None, details: dict[str, Any],
) -> Result:  # fmt: skip
    """Lost events and duplicate actions against the truth; `marks`: where the audit log and the cloud
    fake's calls stood when the load began."""
    stored = {str(d["_id"]) for d in st.events.find({}, {"_id": 1})}
    actions = audit.read(env.cluster.audit_log, marks[0], dict.fromkeys(env.nodes, False))
    calls = list(env.cloud.calls[marks[1] :])
    counts = truth.duplicates(world, actions, calls)
    lost = len(sent.ids - stored)
    details.update(
        duplicates=counts.details, missing_actions=truth.missing_actions(world, actions, calls),
        cordon_turns=counts.turns,
        fatal_events_lost=len(sent.fatal_ids - stored), audit_unreadable=actions.unreadable,
        cloud_calls=len(calls), jobs=sum(actions.jobs.values()),
        evictions=sum(actions.evictions.values()), cordons=sum(actions.cordons.values()),
    )  # fmt: skip
    dups = (counts.cordons, counts.evictions, counts.jobs, counts.cloud, counts.requests)
    goal = env.knobs.converge_goal_s
    met = lost == 0 and not any(dups) and converge_s is not None and converge_s <= goal
    return Result(scenario.name, env.backend, len(sent.ids), lost, *dups, converge_s, met, details)


class Injector(threading.Thread):
    """Writes the schedule's events to the nodes' simulated GPUs at their times, recording each one's id."""

    def __init__(self, sched: plan.Schedule, sim_dir: Path, t0: float, sent: truth.Sent) -> None:
        super().__init__(name="chaos-injector", daemon=True)
        self.sched, self.sim_dir, self.t0, self.sent = sched, sim_dir, t0, sent

    def run(self) -> None:
        for inj in self.sched.injections:
            wait = self.t0 + inj.at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            path = simulator.inject(inj.node, inj.gpu, kind="xid", value=inj.xid, directory=self.sim_dir)
            self.sent.add(inj.node, inj.gpu, inj.xid, _last_ts(path), fatal=inj.fatal)
        self.sent.last_at = time.monotonic()


def _last_ts(path: Path) -> float:
    """The time stamp of the record just appended (the simulator stamps it)."""
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - 512))
        return float(json.loads(fh.read().splitlines()[-1])["ts"])


def _fault(
    env: Environment, fleet: Fleet, scenario: plan.Scenario, sched: plan.Schedule, st: store.Store,
    details: dict[str, Any],
) -> float:  # fmt: skip
    """Inject the scenario's fault now and undo it; returns when it was undone (time.monotonic())."""
    knobs = env.knobs
    kind = scenario.fault
    if kind == "agent-kill":
        fleet.kill_agents(list(sched.victims))
        details["victims"] = list(sched.victims)
        time.sleep(knobs.down_s)
        for node in sched.victims:
            fleet.restart_agent(node)
    elif kind == "worker-kill":
        name = scenario.target
        collection, stage = STAGE_OF[name]
        owner = fleet.owners[name]
        flt = {f"{stage}.state": store.State.CLAIMED, f"{stage}.lease_owner": owner}
        deadline = time.monotonic() + knobs.claim_wait_s
        held = 0
        while not held and time.monotonic() < deadline:  # stopped (SIGSTOP) while the store is read:
            fleet.pause_worker(name, True)  # a claim it holds then is one it dies holding
            with contextlib.suppress(Exception):
                held = st.db[collection].count_documents(flt)
            if not held:
                fleet.pause_worker(name, False)
                time.sleep(0.05)
        fleet.kill_worker(name)
        details["claims_held_at_kill"] = held
        time.sleep(knobs.down_s)
        fleet.restart_worker(name)
    elif kind == "ferretdb-kill":
        env.mongo.kill()
        time.sleep(knobs.down_s)
        env.mongo.revive()
    elif kind == "restart":
        sig = signal.SIGKILL if scenario.target == "etcd" else signal.SIGTERM
        details["restart_s"] = round(env.cluster.restart(scenario.target, sig=sig), 1)
    elif kind == "outage":
        assert env.agent_proxy is not None
        assert env.worker_proxy is not None
        env.agent_proxy.partition()
        env.worker_proxy.partition()
        details["outage_s"] = knobs.outage_s
        time.sleep(knobs.outage_s)
        env.agent_proxy.heal()
        env.worker_proxy.heal()
    elif kind == "delay":
        assert env.agent_proxy is not None
        env.agent_proxy.set_delay(knobs.delay_s)
        details["delay_s"], details["delay_for_s"] = knobs.delay_s, knobs.delay_for_s
        time.sleep(knobs.delay_for_s)
        env.agent_proxy.set_delay(0.0)
    return time.monotonic()


def _converge(
    world: truth.World, st: store.Store, api: Any, sent: truth.Sent, deadline: float
) -> tuple[float | None, list[str]]:
    """When the truth first held (time.monotonic()), or None and what still did not at the deadline."""
    while True:
        left = truth.problems(world, st, api, sent)
        if not left:
            return time.monotonic(), []
        if time.monotonic() >= deadline:
            return None, left
        time.sleep(1.0)


def _create_pods(api: Any, nodes: list[str], per_node: int, index: int) -> dict[str, str]:
    """Bare pods bound to each node (a workload to drain), Running before the load starts."""
    core: Any = kube.core(api)
    pods = {}
    for node in nodes:
        for i in range(per_node):
            name = f"s{index}-{node}-{i}"
            core.create_namespaced_pod(WORKLOAD_NAMESPACE, {
                "metadata": {"name": name},
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "train", "image": "registry.invalid/train:1"}]},
            })  # fmt: skip
            pods[f"{WORKLOAD_NAMESPACE}/{name}"] = node

    def running() -> bool:
        listed = kube.pods.list_all(api, namespace=WORKLOAD_NAMESPACE)
        return sum(bool((p.get("status") or {}).get("phase") == "Running") for p in listed) >= len(pods)

    procs.wait_for("the workload pods running", running, 60, interval=0.5)
    return pods


def _undo(env: Environment) -> None:
    """Whatever a failed scenario may have left in the environment itself."""
    for proxy in (env.agent_proxy, env.worker_proxy):
        if proxy is not None:
            proxy.set_delay(0.0)
            proxy.heal()
    if env.mongo.proc is None:
        env.mongo.revive()


def _clean(api: Any, nodes: list[str]) -> None:
    """Remove the scenario's pods, repair Jobs and requests, and anything of faultline's on the nodes."""
    core = kube.core(api)
    core.delete_collection_namespaced_pod(WORKLOAD_NAMESPACE, grace_period_seconds=0)
    kube.batch(api).delete_collection_namespaced_job(JANITOR_NAMESPACE, propagation_policy="Background")
    kube.resources.delete_requests(api, label_selector="faultline.io/node")
    for node in kube.nodes.list_all(api):
        meta, spec = node["metadata"], node["spec"]
        taints = [t for t in spec.get("taints") or [] if not t["key"].startswith("faultline.io/")]
        owned = [k for k in {**(meta.get("annotations") or {}), **(meta.get("labels") or {})}
                 if k.startswith("faultline.io/") and k != "faultline.io/simulated"]  # fmt: skip
        if spec.get("unschedulable") or owned or len(taints) != len(spec.get("taints") or []):
            body = {"metadata": {"annotations": dict.fromkeys(owned), "labels": dict.fromkeys(owned)},
                    "spec": {"unschedulable": None, "taints": taints or None}}  # fmt: skip
            with contextlib.suppress(NotFoundError):
                core.patch_node(meta["name"], body)
        with contextlib.suppress(NotFoundError):
            kube.nodes.write_conditions(api, meta["name"], [], ["FaultlineRemediation"])

    def gone() -> bool:
        left = kube.pods.list_all(api, namespace=WORKLOAD_NAMESPACE)
        left += kube.pods.list_all(api, namespace=JANITOR_NAMESPACE)
        return not left

    procs.wait_for("the scenario's pods gone", gone, 60, interval=0.5)
    ready = set(nodes)
    procs.wait_for("every node Ready", lambda: ready <= _ready_nodes(api), 60, interval=0.5)


def _ready_nodes(api: Any) -> set[str]:
    return {
        n["metadata"]["name"]
        for n in kube.nodes.list_all(api)
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])
    }


# -- the report ------------------------------------------------------------------------------------------
COLUMNS = ("scenario", "backend", "events sent", "lost", "dup cordons", "dup evictions", "dup jobs",
           "dup cloud calls", "converge s", "goal met")  # fmt: skip


def table(results: list[Result]) -> str:
    rows = [COLUMNS] + [
        (r.scenario, r.backend, str(r.events_sent), str(r.lost), str(r.dup_cordons), str(r.dup_evictions),
         str(r.dup_jobs), str(r.dup_cloud), "-" if r.converge_s is None else f"{r.converge_s:.1f}",
         "yes" if r.goal_met else "NO")
        for r in results
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    notes = [f"{r.scenario} ({r.backend}): {r.dup_requests} duplicate RemediationRequests"
             for r in results if r.dup_requests]  # fmt: skip
    return "\n".join(lines + notes)


def report(results: list[Result], knobs: plan.Knobs) -> dict[str, Any]:
    return {"knobs": asdict(knobs), "workers": WORKER_SETTINGS, "results": [asdict(r) for r in results]}
