"""Which job holds a node's GPUs, from its pods (pure: the cluster analyzer's `job` key field).

An event's job is the workload of the pod holding its GPU. The node agent knows which pods hold which
GPU (the kubelet's pod-resources API) but not their jobs, which only the API server's pod objects say;
the analyzer, which lists nodes there already, lists the pods too and gives each node on which one job
holds GPUs that job, `namespace/name`, under JOB_KEY in the node's labels as the analyzer sees them
(never written to the Node). A node whose GPUs two jobs share gets none: which pod an event's GPU
belongs to is not known there, and a wrong job would suppress the wrong job's faults.

A pod's job, first found: the gang labels of JobSet, LeaderWorkerSet, Kubeflow's training operator and
Volcano; then a Job's (`batch.kubernetes.io/job-name`, `job-name`); then a controlling owner of kind Job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from patterns.cluster import JOB_KEY

__all__ = ["JOB_KEY", "holds_gpus", "job_of", "node_jobs"]
GANG_LABELS = (
    "jobset.sigs.k8s.io/jobset-name", "leaderworkerset.sigs.k8s.io/name", "training.kubeflow.org/job-name",
    "volcano.sh/job-name", "batch.kubernetes.io/job-name", "job-name",
)  # fmt: skip
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")
DONE_PHASES = ("Succeeded", "Failed")


def job_of(pod: Mapping[str, Any]) -> str | None:
    """`namespace/job` of a pod (see the module docstring), or None when it belongs to no job."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    namespace = meta.get("namespace") or "default"
    for key in GANG_LABELS:
        if labels.get(key):
            return f"{namespace}/{labels[key]}"
    for owner in meta.get("ownerReferences") or ():
        if owner.get("controller") and owner.get("kind") == "Job" and owner.get("name"):
            return f"{namespace}/{owner['name']}"
    return None


def holds_gpus(pod: Mapping[str, Any]) -> bool:
    """Whether a pod that still runs (not Succeeded or Failed) asks for GPUs in any container."""
    if (pod.get("status") or {}).get("phase") in DONE_PHASES:
        return False
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        if any(name.startswith(GPU_RESOURCES) and str(n) not in ("0", "") for name, n in asked.items()):
            return True
    return False


def node_jobs(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """{node: job} for each node on which the pods holding GPUs all belong to one job."""
    jobs: dict[str, set[str | None]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and holds_gpus(pod):
            jobs.setdefault(node, set()).add(job_of(pod))
    out = {}
    for node, js in jobs.items():
        job = next(iter(js)) if len(js) == 1 else None
        if job is not None:
            out[node] = job
    return out
