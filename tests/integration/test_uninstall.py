"""`faultline uninstall` (the chart's post-delete hook) against the real API server: it waits for the
release's pods, then takes back exactly what faultline put on the cluster and nothing of anyone else's.
(The hook itself, run by helm as a real pod, is proven in test_chart_real_node.py.)"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devtools import fakelet
from faultline import kube
from faultline.conditions import OWNED_TYPES
from faultline.errors import NotFoundError, TransientError
from workers import quarantine, rules, uninstall, user_requests

pytestmark = pytest.mark.integration
RELEASE = "fl-u"
OPERATOR_TAINT = {"key": "example.com/maintenance", "value": "yes", "effect": "NoSchedule"}


@pytest.fixture
def node(api: Any) -> Iterator[str]:
    kube.resources.ensure_crds(api)
    name = f"u-{uuid.uuid4().hex[:8]}"
    kube.core(api).create_node(fakelet.node_manifest(fakelet.SimNode(name, "10.9.0.1"), 8))
    yield name
    with contextlib.suppress(NotFoundError):
        kube.nodes.delete(api, name)


def _quarantined_by_faultline(api: Any, name: str) -> None:
    """The node as quarantine and the agent leave it: cordoned, tainted and labelled by faultline (with its
    ownership record), beside an operator's taint and label; the agent's conditions."""
    owned = rules.Owned(True, ((rules.FAULT_TAINT, "XID-79", "NoSchedule"),), (rules.STATE_LABEL,))
    kube.nodes.patch(api, name, {
        "metadata": {
            "labels": {rules.STATE_LABEL: "quarantined", "team": "ml"},
            "annotations": {quarantine.OWNED_ANNOTATION: json.dumps(owned.as_json()),
                            rules.FAULTS_ANNOTATION: f"{name}/GPU/0000:3b:00/XID-79"},
        },
        "spec": {"unschedulable": True,
                 "taints": [{"key": rules.FAULT_TAINT, "value": "XID-79", "effect": "NoSchedule"}, OPERATOR_TAINT]},
    })  # fmt: skip
    conditions = [
        {"type": t, "status": "True", "reason": "NoFaults", "message": "no open fault"} for t in OWNED_TYPES
    ]
    conditions[0] = {**conditions[0], "status": "False", "reason": "XID-79", "message": "GPU 3: XID 79"}
    kubelets = {
        "type": "MemoryPressure",
        "status": "False",
        "reason": "KubeletHasSufficientMemory",
        "message": "",
    }
    kube.nodes.write_conditions(api, name, [*conditions, kubelets], [])


def _request(api: Any, name: str, node: str, *, faultlines: bool) -> None:
    labels = {uninstall.REQUEST_LABEL: node} if faultlines else {}
    kube.resources.create_request(api, {
        "apiVersion": f"{kube.resources.RR_GROUP}/{kube.resources.RR_VERSION}", "kind": "RemediationRequest",
        "metadata": {"name": name, "labels": labels},
        "spec": {"node": node, "action": "REBOOT", "reason": "test"},
    })  # fmt: skip


def _job(api: Any, namespace: str, name: str, node: str) -> None:
    kube.jobs.create(api, namespace, {
        "metadata": {"name": name, "labels": {uninstall.JOB_LABEL: "reboot", uninstall.REQUEST_LABEL: node}},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "nodeName": node,
            "containers": [{"name": "repair", "image": "faultline", "command": ["true"]}]}}},
    })  # fmt: skip


def test_uninstall_takes_back_faultlines_marks_and_only_them(api: Any, node: str, namespace: str) -> None:
    _quarantined_by_faultline(api, node)
    mine, theirs = f"fl-{node}", f"user-{node}"
    _request(api, mine, node, faultlines=True)
    _request(api, theirs, node, faultlines=False)
    _job(api, namespace, f"repair-{node}", node)
    kube.jobs.create(api, namespace, {  # not a repair Job: stays
        "metadata": {"name": "other"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "nodeName": node,
                                       "containers": [{"name": "c", "image": "x"}]}}},
    })  # fmt: skip
    try:
        report = uninstall.run(api, namespace=namespace, instance=RELEASE, wait=5)

        obj = kube.nodes.read(api, node)
        assert not obj["spec"].get("unschedulable")  # faultline's cordon
        assert obj["spec"]["taints"] == [OPERATOR_TAINT]
        labels, annotations = obj["metadata"].get("labels") or {}, obj["metadata"].get("annotations") or {}
        assert rules.STATE_LABEL not in labels and labels["team"] == "ml"
        assert quarantine.OWNED_ANNOTATION not in annotations and rules.FAULTS_ANNOTATION not in annotations
        assert not set(kube.nodes.conditions(api, node)) & OWNED_TYPES
        assert "MemoryPressure" in kube.nodes.conditions(api, node)  # the kubelet's own are kept
        names = {r["metadata"]["name"] for r in kube.resources.list_requests(api)}
        assert mine not in names and theirs in names  # a person's request is theirs
        jobs = [j["metadata"]["name"] for j in kube.jobs.list_all(api, namespace)]
        assert jobs == ["other"], jobs
        # (the cluster is shared with other tests: only this test's objects are looked at)
        assert node in report.nodes_released and report.conditions_removed[node] == sorted(OWNED_TYPES)
        assert mine in report.requests_deleted and theirs not in report.requests_deleted
        assert report.jobs_deleted == [f"repair-{node}"]

        again = uninstall.run(api, namespace=namespace, instance=RELEASE, wait=5)  # idempotent
        assert node not in again.nodes_released and node not in again.conditions_removed
        assert mine not in again.requests_deleted and not again.jobs_deleted
    finally:
        with contextlib.suppress(NotFoundError):
            kube.custom(api).delete_cluster_custom_object(
                kube.resources.RR_GROUP, kube.resources.RR_VERSION, kube.resources.RR_PLURAL, theirs
            )


def test_the_janitors_cordon_for_a_persons_request_goes(api: Any, node: str, namespace: str) -> None:
    kube.nodes.patch(api, node, {"metadata": {"annotations": {user_requests.CORDONED_FOR: "reboot-n1"}},
                                 "spec": {"unschedulable": True}})  # fmt: skip
    assert node in uninstall.run(api, namespace=namespace, instance=RELEASE, wait=5).nodes_released
    obj = kube.nodes.read(api, node)
    assert not obj["spec"].get("unschedulable")
    assert user_requests.CORDONED_FOR not in (obj["metadata"].get("annotations") or {})


def test_a_gpu_reset_cut_short_gives_the_gpu_clients_back(api: Any, node: str, namespace: str) -> None:
    """Uninstalled while the janitor had a GPU reset's clients paused: the GPU Operator's operands and
    faultline's own agent may come back (an operand someone switched off stays off)."""
    kube.nodes.patch(api, node, {"metadata": {"labels": {
        "nvidia.com/gpu.deploy.device-plugin": "paused-for-gpu-reset", "nvidia.com/gpu.deploy.dcgm": "false",
        "faultline.io/gpu-clients": "paused"}}})  # fmt: skip
    assert node in uninstall.run(api, namespace=namespace, instance=RELEASE, wait=5).nodes_released
    labels = kube.nodes.read(api, node)["metadata"]["labels"]
    assert (
        labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
        and labels["nvidia.com/gpu.deploy.dcgm"] == "false"
    )
    assert "faultline.io/gpu-clients" not in labels
    kube.nodes.patch(api, node, {"metadata": {"labels": {
        "nvidia.com/gpu.deploy.device-plugin": None, "nvidia.com/gpu.deploy.dcgm": None}}})  # fmt: skip


