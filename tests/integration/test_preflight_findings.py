"""The object monitor's reader of failed preflights (`workers.preflight_findings`) against the real API server
and store: the pod status is written as the kubelet writes it (the status subresource), the findings become
signed faults of the pod's node once, and what a tenant can forge (a container of another image under the
reserved name, a message without exit code 1, a crafted line) becomes nothing."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from devtools import fakelet
from faultline import evidence, kube, store
from faultline.errors import NotFoundError
from faultline.models import Action
from faultline.preflight import CONTAINER, ENABLED, INJECTED_LABEL, NAMESPACE_LABEL, Finding, termination
from workers import preflight_findings

pytestmark = pytest.mark.integration
OURS = "sha256:" + "a" * 64
THEIRS = "sha256:" + "b" * 64
GPU = "0000:3b:00"
REMAP = Finding("remap", "PREFLIGHT-REMAP-PENDING", "a row remapping waits", GPU, Action.COMPONENT_RESET)


@pytest.fixture
def node(api: Any) -> Iterator[str]:
    name = f"pf-{uuid.uuid4().hex[:8]}"
    kube.core(api).create_node(fakelet.node_manifest(fakelet.SimNode(name, "10.9.0.1"), 8))
    yield name
    with contextlib.suppress(NotFoundError):
        kube.nodes.delete(api, name)


def _pod(api: Any, namespace: str, node: str, *, exit_code: int, message: str, digest: str = OURS,
         name: str | None = None, env: list[dict[str, str]] | None = None) -> str:  # fmt: skip
    """A pod the webhook injected, failed (or not) in its preflight container, as the kubelet reports it."""
    name = name or f"job-{uuid.uuid4().hex[:6]}"
    kube.core(api).create_namespaced_pod(namespace, {
        "metadata": {"name": name, "labels": {INJECTED_LABEL: "true"}},
        "spec": {"nodeName": node, "restartPolicy": "Never",
                 "initContainers": [{"name": CONTAINER, "image": "faultline", "args": ["preflight"],
                                     "env": env or [{"name": "FAULTLINE_CHECKS", "value": '["remap"]'}]}],
                 "containers": [{"name": "train", "image": "trainer"}]},
    })  # fmt: skip
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.pods.patch_status(api, namespace, name, {
        "phase": "Failed" if exit_code else "Running",
        "initContainerStatuses": [{
            "name": CONTAINER, "image": "faultline", "imageID": f"registry.local/faultline@{digest}",
            "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed",
                                     "message": message, "startedAt": now, "finishedAt": now,
                                     "containerID": f"containerd://{uuid.uuid4().hex}"}},
        }],
    })  # fmt: skip
    return name


def _faults(mongo_db: Any, node: str) -> list[dict[str, Any]]:
    return list(mongo_db["faults"].find({"node": node}))


@pytest.mark.redteam
def test_failed_preflights_become_signed_faults_of_their_node_once(
    api: Any, namespace: str, node: str, mongo_db: Any, cluster: Any
) -> None:
    other_namespace = f"{namespace[:50]}-off"
    kube.core(api).create_namespace({"metadata": {"name": other_namespace}})
    try:
        _scenario(api, namespace, other_namespace, node, mongo_db)
    finally:
        kube.core(api).delete_namespace(other_namespace, propagation_policy="Background")


def _scenario(api: Any, namespace: str, other_namespace: str, node: str, mongo_db: Any) -> None:
    secret = b"k" * 32
    st = store.Store(mongo_db, signer=evidence.ClusterKey(secret, "object-monitor"))
    st.ensure_indexes()
    registry = CollectorRegistry()
    reader = preflight_findings.FindingsReader(st, api, frozenset({OURS}), registry)
    kube.core(api).patch_namespace(namespace, {"metadata": {"labels": {NAMESPACE_LABEL: ENABLED}}})
    genuine = termination([REMAP])
    _pod(api, namespace, node, exit_code=1, message=genuine)
    # faultline's image, but code of the tenant's (PYTHONPATH), or in a namespace the webhook never saw
    _pod(api, namespace, node, exit_code=1, message=genuine.replace("REMAP-PENDING", "HUNG"),
         env=[{"name": "PYTHONPATH", "value": "/work"}])  # fmt: skip
    _pod(api, other_namespace, node, exit_code=1, message=genuine.replace("REMAP-PENDING", "HUNG"))
    # what a tenant can do: its own image under the reserved name, the same words from a container that
    # passed, a crafted findings line
    _pod(api, namespace, node, exit_code=1, message=genuine.replace("REMAP-PENDING", "XID-79"), digest=THEIRS)
    _pod(api, namespace, node, exit_code=0, message=genuine.replace("REMAP-PENDING", "HUNG"))
    _pod(api, namespace, node, exit_code=1, message="x\nfaultline-findings: [{\"code\":\"XID-79\",\"gpu\":\"\","
                                                    "\"action\":\"REPLACE_VM\"}]")  # fmt: skip

    assert reader.pass_once() == 1
    (fault,) = _faults(mongo_db, node)
    assert (fault["code"], fault["entity"], fault["action"], fault["fatal"], fault["state"]) == (
        "PREFLIGHT-REMAP-PENDING",
        {"type": "GPU", "id": GPU},
        "COMPONENT_RESET",
        True,
        "open",
    )
    assert fault["metadata"]["source"] == "preflight" and fault["metadata"]["pod"].startswith(f"{namespace}/")
    verifier = evidence.Verifier(lambda _n: None, evidence.ClusterKey(secret))
    verdict = verifier.verify(fault["_id"], store.FaultRecord.from_doc(fault).model_dump())
    assert verdict.ok and verdict.signer == "cluster:object-monitor"
    runs = {o: registry.get_sample_value("faultline_preflight_findings_runs_total", {"outcome": o})
            for o in ("written", "untrusted-image", "unreadable", "not-injected", "nothing")}  # fmt: skip
    assert runs == {"written": 1, "untrusted-image": 1, "unreadable": 1, "not-injected": 1, "nothing": None}

    assert reader.pass_once() == 0  # nothing twice
    st.resolve_observations(
        [fault["_id"]], preflight_findings.SOURCE, "janitor: the GPU was reset", node="other"
    )
    assert [f["state"] for f in _faults(mongo_db, node)] == ["open"]  # another node's repair resolves nothing
    st.resolve_observations(
        [fault["_id"]], preflight_findings.SOURCE, "janitor: the GPU was reset", node=node
    )
    restarted = preflight_findings.FindingsReader(st, api, frozenset({OURS}), CollectorRegistry())
    assert restarted.pass_once() == 0  # a resolved finding does not come back from the same run
    assert [f["state"] for f in _faults(mongo_db, node)] == ["resolved"]
    _pod(api, namespace, node, exit_code=1, message=genuine)  # the next pod's preflight finds it again
    assert restarted.pass_once() == 1
    (again,) = _faults(mongo_db, node)
    assert again["state"] == "open" and again["resolved_by"] is None  # and still the object monitor's word:
    assert verifier.verify(again["_id"], store.FaultRecord.from_doc(again).model_dump()).ok
