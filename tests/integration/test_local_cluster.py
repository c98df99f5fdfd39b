"""The local control plane is real: kube-scheduler places pods on simulated GPU nodes, the disruption
controller computes PodDisruptionBudgets that the Eviction API enforces, the job controller runs Jobs,
RBAC applies to minted ServiceAccount credentials, and simulated nodes reboot."""

from __future__ import annotations

import multiprocessing
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devtools import procs, tools
from devtools.cluster import LocalCluster, connections_opened
from faultline import kube
from faultline.errors import ConfigError, ForbiddenError, NotFoundError, ThrottledError

pytestmark = pytest.mark.integration


def deployment(
    name: str, replicas: int, *, gpus: int = 1, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    labels = labels or {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "train",
                            "image": "sim/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def pods(api: Any, namespace: str, selector: str) -> list[Any]:
    return list(kube.core(api).list_namespaced_pod(namespace, label_selector=selector).items)


def running(api: Any, namespace: str, selector: str, n: int) -> bool:
    items = pods(api, namespace, selector)
    return len(items) == n and all(
        p.status.phase == "Running" and p.metadata.deletion_timestamp is None for p in items
    )


def test_kube_apiserver_reports_the_pinned_version() -> None:
    out = subprocess.run(
        [str(tools.binary("kube-apiserver")), "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "Kubernetes v1.37.2"


def test_simulated_nodes_look_like_gpu_nodes(cluster: LocalCluster, api: Any) -> None:
    nodes = {n.metadata.name: n for n in kube.core(api).list_node().items}
    assert set(cluster.node_names) <= set(nodes)
    node = nodes[cluster.node_names[0]]
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    assert node.metadata.labels["nvidia.com/gpu.present"] == "true"
    assert node.metadata.labels["nvidia.com/gpu.product"].startswith("NVIDIA-")
    lease = kube.coordination(api).read_namespaced_lease(node.metadata.name, "kube-node-lease")
    assert lease.spec.holder_identity == node.metadata.name


def test_scheduler_places_pods_and_respects_a_cordon(cluster: LocalCluster, api: Any, namespace: str) -> None:
    apps, core = kube.apps(api), kube.core(api)
    apps.create_namespaced_deployment(namespace, deployment("train", 8))
    procs.wait_for("8 pods Running", lambda: running(api, namespace, "app=train", 8), 60)
    placed = {p.spec.node_name for p in pods(api, namespace, "app=train")}
    assert placed <= set(cluster.node_names)
    assert len(placed) > 1  # spread over several nodes
    cordoned = cluster.node_names[0]
    core.patch_node(cordoned, {"spec": {"unschedulable": True}})
    try:
        before = {p.metadata.name for p in pods(api, namespace, "app=train") if p.spec.node_name == cordoned}
        apps.patch_namespaced_deployment_scale("train", namespace, {"spec": {"replicas": 20}})
        procs.wait_for("20 pods Running", lambda: running(api, namespace, "app=train", 20), 60)
        after = {p.metadata.name for p in pods(api, namespace, "app=train") if p.spec.node_name == cordoned}
        assert after == before  # 12 new pods, none on the cordoned node
    finally:
        core.patch_node(cordoned, {"spec": {"unschedulable": False}})


def test_eviction_respects_a_pod_disruption_budget(api: Any, namespace: str) -> None:
    kube.apps(api).create_namespaced_deployment(namespace, deployment("serve", 2, gpus=0))
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "serve"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "serve"}}},
    }
    policy = kube.policy(api)
    policy.create_namespaced_pod_disruption_budget(namespace, pdb)
    procs.wait_for("2 pods Running", lambda: running(api, namespace, "app=serve", 2), 60)

    def budget() -> tuple[int, int]:
        st = policy.read_namespaced_pod_disruption_budget("serve", namespace).status
        return (st.current_healthy, st.disruptions_allowed) if st and st.observed_generation else (-1, -1)

    procs.wait_for("the disruption controller to compute the budget", lambda: budget() == (2, 0), 60)
    victim = pods(api, namespace, "app=serve")[0].metadata.name
    with pytest.raises(ThrottledError) as refused:
        kube.pods.evict(api, namespace, victim)
    assert refused.value.status == 429
    assert "disruption budget" in str(refused.value)
    policy.patch_namespaced_pod_disruption_budget("serve", namespace, {"spec": {"minAvailable": 1}})
    procs.wait_for("one disruption allowed", lambda: budget() == (2, 1), 60)
    kube.pods.evict(api, namespace, victim)

    def gone() -> bool:
        try:
            kube.pods.read(api, namespace, victim)
        except NotFoundError:
            return True
        return False

    procs.wait_for("the evicted pod to be deleted", gone, 30)
    procs.wait_for("the ReplicaSet to replace it", lambda: running(api, namespace, "app=serve", 2), 60)


