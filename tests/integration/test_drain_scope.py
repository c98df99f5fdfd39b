"""What a drain leaves, on the real control plane (pods on a simulated GPU node) and FerretDB: a system
namespace's pods are never evicted; a partial drain moves only the pods of the faulty GPU, from the
mapping the node agent's pod-resources watch wrote (read from a gRPC server standing in for the kubelet,
`tests.fakes.kubelet`: the local cluster's kubelet has no device plugin); remediation widens it to the
whole node before a reboot. And the chart: the settings it writes, and the agent's pod-resources mount
only when partial drains are on."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import config, kube, store
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from sources import pod_resources
from sources.gpu import GpuDevice
from tests.fakes import kubelet
from tests.integration.test_chart import render, settings_files, workloads
from tests.integration.test_drainer import pod, pods_on
from tests.integration.test_workers_e2e import forget_repairs, system_namespace
from workers import drainer, remediation

pytestmark = pytest.mark.integration
G0, G1 = "0000:18:00", "0000:19:00"
GPUS = [GpuDevice(0, "GPU-6b1c0e4e-0000-4000-8000-000000000018", G0),
        GpuDevice(1, "GPU-6b1c0e4e-0000-4000-8000-000000000019", G1)]  # fmt: skip
FAST = {"poll": 0.3, "resync_interval": 0.3, "lease": dt.timedelta(seconds=5)}


def gpu_fault(node: str, gpu: str, code: str, action: Action) -> Fault:
    now = dt.datetime.now(dt.UTC)
    return Fault(
        id=fault_id(node, "GPU", gpu, code), node=node, entity=Entity(type="GPU", id=gpu), code=code,
        component=Component.GPU, count=1, first_seen=now, last_seen=now, fatal=True, action=action,
        state=FaultState.OPEN,
    )  # fmt: skip


@pytest.fixture
def node(cluster: LocalCluster, api: Any) -> Iterator[str]:
    """A simulated GPU node, cordoned (as the quarantine worker does); uncordoned after."""
    name = cluster.node_names[2]
    kube.core(api).patch_node(name, {"spec": {"unschedulable": True}})
    yield name
    kube.core(api).patch_node(name, {"spec": {"unschedulable": None}})


@pytest.fixture
def workload_ns(api: Any, node: str) -> Iterator[str]:
    """A namespace for the test's pods, removed after with its pods gone from the shared node."""
    core = kube.core(api)
    name = f"scope-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    procs.wait_for("default SA", lambda: bool(core.read_namespaced_service_account("default", name)), 30)
    yield name
    core.delete_namespace(name, propagation_policy="Background")
    procs.wait_for("the test's pods gone", lambda: not core.list_namespaced_pod(name).items, 30)


def hold(st: store.Store, node: str, faults: list[Fault], episode: dt.datetime | None = None) -> dt.datetime:
    """The faults in the store and the node held for them (the quarantine worker's record); the episode."""
    for revision, f in enumerate(faults, start=1):
        st.write_fault(f, revision)
    at = episode or st.clock()
    st.record_hold(
        node, faults=[f.id for f in faults], owned={"cordoned": True}, at=at, newly=episode is None
    )
    return at


def plain_pod(name: str, node: str) -> dict[str, Any]:
    """A pod that asks for no GPU."""
    body = pod(name, node)
    del body["spec"]["containers"][0]["resources"]
    return body


def running(api: Any, namespace: str, names: set[str]) -> bool:
    pods = kube.core(api).list_namespaced_pod(namespace).items
    return {p.metadata.name for p in pods if p.status.phase == "Running"} >= names


def records(st: store.Store, node: str) -> dict[str, store.PodRecord]:
    drain = st.drain(node)
    assert drain is not None
    return {r.name: r for r in drain.pods.values()}


def drained(st: store.Store, node: str) -> bool:
    d = st.drain(node)
    return d is not None and d.result == store.DRAINED


def test_a_system_namespaces_pods_are_never_evicted(
    api: Any, mongo_db: Any, node: str, workload_ns: str
) -> None:
    core = kube.core(api)
    system_pod = f"fl-scope-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod("kube-system", plain_pod(system_pod, node))  # no DaemonSet owns it
    st = store.Store(mongo_db)
    st.ensure_indexes()
    d = drainer.Drainer(st, api, drainer.Settings(**FAST), "scope-drainer")  # the default: kube-system
    try:
        core.create_namespaced_pod(workload_ns, plain_pod("work", node))
        procs.wait_for("both pods running", lambda: running(api, workload_ns, {"work"})
                       and running(api, "kube-system", {system_pod}), 20)  # fmt: skip
        hold(st, node, [gpu_fault(node, G0, "XID-79", Action.RESTART_BM)])
        d.start()
        procs.wait_for("drained", lambda: drained(st, node), 30)
        assert pods_on(api, workload_ns, node) == []
        assert system_pod in pods_on(api, "kube-system", node)  # still there, never asked to leave
        assert core.read_namespaced_pod(system_pod, "kube-system").metadata.deletion_timestamp is None
        got = records(st, node)
        assert got[system_pod].skipped == "system namespace kube-system"
        assert got[system_pod].evicted_at is None and not got[system_pod].evicted
        assert got["work"].evicted and got["work"].skipped is None
        assert st.drain(node).scope == "node"  # type: ignore[union-attr]
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
        assert any(
            e.reason == "FaultlineDrained" and "left (system namespaces" in (e.message or "") for e in events
        )
    finally:
        d.halt()
        with contextlib.suppress(Exception):
            core.delete_namespaced_pod(system_pod, "kube-system", grace_period_seconds=0)
        procs.wait_for("the system pod gone", lambda: system_pod not in pods_on(api, "kube-system", node), 30)