def test_an_operators_cordon_stays(api: Any, node: str, namespace: str) -> None:
    owned = rules.Owned(False, ((rules.FAULT_TAINT, "XID-79", "NoSchedule"),), ())
    kube.nodes.patch(api, node, {
        "metadata": {"annotations": {quarantine.OWNED_ANNOTATION: json.dumps(owned.as_json())}},
        "spec": {"unschedulable": True,
                 "taints": [{"key": rules.FAULT_TAINT, "value": "XID-79", "effect": "NoSchedule"}]},
    })  # fmt: skip
    uninstall.run(api, namespace=namespace, instance=RELEASE, wait=5)
    obj = kube.nodes.read(api, node)
    assert obj["spec"].get("unschedulable") is True
    assert [t["key"] for t in obj["spec"].get("taints") or []] in ([], [uninstall.UNSCHEDULABLE_TAINT])


def test_it_waits_for_the_releases_pods_and_says_which_are_left(api: Any, node: str, namespace: str) -> None:
    kube.core(api).create_namespaced_pod(namespace, {  # type: ignore[arg-type]
        "metadata": {"name": "agent-x", "labels": {"app.kubernetes.io/instance": RELEASE,
                                                   "app.kubernetes.io/component": "agent"}},
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "faultline"}]},
    })  # fmt: skip
    _quarantined_by_faultline(api, node)
    slept: list[float] = []
    with pytest.raises(TransientError, match=r"pods of release fl-u still running after 2s: agent-x"):
        uninstall.run(api, namespace=namespace, instance=RELEASE, wait=2,
                      sleep=lambda s: (slept.append(s), time.sleep(0.2)))  # fmt: skip
    assert slept  # it waited
    assert set(kube.nodes.conditions(api, node)) & OWNED_TYPES  # and removed nothing while the agent ran
    kube.core(api).delete_namespaced_pod("agent-x", namespace, grace_period_seconds=0)