def test_job_runs_on_the_node_its_selector_names(cluster: LocalCluster, api: Any, namespace: str) -> None:
    target = cluster.node_names[2]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "gpu-reset"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"faultline.io/sim-run-seconds": "1"}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"kubernetes.io/hostname": target},
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "reset", "image": "sim/reset:1"}],
                },
            },
        },
    }
    kube.batch(api).create_namespaced_job(namespace, job)

    def succeeded() -> bool:
        st = kube.batch(api).read_namespaced_job_status("gpu-reset", namespace).status
        return bool(st.succeeded == 1)

    procs.wait_for("the Job to succeed", succeeded, 60)
    (pod,) = pods(api, namespace, "job-name=gpu-reset")
    assert pod.spec.node_name == target
    assert pod.status.phase == "Succeeded"


def node_state(api: Any, name: str) -> tuple[str, str]:
    node = kube.core(api).read_node(name)
    ready = next(c.status for c in node.status.conditions if c.type == "Ready")
    return ready, node.status.node_info.boot_id


def test_rebooted_node_goes_not_ready_and_returns_with_a_new_boot_id(cluster: LocalCluster, api: Any) -> None:
    name = cluster.node_names[3]
    _, boot_before = node_state(api, name)
    new_boot = cluster.fakelet.reboot(name, down_seconds=3)
    assert new_boot != boot_before
    procs.wait_for("NotReady", lambda: node_state(api, name)[0] == "False", 10)
    started = time.monotonic()
    procs.wait_for("Ready again", lambda: node_state(api, name) == ("True", new_boot), 30)
    assert time.monotonic() - started < 20


def test_minted_service_account_credentials_obey_rbac(
    cluster: LocalCluster, api: Any, namespace: str
) -> None:
    core = kube.core(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "quarantine"}})
    sa_api = kube.api_client(cluster.service_account_kubeconfig(namespace, "quarantine"))
    try:
        with pytest.raises(ForbiddenError) as denied:
            kube.nodes.list_all(sa_api)
        assert denied.value.status == 403
        rbac = kube.rbac(api)
        rbac.create_cluster_role(
            {
                "metadata": {"name": f"{namespace}-nodes"},
                "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}],
            }
        )
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": f"{namespace}-nodes"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": f"{namespace}-nodes",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "quarantine", "namespace": namespace}],
            }
        )
        procs.wait_for(
            "RBAC to allow listing nodes", lambda: len(kube.core(sa_api).list_node().items) >= 4, 30
        )
        with pytest.raises(ForbiddenError) as still_denied:
            kube.nodes.patch(sa_api, cluster.node_names[0], {"spec": {"unschedulable": True}})
        assert still_denied.value.status == 403
    finally:
        sa_api.close()
        kube.rbac(api).delete_cluster_role_binding(f"{namespace}-nodes")
        kube.rbac(api).delete_cluster_role(f"{namespace}-nodes")


