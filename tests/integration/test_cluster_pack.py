"""The built-in cluster pack (patterns/packs/cluster.yaml) in the analyzer process on a real store
(FerretDB), node labels read from the real API server: each rule's derived fault (code, entity, nodes,
the records behind it) and a case that derives none; and the workload rule's suppression, with the
quarantine worker on real Node objects: an application XID burst of one job quarantines none of the
job's nodes (and releases one it had quarantined), while the same escalated XID elsewhere and a
hardware XID on the job's node quarantine as before.

Each rule's test writes the records that must derive nothing first and the one that fires last: the
analyzer reads one writer's records in the order written, so once the last one's faults are there, the
exact set of derived faults shows the earlier records made none."""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import fakelet
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.errors import NotFoundError
from faultline.models import Action, Component, Entity, Fault, FaultState, HealthEvent, event_id, fault_id
from workers import breaker, quarantine

pytestmark = pytest.mark.integration
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
T0 = NOW - dt.timedelta(hours=1)
CLIQUE, SWITCH, ZONE = "nvidia.com/gpu.clique", "faultline.io/switch", "topology.kubernetes.io/zone"


def event(node: str, at: float, code: str, *, fatal: bool = False, component: Component = Component.GPU,
          entity: tuple[str, str] = ("GPU", "0000:3b:00"), **metadata: str) -> HealthEvent:  # fmt: skip
    ts = T0 + dt.timedelta(seconds=at)
    return HealthEvent(
        id=event_id(node, "kmsg", *entity, code, ts), node=node, component=component, check="t", code=code,
        entities=(Entity(type=entity[0], id=entity[1]),), healthy=False, fatal=fatal,
        action=Action.RESTART_BM if fatal else Action.NONE, metadata={"source": "kmsg", **metadata},
        generated_at=ts, observed_at=ts,
    )  # fmt: skip


def agent_fault(node: str, code: str, first: dt.datetime, last: dt.datetime | None = None, *,
                fatal: bool = True, resolved: bool = False, count: int = 1) -> Fault:  # fmt: skip
    """A fault as a node agent writes it (an escalated application XID: fatal, COMPONENT_RESET)."""
    return Fault(
        id=fault_id(node, "GPU", "0000:3b:00", code), node=node, entity=Entity(type="GPU", id="0000:3b:00"),
        code=code, component=Component.GPU, count=count, first_seen=first, last_seen=last or first,
        fatal=fatal, action=Action.COMPONENT_RESET, state=FaultState.RESOLVED if resolved else FaultState.OPEN,
        resolved_at=(last or first) if resolved else None,
    )  # fmt: skip


