"""Which faults the object rules hold open (workers.object_faults, pure): the built-in rules on objects as
the watches deliver them, with a manual clock."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from faultline.models import fault_id
from patterns import object_rules
from workers import object_faults

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)
RULES = object_rules.load()
NODES = RULES.rules["node-not-ready"].watch
PENDING = RULES.rules["gpu-pod-unschedulable"].watch
FAILED = RULES.rules["gpu-pod-admission-error"].watch


def node(name: str, *, count: int = 8, allocatable: int = 8, ready: str = "True",
         since: dt.datetime = T0 - dt.timedelta(days=1)) -> dict[str, Any]:  # fmt: skip
    return {
        "kind": "Node", "metadata": {"name": name, "labels": {"nvidia.com/gpu.count": str(count)}},
        "status": {"allocatable": {"nvidia.com/gpu": str(allocatable)},
                   "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": f"{since:%Y-%m-%dT%H:%M:%SZ}"}]},
    }  # fmt: skip


def pending_pod(name: str, on: str, *, since: dt.datetime = T0) -> dict[str, Any]:
    return {
        "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": on},
                 "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "lastTransitionTime": f"{since:%Y-%m-%dT%H:%M:%SZ}",
             "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]},
    }  # fmt: skip


def monitor() -> object_faults.ObjectFaults:
    faults = object_faults.ObjectFaults(RULES.enabled())
    for watch in (NODES, PENDING, FAILED):
        faults.replace(watch, [], T0)
    return faults


def fid(node_name: str, code: str) -> str:
    return fault_id(node_name, "NODE", "", code)


def test_the_for_of_a_rule_without_since_counts_from_when_it_was_first_seen() -> None:
    faults = monitor()
    faults.upsert(NODES, node("gpu-1", allocatable=7), T0)
    assert faults.wanted(T0) == {}
    assert faults.next_due(T0) == T0 + 120 * S
    faults.upsert(NODES, node("gpu-1", allocatable=7), T0 + 60 * S)  # still true: the clock keeps running
    assert faults.wanted(T0 + 119 * S) == {}
    wanted = faults.wanted(T0 + 120 * S)
    assert list(wanted) == [fid("gpu-1", "KUBE-GPUS-NOT-ADVERTISED")]
    want = wanted[fid("gpu-1", "KUBE-GPUS-NOT-ADVERTISED")]
    assert (want.node, want.rule.id, want.object, want.since) == (
        "gpu-1",
        "gpus-not-advertised",
        "Node gpu-1",
        T0,
    )
    assert want.message == "allocatable nvidia.com/gpu is 7, the node has 8 (nvidia.com/gpu.count)"
    faults.upsert(NODES, node("gpu-1"), T0 + 130 * S)  # the GPU is back
    assert faults.wanted(T0 + 130 * S) == {}
    faults.upsert(NODES, node("gpu-1", allocatable=7), T0 + 140 * S)  # and gone again: a new wait
    assert faults.wanted(T0 + 200 * S) == {}


def test_a_fault_open_in_the_store_counts_at_once_after_a_restart() -> None:
    faults = monitor()
    faults.upsert(NODES, node("gpu-1", allocatable=7), T0)
    key = fid("gpu-1", "KUBE-GPUS-NOT-ADVERTISED")
    assert list(faults.wanted(T0, {key: "gpus-not-advertised"})) == [key]


def test_since_from_the_object_times_the_rule_across_restarts() -> None:
    faults = monitor()
    faults.upsert(NODES, node("gpu-2", ready="False", since=T0 - 9 * 60 * S), T0)
    assert faults.wanted(T0) == {}
    assert faults.next_due(T0) == T0 + 60 * S  # ten minutes after the node's own time of the change
    assert list(faults.wanted(T0 + 60 * S)) == [fid("gpu-2", "KUBE-NODE-NOT-READY")]
    faults.upsert(NODES, node("gpu-2", ready="True", since=T0 + 70 * S), T0 + 70 * S)
    assert faults.wanted(T0 + 70 * S) == {}


@pytest.mark.redteam
def test_a_not_ready_control_plane_or_cpu_node_is_no_fault() -> None:
    """node-not-ready restarts GPU nodes only: a control-plane node (GPUs or not) and a CPU node are left alone."""
    faults = monitor()
    long_ago = T0 - 3600 * S
    control_plane = node("cp-1", ready="Unknown", since=long_ago)
    control_plane["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = ""
    cpu = node("cpu-1", ready="False", since=long_ago)
    cpu["metadata"]["labels"] = {"kubernetes.io/os": "linux"}
    cpu["status"]["allocatable"] = {"cpu": "8"}
    for obj in (control_plane, cpu, node("gpu-1", ready="False", since=long_ago)):
        faults.upsert(NODES, obj, T0)
    assert list(faults.wanted(T0)) == [fid("gpu-1", "KUBE-NODE-NOT-READY")]


def test_objects_gone_from_a_new_list_or_deleted_resolve() -> None:
    faults = monitor()
    faults.upsert(NODES, node("gpu-1", ready="Unknown", since=T0 - 3600 * S), T0)
    faults.upsert(NODES, node("gpu-2", ready="Unknown", since=T0 - 3600 * S), T0)
    assert len(faults.wanted(T0)) == 2
    faults.replace(NODES, [node("gpu-2", ready="Unknown", since=T0 - 3600 * S)], T0 + S)  # after a 410
    assert list(faults.wanted(T0 + S)) == [fid("gpu-2", "KUBE-NODE-NOT-READY")]
    faults.delete(NODES, "gpu-2")
    assert faults.wanted(T0 + 2 * S) == {}
    assert faults.objects[NODES] == {}


def test_pods_pinned_to_one_node_share_its_fault() -> None:
    faults = monitor()
    faults.upsert(PENDING, pending_pod("a", "gpu-5", since=T0 - 3600 * S), T0)
    faults.upsert(PENDING, pending_pod("b", "gpu-5", since=T0 - 3600 * S), T0)
    key = fid("gpu-5", "KUBE-GPU-POD-UNSCHEDULABLE")
    assert list(faults.wanted(T0)) == [key]
    assert faults.wanted(T0)[key].object == "Pod ml/a"
    faults.delete(PENDING, "ml/a")
    assert faults.wanted(T0)[key].object == "Pod ml/b"  # still held by the other pod
    faults.delete(PENDING, "ml/b")
    assert faults.wanted(T0) == {}


def test_rules_that_read_now_are_read_again_at_each_tick() -> None:
    faults = monitor()
    created = T0 - 3000 * S
    pod = {"kind": "Pod", "metadata": {"name": "t", "namespace": "ml", "creationTimestamp": f"{created:%Y-%m-%dT%H:%M:%SZ}"},
           "spec": {"nodeName": "gpu-6", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
           "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"}}  # fmt: skip
    faults.upsert(FAILED, pod, T0)
    assert list(faults.wanted(T0)) == [fid("gpu-6", "KUBE-GPU-ADMISSION-ERROR")]
    faults.tick(T0 + 700 * S)  # an hour after the pod was made: no longer counts
    assert faults.wanted(T0 + 700 * S) == {}
    assert RULES.rules["gpu-pod-admission-error"].uses_now
    assert not RULES.rules["node-not-ready"].uses_now


def test_open_faults_of_a_watch_not_listed_yet_are_left_alone() -> None:
    faults = object_faults.ObjectFaults(RULES.enabled())
    faults.replace(NODES, [], T0)
    stored = {fid("gpu-1", "KUBE-NODE-NOT-READY"): "node-not-ready",
              fid("gpu-5", "KUBE-GPU-POD-UNSCHEDULABLE"): "gpu-pod-unschedulable",
              "f-of-a-removed-rule": "no-such-rule"}  # fmt: skip
    assert faults.unknown(stored) == {fid("gpu-5", "KUBE-GPU-POD-UNSCHEDULABLE")}  # pods not listed yet
    assert faults.unsynced() == [PENDING, FAILED]


@pytest.mark.parametrize("status", [{"conditions": "not a list"}, {"conditions": [{"type": "Ready"}]}])
def test_an_evaluation_that_fails_is_counted_and_holds_nothing(status: dict[str, Any]) -> None:
    faults = monitor()
    gpus = {"nvidia.com/gpu.present": "true"}
    faults.upsert(NODES, {"kind": "Node", "metadata": {"name": "odd", "labels": gpus}, "status": status}, T0)
    assert faults.wanted(T0 + 3600 * S) == {}
    assert faults.errors["node-not-ready"] == 1
    assert faults.last_error["node-not-ready"].startswith("Node odd: when: ")
