"""The job holding a node's GPUs, from its pods (`sources.pod_jobs`), and the `job` key field that
falls back to it (`patterns.cluster.field_value`)."""

from __future__ import annotations

from typing import Any

import pytest

from patterns import cluster
from sources import pod_jobs


def pod(node: str, labels: dict[str, str] | None = None, *, gpus: str = "8", phase: str = "Running",
        owners: list[dict[str, Any]] | None = None, ns: str = "ml") -> dict[str, Any]:  # fmt: skip
    limits = {"nvidia.com/gpu": gpus} if gpus else {"cpu": "1"}
    return {"metadata": {"namespace": ns, "labels": labels or {}, "ownerReferences": owners or []},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": phase}}  # fmt: skip


@pytest.mark.parametrize(("labels", "owners", "want"), [
    ({"jobset.sigs.k8s.io/jobset-name": "train", "batch.kubernetes.io/job-name": "train-workers-0"}, [],
     "ml/train"),  # the gang before its Jobs
    ({"batch.kubernetes.io/job-name": "eval"}, [], "ml/eval"),
    ({"job-name": "old"}, [], "ml/old"),
    ({}, [{"kind": "Job", "name": "j1", "controller": True}], "ml/j1"),
    ({}, [{"kind": "ReplicaSet", "name": "web-1", "controller": True}], None),
    ({}, [{"kind": "Job", "name": "j1"}], None),  # not its controller
])  # fmt: skip
def test_a_pods_job(labels: dict[str, str], owners: list[dict[str, Any]], want: str | None) -> None:
    assert pod_jobs.job_of(pod("n1", labels, owners=owners)) == want


def test_a_node_gets_the_job_only_when_one_job_holds_its_gpus() -> None:
    train = {"batch.kubernetes.io/job-name": "train"}
    pods = [
        pod("n1", train),
        pod("n1", train),
        pod("n1", {"app": "exporter"}, gpus=""),  # no GPUs: not counted
        pod("n2", train),
        pod("n2", {"job-name": "eval"}),  # two jobs share n2
        pod("n3", {}),  # a GPU pod of no job
        pod("n4", train, phase="Succeeded"),
        pod("n4", {"job-name": "next"}),  # the finished one left out
        pod("n5", train, gpus="0"),
    ]
    assert pod_jobs.node_jobs(pods) == {"n1": "ml/train", "n4": "ml/next"}


def test_the_job_field_prefers_the_events_metadata_then_the_nodes_gpu_job() -> None:
    def rec(metadata: dict[str, str], labels: dict[str, str]) -> cluster.Record:
        return cluster.Record(position=1, kind="events", id="e", t=0.0, node="n1", code="XID-13",
                              metadata=metadata, labels=labels)  # fmt: skip

    node = {pod_jobs.JOB_KEY: "ml/train"}
    assert cluster.field_value(rec({"job": "ml/own"}, node), "job") == "ml/own"
    assert cluster.field_value(rec({}, node), "job") == "ml/train"
    assert cluster.field_value(rec({}, {}), "job") is None
