"""The object monitor on the real control plane and FerretDB: real watches (list, watch with bookmarks,
the field-selected pod watches), the real scheduler and node controller, the store.

Each built-in rule opens its fault when its condition turns true and resolves it when it turns false or
the object goes away (its `for` shortened by an override file, as an operator would). A monitor cut off
from the API server, and one whose resourceVersion the API server no longer has after a restart (410:
listed again), end with the faults the objects call for; a restarted monitor keeps what it held open.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import fakelet, procs
from devtools.cluster import LocalCluster
from devtools.netproxy import NetProxy
from faultline import kube, store
from faultline.errors import NotFoundError
from patterns import object_rules
from tests.integration.test_janitor_api_outage import _proxied_kubeconfig
from workers import breaker, object_monitor, quarantine

pytestmark = pytest.mark.integration
OVERRIDES = """\
pack: test-timing
overrides:
  gpus-not-advertised: {for: 1s}
  node-not-ready: {for: 2s}
  gpu-pod-unschedulable: {for: 1s}
  gpu-pod-admission-error: {params: {within: 20s}}
"""
GPUS, READY, PENDING, ADMISSION = ("KUBE-GPUS-NOT-ADVERTISED", "KUBE-NODE-NOT-READY",
                                   "KUBE-GPU-POD-UNSCHEDULABLE", "KUBE-GPU-ADMISSION-ERROR")  # fmt: skip


@pytest.fixture
def sim_nodes(cluster: LocalCluster) -> Iterator[Callable[[], str]]:
    """make() -> the name of a new simulated 8-GPU node of this test (kept Ready by the fakelet)."""
    made: list[str] = []
    api = cluster.api()

    def make() -> str:
        name = f"om-{uuid.uuid4().hex[:8]}"
        node = fakelet.SimNode(name, f"10.9.{len(made)}.1")
        kube.nodes.create(api, fakelet.node_manifest(node, 8))
        with cluster.fakelet._lock:
            cluster.fakelet.nodes[name] = node
        made.append(name)
        procs.wait_for(f"{name} Ready", lambda: _ready(api, name) == "True", 30)
        return name

    yield make
    for name in made:
        with cluster.fakelet._lock:
            cluster.fakelet.nodes.pop(name, None)
        with contextlib.suppress(NotFoundError):
            kube.nodes.delete(api, name)


@contextlib.contextmanager
def running(
    api: Any, st: store.Store, tmp_path: Path, *, feed: bool = False
) -> Iterator[object_monitor.ObjectMonitor]:
    path = tmp_path / "timing.yaml"
    path.write_text(OVERRIDES)
    settings = object_monitor.Settings(
        rules=object_rules.load([path]), evaluate_interval=dt.timedelta(seconds=1),
        resync_interval=dt.timedelta(seconds=3), watch_timeout=dt.timedelta(seconds=60),
        retry_max=dt.timedelta(seconds=2), analyzer_feed=feed,
    )  # fmt: skip
    monitor = object_monitor.ObjectMonitor(st, api, settings)
    monitor.start()
    try:
        procs.wait_for(
            "every watch listed", lambda: all(i.synced.is_set() for i in monitor.informers.values()), 30
        )
        yield monitor
    finally:
        assert monitor.halt(10.0)


def _ready(api: Any, node: str) -> str:
    found = [c for c in kube.nodes.read(api, node)["status"].get("conditions", []) if c["type"] == "Ready"]
    return str(found[0]["status"]) if found else ""


def _gpus(api: Any, node: str, count: int) -> None:
    """What the device plugin advertises (the fakelet rewrites it only when the node reboots)."""
    kube.nodes.patch_status(api, node, {"allocatable": {"nvidia.com/gpu": str(count)}})


def fault(st: store.Store, node: str, code: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = st.faults.find_one({"node": node, "code": code})
    return found


def state(st: store.Store, node: str, code: str) -> str | None:
    found = fault(st, node, code)
    return None if found is None else str(found["state"])


def wait_state(st: store.Store, node: str, code: str, want: str | None, seconds: float = 40) -> None:
    procs.wait_for(f"{code} on {node} {want}", lambda: state(st, node, code) == want, seconds)


def events(st: store.Store, node: str, code: str) -> list[bool]:
    return [e["healthy"] for e in st.events.find({"node": node, "code": code}).sort("generated_at", 1)]


def test_gpus_not_advertised_opens_a_fault_the_quarantine_acts_on_and_resolves(
    api: Any, mongo_db: Any, sim_nodes: Callable[[], str], tmp_path: Path
) -> None:
    st = store.Store(mongo_db)
    st.ensure_indexes()
    node, other = sim_nodes(), sim_nodes()
    with running(api, st, tmp_path, feed=True):
        _gpus(api, node, 7)  # a GPU fell off the bus: the device plugin advertises 7 of 8
        wait_state(st, node, GPUS, "open")
        found = fault(st, node, GPUS)
        assert found is not None
        assert (found["fatal"], found["action"], found["component"]) == (True, "RESTART_VM", "GPU")
        assert found["entity"] == {"type": "NODE", "id": ""}
        assert found["message"] == "allocatable nvidia.com/gpu is 7, the node has 8 (nvidia.com/gpu.count)"
        assert found["metadata"] == {
            "source": "kube",
            "rule": "gpus-not-advertised",
            "object": f"Node {node}",
        }
        assert events(st, node, GPUS) == [False]
        # like any source's fault: a quarantine work item, and the quarantine worker cordons the node
        assert mongo_db["queue"].find_one({"_id": f"quarantine/{found['_id']}"}) is not None
        settings = quarantine.Settings(hold_down=dt.timedelta(0),
                                       breaker=breaker.BreakerConfig(max_share=None, max_count=None))  # fmt: skip
        worker = quarantine.QuarantineWorker(st, api, settings, "object-monitor-test")
        assert worker.reconcile(node) == "quarantined"
        assert kube.nodes.read(api, node)["spec"].get("unschedulable") is True

        _gpus(api, node, 8)  # back
        wait_state(st, node, GPUS, "resolved")
        assert events(st, node, GPUS) == [False, True]
        assert state(st, other, GPUS) is None  # the other node never had a fault
        reasons = [e["reason"] for e in kube.client.read_json(
            "list", "Events", kube.client.events_api(api).list_namespaced_event, "default",
            field_selector=f"regarding.name={node}")["items"]]  # fmt: skip
        assert GPUS in reasons and f"{GPUS}Resolved" in reasons
        # with analyzer_feed, the cluster analyzer's feed has both changes, as writer object-monitor
        fed = st.feed_after({}).batches
        assert {b.writer for b in fed} == {object_monitor.FEED_WRITER}
        assert [e["healthy"] for b in fed for e in b.events if e["node"] == node] == [False, True]
        assert [f["state"] for b in fed for f in b.faults if f["node"] == node] == ["open", "resolved"]


def test_a_node_not_ready_past_for_opens_and_resolves_when_ready(
    cluster: LocalCluster, api: Any, mongo_db: Any, sim_nodes: Callable[[], str], tmp_path: Path
) -> None:
    st = store.Store(mongo_db)
    st.ensure_indexes()
    node = sim_nodes()
    with running(api, st, tmp_path):
        cluster.fakelet.kill(node)  # its kubelet stops: the node controller marks it Unknown
        procs.wait_for("Ready Unknown", lambda: _ready(api, node) == "Unknown", 60)
        wait_state(st, node, READY, "open")
        found = fault(st, node, READY)
        assert found is not None and found["message"].startswith(
            "Ready is Unknown (NodeStatusUnknown) since "
        )
        cluster.fakelet.revive(node)
        wait_state(st, node, READY, "resolved")
        assert events(st, node, READY) == [False, True]


def test_a_gpu_pod_the_scheduler_cannot_place_on_its_node_opens_until_it_is_placed(
    api: Any, mongo_db: Any, sim_nodes: Callable[[], str], namespace: str, tmp_path: Path
) -> None:
    st = store.Store(mongo_db)
    st.ensure_indexes()
    node = sim_nodes()
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wants-16", "namespace": namespace},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "automountServiceAccountToken": False,
                 "containers": [{"name": "c", "image": "example.invalid/none",
                                 "resources": {"limits": {"nvidia.com/gpu": "16"}}}]},
    }  # fmt: skip
    with running(api, st, tmp_path):
        kube.core(api).create_namespaced_pod(namespace, pod)
        wait_state(st, node, PENDING, "open")
        found = fault(st, node, PENDING)
        assert found is not None and "Insufficient nvidia.com/gpu" in found["message"]
        assert found["metadata"]["object"] == f"Pod {namespace}/wants-16"
        _gpus(api, node, 16)  # now the node can take it: scheduled, running, no longer Pending
        wait_state(st, node, PENDING, "resolved")
        assert kube.pods.read(api, namespace, "wants-16")["spec"].get("nodeName") == node


def test_a_gpu_pod_refused_at_admission_opens_a_fault_that_expires(
    api: Any, mongo_db: Any, namespace: str, tmp_path: Path
) -> None:
    st = store.Store(mongo_db)
    st.ensure_indexes()
    node = f"ghost-{uuid.uuid4().hex[:8]}"  # no kubelet runs it: the test plays the kubelet's part
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "refused", "namespace": namespace},
        "spec": {"nodeName": node, "automountServiceAccountToken": False,
                 "containers": [{"name": "c", "image": "example.invalid/none",
                                 "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
    }  # fmt: skip
    said = ("Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
            "Requested: 2, Available: 1, which is unexpected")  # fmt: skip
    with running(api, st, tmp_path):
        kube.core(api).create_namespaced_pod(namespace, pod)
        kube.pods.patch_status(api, namespace, "refused",
                               {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": said})  # fmt: skip
        wait_state(st, node, ADMISSION, "open")
        found = fault(st, node, ADMISSION)
        assert found is not None and found["message"] == f"pod {namespace}/refused: {said}"
        assert (found["fatal"], found["action"]) == (False, "NONE")
        # `within` (20 s here) after the pod was made, the failure no longer counts: read again as time passes
        wait_state(st, node, ADMISSION, "resolved", seconds=60)


def test_a_monitor_cut_off_from_the_api_server_ends_with_the_faults_the_objects_call_for(
    cluster: LocalCluster, api: Any, mongo_db: Any, sim_nodes: Callable[[], str], tmp_path: Path
) -> None:
    st = store.Store(mongo_db)
    st.ensure_indexes()
    turns_bad, turns_good, goes_away = sim_nodes(), sim_nodes(), sim_nodes()
    with NetProxy(int(urllib.parse.urlsplit(cluster.server).port or 443)) as proxy:
        proxied = kube.api_client(_proxied_kubeconfig(cluster, proxy.port, tmp_path))
        try:
            with running(proxied, st, tmp_path) as monitor:
                for node in (turns_good, goes_away):
                    _gpus(api, node, 6)
                    wait_state(st, node, GPUS, "open")
                nodes = next(i for i in monitor.informers.values() if i.target.kind == "Node")
                errors = nodes.stats.errors
                proxy.reject()  # the API server gone, as the monitor sees it
                procs.wait_for("the node watch failing", lambda: nodes.stats.errors > errors, 30)
                _gpus(api, turns_bad, 7)
                _gpus(api, turns_good, 8)
                with cluster.fakelet._lock:
                    cluster.fakelet.nodes.pop(goes_away)
                kube.nodes.delete(api, goes_away)
                proxy.heal()
                wait_state(st, turns_bad, GPUS, "open")
                wait_state(st, turns_good, GPUS, "resolved")
                wait_state(st, goes_away, GPUS, "resolved")
                assert proxy.connections > 0
        finally:
            proxied.close()


def test_after_an_api_server_restart_a_gone_resource_version_is_listed_again(
    cluster: LocalCluster, api: Any, mongo_db: Any, sim_nodes: Callable[[], str], tmp_path: Path
) -> None:
    st = store.Store(mongo_db)
    st.ensure_indexes()
    turns_bad, turns_good = sim_nodes(), sim_nodes()
    with NetProxy(int(urllib.parse.urlsplit(cluster.server).port or 443)) as proxy:
        proxied = kube.api_client(_proxied_kubeconfig(cluster, proxy.port, tmp_path))
        try:
            with running(proxied, st, tmp_path) as monitor:
                _gpus(api, turns_good, 7)
                wait_state(st, turns_good, GPUS, "open")
                nodes = next(i for i in monitor.informers.values() if i.target.kind == "Node")
                lists = nodes.stats.lists
                proxy.reject()  # the monitor sees nothing of what follows until it reconnects
                _gpus(api, turns_bad, 7)
                _gpus(api, turns_good, 8)
                cluster.restart("kube-apiserver")  # a new watch cache, past the monitor's resourceVersion
                proxy.heal()
                wait_state(st, turns_bad, GPUS, "open", seconds=60)
                wait_state(st, turns_good, GPUS, "resolved", seconds=60)
                assert nodes.stats.expired >= 1, nodes.stats
                assert nodes.stats.lists > lists
        finally:
            proxied.close()


def test_a_restarted_monitor_keeps_what_it_held_open_and_resolves_what_ended_meanwhile(
    api: Any, mongo_db: Any, sim_nodes: Callable[[], str], tmp_path: Path
) -> None:
    st = store.Store(mongo_db)
    st.ensure_indexes()
    still_bad, mended = sim_nodes(), sim_nodes()
    with running(api, st, tmp_path):
        for node in (still_bad, mended):
            _gpus(api, node, 4)
            wait_state(st, node, GPUS, "open")
    before = fault(st, still_bad, GPUS)
    _gpus(api, mended, 8)  # while no monitor runs
    with running(api, st, tmp_path):
        wait_state(st, mended, GPUS, "resolved")
        assert fault(st, still_bad, GPUS) == before  # not resolved and opened again: the same write
        assert events(st, still_bad, GPUS) == [False]
        _gpus(api, still_bad, 8)
        wait_state(st, still_bad, GPUS, "resolved")