def test_a_partial_drain_moves_only_the_faulty_gpus_pods_until_a_reboot_needs_the_node(
    api: Any, mongo: LocalMongo, mongo_db: Any, node: str, workload_ns: str
) -> None:
    core = kube.core(api)
    system_namespace(api)  # the CRD, for remediation's requests
    forget_repairs(api, node)  # the node is shared: an earlier test's request would read as this one's
    st = store.Store(mongo_db)
    st.ensure_indexes()
    for name in ("a", "b"):  # a on GPU 0 (the faulty one), b on GPU 1
        core.create_namespaced_pod(workload_ns, pod(name, node))
    core.create_namespaced_pod(workload_ns, plain_pod("cpu", node))
    procs.wait_for("pods running", lambda: running(api, workload_ns, {"a", "b", "cpu"}), 20)
    on_gpus: kubelet.Pods = {
        (workload_ns, "a"): {"c": [("nvidia.com/gpu", [GPUS[0].uuid])]},
        (workload_ns, "b"): {"c": [("nvidia.com/gpu", [GPUS[1].uuid])]},
        (workload_ns, "cpu"): {"c": []},
    }
    reset = gpu_fault(node, G0, "XID-48", Action.COMPONENT_RESET)
    settings = drainer.Settings(partial_gpu_drain=True, partial_wait=dt.timedelta(minutes=5), **FAST)
    d = drainer.Drainer(st, api, settings, "scope-drainer")
    r = remediation.Remediation(
        st, api, remediation.Settings(resync_interval=0.3, lease=FAST["lease"]), "scope-r"
    )
    with kubelet.serving(on_gpus) as (socket, fake):
        link = pod_resources.store_link(st, node)
        watch = pod_resources.GpuPodsWatch(node, GPUS, lambda: pod_resources.list_devices(socket), link,
                                           interval=0.2)  # fmt: skip
        try:
            watch.start()  # the agent's side: written before the quarantine, then again for its episode
            procs.wait_for("a first mapping", lambda: st.gpu_pods_of(node) is not None, 20)
            episode = hold(st, node, [reset])
            d.start()
            procs.wait_for("drained", lambda: drained(st, node), 30)
            mapping = st.gpu_pods_of(node)
            assert mapping is not None and mapping.episode == episode  # read after the cordon
            assert fake.calls >= 2
            assert pods_on(api, workload_ns, node) == ["b", "cpu"]  # only a, on the faulty GPU, was evicted
            partial = st.drain(node)
            assert partial is not None and (partial.scope, partial.gpus) == ("gpus", [G0])
            assert "only the pods of GPU 0000:18:00 (the faults need COMPONENT_RESET)" in (
                partial.scope_reason or ""
            )
            got = records(st, node)
            assert got["a"].evicted and got["a"].skipped is None
            assert got["b"].skipped == f"uses GPU {G1}, not the faulty {G0} (partial drain)"
            assert got["cpu"].skipped == "uses no GPU (partial drain)"

            # a second fault, on GPU 1, needs a reboot: remediation widens the drain before asking for it
            bm = gpu_fault(node, G1, "XID-79", Action.RESTART_BM)
            hold(st, node, [reset, bm], episode=episode)
            r.start()
            procs.wait_for("a reboot asked for", lambda: bool(requests(api, node)), 40)
            whole = st.drain(node)
            assert whole is not None and whole.result == store.DRAINED and whole.scope == "node"
            assert whole.scope_reason == "REBOOT needs the whole node"
            assert pods_on(api, workload_ns, node) == []  # b and cpu moved before the request was written
            assert [q["spec"]["action"] for q in requests(api, node)] == ["REBOOT"]
            got = records(st, node)
            assert got["b"].evicted and got["b"].skipped is None and got["cpu"].skipped is None
            repair = st.repairs_of(node)[0]
            assert [x.step for x in repair.rounds] == ["REBOOT"]  # no round was written while it waited
            events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
            assert any(e.reason == "FaultlineDrainWidened" for e in events)
        finally:
            watch.close()
            d.halt()
            r.halt()
            forget_repairs(api, node)


def requests(api: Any, node: str) -> list[dict[str, Any]]:
    return kube.resources.list_requests(api, label_selector=f"faultline.io/node={node}")


def test_the_chart_sets_system_namespaces_and_mounts_pod_resources_only_for_partial_drains() -> None:
    off = render("drain.enabled=true")
    files = settings_files(off)
    assert files["drain"]["system_namespaces"] == ["kube-system", "faultline-chart"]  # with its own
    assert files["drain"]["partial_gpu_drain"] is False
    assert "pod_resources_socket" not in files["agent"]
    agent = workloads(off)["fl-agent"]
    assert "pod-resources" not in {v["name"] for v in agent["volumes"]}

    on = render("drain.enabled=true", "drain.partialGpuDrain=true", "drain.systemNamespaces={gpu-operator}")
    files = settings_files(on)
    assert files["drain"]["system_namespaces"] == ["gpu-operator", "faultline-chart"]
    assert files["drain"]["partial_gpu_drain"] is True
    assert files["agent"]["pod_resources_socket"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    agent = workloads(on)["fl-agent"]
    mount = next(m for m in agent["containers"][0]["volumeMounts"] if m["name"] == "pod-resources")
    volume = next(v for v in agent["volumes"] if v["name"] == "pod-resources")
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}

    resolved = config.DrainConfig.model_validate({**files["drain"], "mongodb_uri": "mongodb://mongo:27017"})
    assert resolved.system_namespaces == ("gpu-operator", "faultline-chart") and resolved.partial_gpu_drain
    with pytest.raises(ValueError, match=r"at '/drain/systemNamespaces/0'"):
        render("drain.systemNamespaces={Kube_System}")