class Analyzer:
    """`faultline analyzer` with the built-in packs only (no --pack), as a Deployment runs it."""

    def __init__(self, mongo: LocalMongo, db: Any, log: Path, kubeconfig: Path | None) -> None:
        self.path = log
        self.log = log.open("a")
        labels = ["--kubeconfig", str(kubeconfig)] if kubeconfig else ["--no-node-labels"]
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "faultline", "analyzer", "--mongodb-uri", mongo.uri, "--database", db.name,
             *labels, "--poll", "100ms", "--checkpoint-interval", "200ms", "--lease", "5s", "--owner", "t"],
            stdout=self.log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self.log.close()

    def wait(self, what: str, check: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if self.popen.poll() is not None:
                raise AssertionError(f"the analyzer exited before {what}:\n{self.path.read_text()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}:\n{self.path.read_text()[-3000:]}")


@pytest.fixture
def analyzer(mongo: LocalMongo, mongo_db: Any, tmp_path: Path) -> Iterator[Any]:
    started: list[Analyzer] = []

    def start(kubeconfig: Path | None = None) -> Analyzer:
        a = Analyzer(mongo, mongo_db, tmp_path / f"analyzer-{len(started)}.log", kubeconfig)
        started.append(a)
        a.wait("the lease", lambda: "analyzer: active as t" in a.path.read_text())
        return a

    yield start
    for a in started:
        a.stop()


@pytest.fixture
def labelled(cluster: LocalCluster, api: Any) -> Iterator[Any]:
    """Sets a label on the local cluster's nodes for one test ({node: value}), removed afterwards."""
    set_: list[tuple[str, str]] = []

    def label(key: str, values: dict[str, str]) -> None:
        for name, value in values.items():
            kube.nodes.patch(api, name, {"metadata": {"labels": {key: value}}})
            set_.append((name, key))

    yield label
    for name, key in set_:
        kube.nodes.patch(api, name, {"metadata": {"labels": {key: None}}})


def derived(st: store.Store, code: str) -> dict[str, dict[str, Any]]:
    """The derived faults of `code`, by node."""
    return {d["node"]: d for d in st.faults.find({"code": code})}


def test_the_same_gpu_failing_again_across_nodes_is_one_gpu_fault(analyzer: Any, mongo_db: Any) -> None:
    st = store.Store(mongo_db)
    a = analyzer()
    first, second = event("n1", 0, "XID-79", gpu_uuid="GPU-A"), event("n1", 1200, "XID-95", gpu_uuid="GPU-A")
    moved = event("n7", 2400, "XID-119", gpu_uuid="GPU-A")  # the GPU, moved to n7 after a repair
    others = [event("n2", 10, "XID-79", gpu_uuid="GPU-B"), event("n2", 20, "XID-79", gpu_uuid="GPU-B"),
              event("n2", 30, "XID-13", gpu_uuid="GPU-B")]  # two sticky XIDs and an application one  # fmt: skip
    for e in (first, *others, second):
        st.record_batch([e], [])
    st.record_batch([moved], [])
    a.wait("the derived fault", lambda: bool(derived(st, "GPU-REPEATED-FAILURE")))
    got = derived(st, "GPU-REPEATED-FAILURE")
    assert list(got) == ["n7"]
    f = got["n7"]
    assert (f["entity"], f["fatal"], f["action"], f["count"], f["pattern"]) == (
        {"type": "GPU-UUID", "id": "GPU-A"}, True, "CONTACT_SUPPORT", 3, "gpu-repeated-failure"
    )  # fmt: skip
    assert f["metadata"]["records"].split(",") == [first.id, second.id, moved.id]
    assert mongo_db["queue"].find_one({"_id": f"quarantine/{f['_id']}"}) is not None  # quarantine takes it


def test_fatal_faults_opened_five_times_on_a_node_make_it_a_repeat_offender(
    analyzer: Any, mongo_db: Any
) -> None:
    st = store.Store(mongo_db)
    a = analyzer()
    day = dt.timedelta(days=1)
    start = NOW - 6 * day
    # m1: one fatal fault, written nine times as its count grows: one opening
    for i in range(1, 10):
        st.record_batch(
            [], [(agent_fault("m1", "XID-79", start, start + i * dt.timedelta(minutes=5), count=i), i)]
        )
    # n1: XID-79 opens, resolves (a repair), opens again; three other fatal faults: five openings
    writes = [
        (agent_fault("n1", "XID-79", start), 1),
        (agent_fault("n1", "XID-79", start, start + dt.timedelta(minutes=5), count=2), 2),  # an update
        (agent_fault("n1", "XID-79", start, start + dt.timedelta(hours=1), resolved=True), 3),
        (agent_fault("n1", "XID-79", start + day), 4),  # reopened: a new episode
        (agent_fault("n1", "XID-48", start + 2 * day), 5),
        (agent_fault("n1", "XID-13", start + 3 * day, fatal=False), 6),  # not fatal: not counted
        (agent_fault("n1", "XID-95", start + 4 * day), 7),
    ]
    for w in writes:
        st.record_batch([], [w])
    fifth = agent_fault("n1", "XID-119", start + 5 * day)
    st.record_batch([], [(fifth, 8)])
    a.wait("the derived fault", lambda: bool(derived(st, "NODE-REPEATED-FAILURE")))
    got = derived(st, "NODE-REPEATED-FAILURE")
    assert list(got) == ["n1"]
    f = got["n1"]
    assert (f["entity"], f["fatal"], f["action"], f["count"]) == (
        {"type": "NODE", "id": "n1"}, True, "REPLACE_VM", 5
    )  # fmt: skip
    # every fatal open revision in the window is a record behind it (the update of the first one too)
    ids = {fault_id("n1", "GPU", "0000:3b:00", c) for c in ("XID-79", "XID-48", "XID-95", "XID-119")}
    assert {r.rpartition("@")[0] for r in f["metadata"]["records"].split(",")} == ids


def test_one_application_xid_on_three_nodes_of_a_job_is_the_jobs_fault(analyzer: Any, mongo_db: Any) -> None:
    st = store.Store(mongo_db)
    a = analyzer()
    burst = [event("a", 0, "XID-13", job="ml/train"), event("b", 30, "XID-13", job="ml/train"),
             event("b", 40, "XID-13", job="ml/train")]  # fmt: skip
    unrelated = [event("c", 50, "XID-13", job="ml/eval"), event("d", 60, "XID-31", job="ml/train"),
                 event("e", 70, "XID-13")]  # another job, another code, no job known  # fmt: skip
    st.record_batch(burst + unrelated, [])
    third = event("c", 90, "XID-13", job="ml/train")
    st.record_batch([third], [])
    a.wait("the workload faults", lambda: len(derived(st, "WORKLOAD-APP-XID")) == 3)
    got = derived(st, "WORKLOAD-APP-XID")
    assert sorted(got) == ["a", "b", "c"]
    for f in got.values():
        assert (f["entity"], f["fatal"], f["action"], f["count"]) == (
            {"type": "JOB", "id": "ml/train"}, False, "RESTART_APP", 3
        )  # fmt: skip
        assert f["metadata"]["records"].split(",") == [e.id for e in (*burst, third)]
        assert f["metadata"]["window"] == "ml/train/XID-13"
        assert (f["metadata"]["suppresses"], f["metadata"]["suppress_for"]) == (
            "XID-13,XID-31,XID-43,XID-45",
            "3600",
        )


def test_nvlink_errors_on_three_nodes_of_one_domain_are_one_fabric_fault(
    analyzer: Any, mongo_db: Any, cluster: LocalCluster, labelled: Any
) -> None:
    n = cluster.node_names
    labelled(CLIQUE, {n[0]: "c1.0", n[1]: "c1.0", n[2]: "c1.0", n[3]: "c2.0"})
    st = store.Store(mongo_db)
    a = analyzer(cluster.kubeconfig)
    sw = ("NVSWITCH", "0000:c3:00")
    st.record_batch([event(n[0], 0, "XID-74"), event(n[0], 10, "XID-74"), event(n[3], 20, "XID-74"),
                     event(n[4], 30, "XID-74"), event(n[1], 40, "XID-79")], [])  # fmt: skip
    fired = [
        event(n[1], 50, "SXID-24007", component=Component.NVSWITCH, entity=sw),
        event(n[2], 60, "XID-145"),
    ]
    st.record_batch(fired, [])
    a.wait("the fabric fault", lambda: len(derived(st, "NVLINK-FABRIC-FAULT")) == 3)
    got = derived(st, "NVLINK-FABRIC-FAULT")
    assert sorted(got) == sorted(n[:3])
    assert {(f["entity"]["type"], f["entity"]["id"], f["component"], f["fatal"], f["count"]) for f in got.values()} == {
        ("NVLINK-DOMAIN", "c1.0", "NVSWITCH", False, 3)
    }  # fmt: skip


def test_links_down_on_three_nodes_under_one_switch_are_one_network_fault(
    analyzer: Any, mongo_db: Any, cluster: LocalCluster, labelled: Any
) -> None:
    n = cluster.node_names
    labelled(SWITCH, {n[0]: "leaf-7", n[1]: "leaf-7", n[2]: "leaf-7", n[3]: "leaf-8"})
    st = store.Store(mongo_db)
    a = analyzer(cluster.kubeconfig)

    def down(node: str, at: float, code: str = "NIC-LINK-DOWN") -> HealthEvent:
        return event(node, at, code, component=Component.NIC, entity=("NIC", "mlx5_0/1"))

    st.record_batch([down(n[0], 0), down(n[1], 10, "NIC-IB-LINK-DOWNED"), down(n[3], 20), down(n[4], 30)], [])
    last = down(n[2], 40, "NIC-LINK-FLAPPING")
    st.record_batch([last], [])
    a.wait("the network fault", lambda: len(derived(st, "NETWORK-SWITCH-FAULT")) == 3)
    got = derived(st, "NETWORK-SWITCH-FAULT")
    assert sorted(got) == sorted(n[:3])
    for f in got.values():
        assert (f["entity"], f["component"], f["fatal"], f["action"], f["count"]) == (
            {"type": "SWITCH", "id": "leaf-7"}, "NIC", False, "CONTACT_SUPPORT", 3
        )  # fmt: skip
        assert len(f["metadata"]["records"].split(",")) == 3 and last.id in f["metadata"]["records"]


def test_fatal_errors_on_five_nodes_of_a_zone_are_an_infrastructure_incident(
    analyzer: Any, mongo_db: Any, cluster: LocalCluster, labelled: Any
) -> None:
    n = cluster.node_names
    labelled(ZONE, dict.fromkeys(n, "zone-a"))
    st = store.Store(mongo_db)
    a = analyzer(cluster.kubeconfig)
    fatal = [event(node, i * 10, "XID-79", fatal=True, gpu_uuid=f"G-{i}") for i, node in enumerate(n[:4])]
    st.record_batch([*fatal, event(n[4], 50, "XID-13", gpu_uuid="G-4")], [])  # the fifth node: not fatal
    st.record_batch([event(n[4], 60, "PCIE-AER-FATAL", fatal=True, gpu_uuid="G-4")], [])
    a.wait("the incident", lambda: len(derived(st, "ZONE-INCIDENT")) == 5)
    got = derived(st, "ZONE-INCIDENT")
    assert sorted(got) == sorted(n)
    assert {(f["entity"]["id"], f["fatal"], f["action"], f["count"]) for f in got.values()} == {
        ("zone-a", False, "NONE", 5)
    }


# -- the workload rule's suppression, with the quarantine worker ------------------------------------------


@pytest.fixture
def gpu_nodes(api: Any) -> Iterator[list[str]]:
    """Five fresh GPU Node objects (not heartbeated: only their spec and metadata matter here)."""
    names = [f"s-{uuid.uuid4().hex[:8]}" for _ in range(5)]
    core = kube.core(api)
    for name in names:
        core.create_node(fakelet.node_manifest(fakelet.SimNode(name, "10.9.0.1"), 8))
    yield names
    for name in names:
        with contextlib.suppress(NotFoundError):
            kube.nodes.delete(api, name)


def cordoned(api: Any, node: str) -> bool:
    return bool(kube.nodes.read(api, node)["spec"].get("unschedulable"))


def handled(db: Any, fault: Fault) -> bool:
    item = db["queue"].find_one({"_id": f"quarantine/{fault.id}"})
    return item is not None and item["quarantine"]["state"] == store.State.DONE


def test_an_application_xid_burst_of_one_job_quarantines_none_of_its_nodes(
    analyzer: Any, mongo_db: Any, api: Any, gpu_nodes: list[str]
) -> None:
    a_, b_, c_, other, d_ = gpu_nodes
    st = store.Store(mongo_db)
    st.ensure_indexes()
    settings = quarantine.Settings(hold_down=dt.timedelta(seconds=0.5), resync_interval=0.2, threads=2,
                                   lease=dt.timedelta(seconds=5), breaker=breaker.BreakerConfig(max_share=None))  # fmt: skip
    worker = quarantine.QuarantineWorker(st, api, settings, "t-quarantine")
    worker.start()
    an = analyzer()
    try:
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        # before the job's burst is known: c's agent escalated its XID-13 (five on one GPU): quarantined,
        # as is another job's node with the same escalation
        early, elsewhere = agent_fault(c_, "XID-13", now, count=5), agent_fault(other, "XID-13", now, count=5)
        st.record_batch([], [(early, 1), (elsewhere, 1)])
        an.wait("both quarantined", lambda: cordoned(api, c_) and cordoned(api, other))

        # the job's XID-13 on three of its nodes (d, of another job, sees one too): the workload fault
        at = (now - T0).total_seconds()
        burst = [event(n, at + i, "XID-13", job="ml/train") for i, n in enumerate((a_, b_, c_))]
        st.record_batch([*burst, event(d_, at + 4, "XID-13", job="ml/eval")], [])
        an.wait("the workload faults", lambda: len(derived(st, "WORKLOAD-APP-XID")) == 3)
        assert sorted(derived(st, "WORKLOAD-APP-XID")) == sorted((a_, b_, c_))
        an.wait("c released", lambda: not cordoned(api, c_), timeout=30)  # its escalation is the job's bug

        # escalations on the job's nodes now, within the hour: quarantine leaves them alone
        later = dt.datetime.now(dt.UTC).replace(microsecond=0)
        on_a, on_d = agent_fault(a_, "XID-13", later, count=5), agent_fault(d_, "XID-13", later, count=5)
        st.record_batch([], [(on_a, 1), (on_d, 1)])
        an.wait(
            "the quarantine worker took both", lambda: handled(mongo_db, on_a) and handled(mongo_db, on_d)
        )
        an.wait("d quarantined (not the job's node)", lambda: cordoned(api, d_), timeout=30)
        assert not cordoned(api, a_) and not cordoned(api, b_) and not cordoned(api, c_)
        assert cordoned(api, other)  # the unrelated node stays quarantined

        # a hardware XID on the job's node quarantines it as before
        hardware = agent_fault(b_, "XID-79", later)
        st.record_batch([], [(hardware, 1)])
        an.wait("b quarantined by XID-79", lambda: cordoned(api, b_), timeout=30)
        assert not cordoned(api, a_)
        # the hold's record is written after the cordon (and its Event): wait for it, not just the cordon
        an.wait("b's hold recorded", lambda: getattr(st.hold(b_), "faults", None) == [hardware.id])
    finally:
        worker.halt()


def gpu_pod(namespace: str, name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": node, "containers": [{
            "name": "main", "image": "registry.invalid/train:1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
        }]},
    }  # fmt: skip