def test_terminating_pod_waits_for_its_finalizer(api: Any, namespace: str, cluster: LocalCluster) -> None:
    core = kube.core(api)
    pod = {
        "metadata": {"name": "held", "finalizers": ["faultline.io/test-hold"]},
        "spec": {
            "nodeName": cluster.node_names[1],
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "sim/c:1"}],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    procs.wait_for(
        "the pod to run", lambda: core.read_namespaced_pod("held", namespace).status.phase == "Running", 30
    )
    core.delete_namespaced_pod("held", namespace)
    time.sleep(3)  # well past its 1 s grace period: the fake kubelet has finished its part by now
    held = core.read_namespaced_pod("held", namespace)
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_pod("held", namespace, {"metadata": {"finalizers": None}})

    def gone() -> bool:
        try:
            kube.pods.read(api, namespace, "held")
        except NotFoundError:
            return True
        return False

    procs.wait_for("the pod to go once its finalizer is removed", gone, 30)


def test_killed_node_stops_heartbeating_and_goes_unknown(cluster: LocalCluster, api: Any) -> None:
    name = cluster.node_names[3]
    cluster.fakelet.kill(name)
    try:
        # the node lifecycle controller notices the lease is no longer renewed (grace 12 s)
        procs.wait_for("Ready Unknown", lambda: node_state(api, name)[0] == "Unknown", 40)

        def unreachable_taint() -> bool:  # applied by the controller just after the condition changes
            taints = kube.core(api).read_node(name).spec.taints or []
            return any(t.key == "node.kubernetes.io/unreachable" for t in taints)

        procs.wait_for("the unreachable taint", unreachable_taint, 20)
    finally:
        cluster.fakelet.revive(name)
    procs.wait_for("Ready again after revival", lambda: node_state(api, name)[0] == "True", 40)


def test_a_components_calls_at_once_reuse_their_connections(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API client keeps a connection for each call its component makes at once, and more for its
    loops, whatever the machine's CPUs: the `kubernetes` package's own default, five per CPU, would keep
    10 on a 2-core node, and every call beyond them would open a TLS connection of its own and close it."""
    monkeypatch.setattr(multiprocessing, "cpu_count", lambda: 2)  # the package's default would be 10
    threads = 24  # a worker with 16 threads (`concurrency`) and 8 of its other loops, all at once
    api = kube.api_client(cluster.kubeconfig, concurrency=16)
    try:
        assert api.configuration.connection_pool_maxsize == kube.client.pool_size(16) == 32

        def round_of_calls() -> None:
            together = threading.Barrier(threads)

            def call(_: int) -> None:  # a watch the server holds for 3 s: all of them are open at once
                together.wait(10)
                response = kube.core(api).list_namespace(
                    watch=True, timeout_seconds=3, _preload_content=False
                )
                response.read()
                response.release_conn()

            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(call, range(threads)))

        round_of_calls()
        assert connections_opened(api) == threads
        round_of_calls()
        assert connections_opened(api) == threads  # the second round reused every connection the first opened
    finally:
        api.close()


def test_in_cluster_credentials_from_a_service_account_mount(
    cluster: LocalCluster, api: Any, namespace: str, tmp_path: Path
) -> None:
    """With no kubeconfig the client uses what a pod has: the service host and port from the
    environment and the token and CA from the mounted directory; the token is the account's, so RBAC
    applies to it (and a missing mount is a clear error)."""
    kube.core(api).create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    env = cluster.service_account_mount(namespace, "agent", tmp_path / "serviceaccount")
    sa_api = kube.api_client(None, environ=env)
    try:
        review = client.AuthenticationV1Api(sa_api).create_self_subject_review(client.V1SelfSubjectReview())
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:agent"
        with pytest.raises(ForbiddenError) as denied:
            kube.nodes.list_all(sa_api)
        assert denied.value.status == 403
    finally:
        sa_api.close()
    with pytest.raises(ConfigError, match="no in-cluster credentials"):
        kube.api_client(None, environ={**env, "FAULTLINE_SERVICE_ACCOUNT_DIR": str(tmp_path / "none")})
