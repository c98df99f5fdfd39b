"""The drainer against the real control plane (pods on a simulated GPU node) and FerretDB: per-namespace
modes, PodDisruptionBudgets respected, DaemonSet pods left, and a drainer killed mid-drain (SIGKILL) whose
node another replica finishes."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from devtools.fakelet import RUN_SECONDS
from devtools.mongo import LocalMongo
from faultline import kube, store
from workers import drainer

pytestmark = pytest.mark.integration


@pytest.fixture
def namespaces(api: Any) -> Iterator[Any]:
    made: list[str] = []
    core = kube.core(api)

    def make(mode: str | None) -> str:
        name = f"d-{(mode or 'default').lower()}-{uuid.uuid4().hex[:6]}"
        labels = {drainer.MODE_LABEL: mode} if mode else {}
        core.create_namespace({"metadata": {"name": name, "labels": labels}})
        procs.wait_for("default SA", lambda: bool(core.read_namespaced_service_account("default", name)), 30)
        made.append(name)
        return name

    yield make
    for name in made:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def held_node(cluster: LocalCluster, api: Any, mongo_db: Any) -> Iterator[str]:
    """A simulated GPU node, cordoned and recorded as quarantined the way the quarantine worker does."""
    node = cluster.node_names[1]
    kube.core(api).patch_node(node, {"spec": {"unschedulable": True}})
    st = store.Store(mongo_db)
    st.ensure_indexes()
    st.nodes.insert_one({"_id": node, "quarantined": True, "quarantined_at": dt.datetime.now(dt.UTC).replace(tzinfo=None),
                         "faults": [], "owned": {"cordoned": True, "taints": [], "labels": []}})  # fmt: skip
    yield node
    kube.core(api).patch_node(node, {"spec": {"unschedulable": None}})


def pod(
    name: str, node: str, *, labels: dict[str, str] | None = None, run_seconds: float | None = None
) -> dict[str, Any]:
    annotations = {RUN_SECONDS: str(run_seconds)} if run_seconds else {}
    return {
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations},
        "spec": {
            "nodeName": node, "restartPolicy": "Never" if run_seconds else "Always",
            "terminationGracePeriodSeconds": 1,  # the simulated kubelet takes the grace period to stop it
            "containers": [{"name": "c", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }  # fmt: skip


def pods_on(api: Any, namespace: str, node: str) -> list[str]:
    got = kube.core(api).list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    return sorted(p.metadata.name for p in got if p.status.phase not in ("Succeeded", "Failed"))


def pdb(api: Any, namespace: str, app: str, min_available: int) -> None:
    kube.policy(api).create_namespaced_pod_disruption_budget(namespace, {
        "metadata": {"name": app}, "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    })  # fmt: skip


def test_modes_budgets_and_daemonsets(api: Any, mongo_db: Any, held_node: str, namespaces: Any) -> None:
    core = kube.core(api)
    imm, allow, late = (
        namespaces("Immediate"),
        namespaces("AllowCompletion"),
        namespaces("DeleteAfterTimeout"),
    )
    for i in range(2):
        core.create_namespaced_pod(imm, pod(f"web-{i}", held_node, labels={"app": "web"}))
    core.create_namespaced_pod(allow, pod("job", held_node, run_seconds=6))
    core.create_namespaced_pod(late, pod("stuck", held_node, labels={"app": "stuck"}))
    kube.apps(api).create_namespaced_daemon_set(imm, {
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"ds": "agent"}}, "template": {
            "metadata": {"labels": {"ds": "agent"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": held_node},
                     "tolerations": [{"operator": "Exists"}], "containers": [{"name": "a", "image": "agent:1"}]}}},
    })  # fmt: skip
    procs.wait_for(
        "the DaemonSet pod", lambda: any(n.startswith("agent-") for n in pods_on(api, imm, held_node)), 30
    )
    procs.wait_for("pods running", lambda: all(
        p.status.phase == "Running" for ns in (imm, late) for p in core.list_namespaced_pod(ns).items), 20)  # fmt: skip
    pdb(api, imm, "web", 2)  # no disruption allowed (a pod still Pending could be evicted regardless)
    pdb(api, late, "stuck", 1)
    st = store.Store(mongo_db)
    d = drainer.Drainer(st, api, drainer.Settings(delete_after=dt.timedelta(seconds=3), poll=0.3, resync_interval=0.3,
                                                  backoff_max=1.0), "test-drainer")  # fmt: skip
    d.start()
    try:
        procs.wait_for(
            "the stuck pod deleted after its timeout", lambda: pods_on(api, late, held_node) == [], 20
        )
        assert [n for n in pods_on(api, imm, held_node) if n.startswith("web")] == ["web-0", "web-1"]  # held
        refused = d.metrics.actions.labels(result="eviction-refused")._value.get()
        assert refused >= 2
        kube.policy(api).delete_namespaced_pod_disruption_budget("web", imm)
        procs.wait_for(
            "web pods evicted", lambda: not any(n.startswith("web") for n in pods_on(api, imm, held_node)), 20
        )
        procs.wait_for(
            "drained", lambda: (st.drains.find_one({"_id": held_node}) or {}).get("result") == "drained", 20
        )
        assert pods_on(api, allow, held_node) == []  # it finished by itself: never evicted
        record = st.drains.find_one({"_id": held_node})
        modes = {r["name"]: r["mode"] for r in record["pods"].values()}
        assert modes == {
            "web-0": "Immediate",
            "web-1": "Immediate",
            "job": "AllowCompletion",
            "stuck": "DeleteAfterTimeout",
        }
        assert "evicted_at" not in next(r for r in record["pods"].values() if r["name"] == "job")
        assert [n for n in pods_on(api, imm, held_node) if n.startswith("agent-")]  # the DaemonSet pod stays
    finally:
        d.halt()


def test_a_drainer_killed_mid_drain_is_taken_over(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, mongo_db: Any, held_node: str, namespaces: Any
) -> None:
    core = kube.core(api)
    ns = namespaces("Immediate")
    for i in range(3):
        core.create_namespaced_pod(ns, pod(f"w-{i}", held_node, labels={"app": "w"}))
    procs.wait_for(
        "pods running",
        lambda: all(p.status.phase == "Running" for p in core.list_namespaced_pod(ns).items),
        20,
    )
    pdb(api, ns, "w", 3)
    argv = [sys.executable, "-m", "faultline", "worker", "drain", "--mongodb-uri", mongo.uri, "--database",
            mongo_db.name, "--kubeconfig", str(cluster.kubeconfig), "--lease", "2s", "--poll", "0.3s"]  # fmt: skip
    first = subprocess.Popen(argv, stderr=subprocess.DEVNULL, start_new_session=True)
    st = store.Store(mongo_db)
    try:
        procs.wait_for("the first drainer holds the node", lambda: (st.drains.find_one({"_id": held_node}) or {})
                       .get(drainer.STAGE, {}).get("state") == "claimed", 30)  # fmt: skip
        owner = st.drains.find_one({"_id": held_node})[drainer.STAGE]["lease_owner"]
        os.killpg(first.pid, signal.SIGKILL)  # mid-drain: the budget holds every pod
        first.wait(10)
        kube.policy(api).delete_namespaced_pod_disruption_budget("w", ns)
        second = drainer.Drainer(st, api, drainer.Settings(poll=0.3, resync_interval=0.3, lease=dt.timedelta(seconds=2)),
                                 "second")  # fmt: skip
        second.start()
        try:
            procs.wait_for("taken over and drained", lambda: (st.drains.find_one({"_id": held_node}) or {})
                           .get("result") == "drained", 30)  # fmt: skip
        finally:
            second.halt()
        assert pods_on(api, ns, held_node) == []
        assert owner != "second"
        assert second.metrics.claims._value.get() >= 1
        kinds = [d["kind"] for d in mongo_db["leases"].find({"stage": drainer.STAGE}).sort("n", 1)]
        assert kinds[:2] == ["claimed", "expired"]  # the dead replica's lease ran out and was reaped
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        time.sleep(0)