def test_events_get_the_job_of_the_pods_holding_the_nodes_gpus(
    analyzer: Any, mongo_db: Any, cluster: LocalCluster, api: Any, namespace: str
) -> None:
    """No event says its job: the analyzer reads it from the API server's pods (a JobSet's gang label,
    a Job's label), for the nodes whose GPUs one job holds; a node two jobs share gets none."""
    n = cluster.node_names
    core = kube.core(api)
    for i, node in enumerate(n[:3]):  # one JobSet across three nodes
        core.create_namespaced_pod(namespace, gpu_pod(namespace, f"train-{i}", node,
                                                      {"jobset.sigs.k8s.io/jobset-name": "train"}))  # fmt: skip
    core.create_namespaced_pod(
        namespace, gpu_pod(namespace, "eval-0", n[3], {"batch.kubernetes.io/job-name": "eval"})
    )
    core.create_namespaced_pod(
        namespace, gpu_pod(namespace, "other-0", n[3], {"job-name": "other"})
    )  # shared
    st = store.Store(mongo_db)
    a = analyzer(cluster.kubeconfig)
    st.record_batch([event(n[3], 0, "XID-13"), event(n[4], 5, "XID-13")], [])  # a shared node, no pods
    st.record_batch([event(node, 10 + i, "XID-13") for i, node in enumerate(n[:3])], [])
    a.wait("the workload faults", lambda: len(derived(st, "WORKLOAD-APP-XID")) == 3)
    got = derived(st, "WORKLOAD-APP-XID")
    assert sorted(got) == sorted(n[:3])
    assert {f["entity"]["id"] for f in got.values()} == {f"{namespace}/train"}
