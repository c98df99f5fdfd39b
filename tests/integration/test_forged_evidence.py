"""Red team: one node agent's credentials (the store's URI, its pod-bound ServiceAccount token, its own
signing key) used to forge faults, resolutions and repairs for other nodes. Nothing is cordoned or
released on them, and no agent can put its key or its conditions on another Node (the chart's own
ValidatingAdmissionPolicy, rendered from the chart, on the real API server).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devtools import fakelet, kubeconfig, procs
from devtools.cluster import LocalCluster
from faultline import evidence, kube, store
from faultline.errors import ApiError, NotFoundError
from faultline.kube import lite
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from tests.integration import chartutil
from workers import attribution, breaker, quarantine

pytestmark = [pytest.mark.integration, pytest.mark.redteam]
RELEASE = "fl"
FAST: dict[str, Any] = {
    "hold_down": dt.timedelta(seconds=0.2), "resync_interval": 0.2, "threads": 4, "lease": dt.timedelta(seconds=5),
    "breaker": breaker.BreakerConfig(max_share=None),  # the session's small fleet: no storm limit here
}  # fmt: skip


@dataclass
class Agent:
    node: str
    key: evidence.NodeKey
    client: lite.Client  # the API server, as this node's agent (its pod-bound token)
    store: store.Store  # the shared store credential, signing as this agent


def _policy(namespace: str) -> list[dict[str, Any]]:
    """The chart's admission policy and its binding for a release in `namespace` (renamed per test: both
    are cluster-scoped)."""
    docs = [d for d in chartutil.rendered_for_test(RELEASE, namespace, "templates/evidence.yaml")
            if d["kind"].startswith("ValidatingAdmissionPolicy")]  # fmt: skip
    assert len(docs) == 2, docs
    return docs


@pytest.fixture
def fleet(
    cluster: LocalCluster, api: Any, namespace: str, mongo_db: Any, tmp_path: Path
) -> Iterator[dict[str, Agent]]:
    """Nodes a, b and c, each with an agent pod bound to it (the chart's agent ServiceAccount and RBAC, the
    chart's admission policy in force), each agent with its own key published on its own Node."""
    core, rbac = kube.core(api), client.RbacAuthorizationV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    sa = f"{RELEASE}-agent"
    role = f"{sa}-{namespace}"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    rbac.create_cluster_role({"metadata": {"name": role}, "rules": [
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch"]}]})  # fmt: skip
    rbac.create_cluster_role_binding({
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
    })  # fmt: skip
    policy, binding = _policy(namespace)
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    agents: dict[str, Agent] = {}
    nodes: list[str] = []
    try:
        for tag in ("a", "b", "c"):
            node = f"ev-{tag}-{uuid.uuid4().hex[:6]}"
            core.create_node(fakelet.node_manifest(fakelet.SimNode(node, "10.9.0.1"), 8))
            nodes.append(node)
            pod = core.create_namespaced_pod(namespace, {
                "metadata": {"name": f"agent-{tag}"},
                "spec": {"serviceAccountName": sa, "nodeName": node,
                         "containers": [{"name": "agent", "image": "faultline"}]},
            })  # fmt: skip
            token = kube.tokens.mint(api, namespace, sa, pod=(pod.metadata.name, pod.metadata.uid))
            config = kubeconfig.write(tmp_path / f"{tag}.kubeconfig", cluster.server, cluster.pki.ca, tag,
                                      {"token": token})  # fmt: skip
            key = evidence.NodeKey.load_or_create(tmp_path / f"state-{tag}", node)
            agents[tag] = Agent(node, key, lite.Client.connect(config), store.Store(mongo_db, signer=key))
        # the policy compiles in the background: wait until it refuses a change to another Node
        procs.wait_for(
            "the admission policy in force",
            lambda: _refused(
                lambda: lite.annotate_node(
                    agents["b"].client, agents["a"].node, {evidence.KEY_ANNOTATION: "x"}
                )
            ),
            30,
        )
        for agent in agents.values():
            lite.annotate_node(agent.client, agent.node, {evidence.KEY_ANNOTATION: agent.key.public})
        yield agents
    finally:
        for agent in agents.values():
            agent.client.close()
        with contextlib.suppress(Exception):
            admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
            admission.delete_validating_admission_policy(policy["metadata"]["name"])
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)
        for node in nodes:
            with contextlib.suppress(NotFoundError):
                kube.nodes.delete(api, node)


def _refused(change: Any) -> bool:
    try:
        change()
    except ApiError:
        return True
    return False


def _refusal(change: Any) -> str:
    with pytest.raises(ApiError) as caught:
        change()
    return str(caught.value)


def _fault(node: str, code: str = "XID-79", *, fatal: bool = True, resolved: bool = False) -> Fault:
    now = dt.datetime.now(dt.UTC)
    return Fault(
        id=fault_id(node, "GPU", "0000:3b:00", code), node=node, entity=Entity(type="GPU", id="0000:3b:00"),
        code=code, component=Component.GPU, count=1, first_seen=now, last_seen=now, fatal=fatal,
        action=Action.RESTART_BM, state=FaultState.RESOLVED if resolved else FaultState.OPEN,
        resolved_at=now if resolved else None,
    )  # fmt: skip


def _cordoned(api: Any, node: str) -> bool:
    return bool(kube.nodes.read(api, node)["spec"].get("unschedulable"))


@pytest.fixture
def worker(mongo_db: Any, api: Any) -> Iterator[quarantine.QuarantineWorker]:
    """A quarantine worker that requires evidence, with the cluster components' key."""
    st = store.Store(mongo_db)
    st.ensure_indexes()
    verifier = evidence.Verifier(attribution.node_key_reader(api), evidence.ClusterKey(b"k" * 32))
    w = quarantine.QuarantineWorker(st, api, quarantine.Settings(**FAST), f"q-{uuid.uuid4().hex[:4]}",
                                    verifier=verifier)  # fmt: skip
    w.start()
    yield w
    w.halt()


def _item_state(mongo_db: Any, key: str) -> str | None:
    doc = mongo_db["queue"].find_one({"_id": f"quarantine/{key}"}) or {}
    return (doc.get("quarantine") or {}).get("state")


def _refused_count(w: quarantine.QuarantineWorker, why: str) -> float:
    value = w.metrics.registry.get_sample_value("faultline_quarantine_evidence_refused_total", {"why": why})
    return value or 0.0


def _refusals(w: quarantine.QuarantineWorker) -> float:
    return sum(_refused_count(w, why) for why in ("unsigned", "other-node", "bad-signature", "no-node-key"))


def test_an_agent_changes_only_its_own_nodes_conditions_and_key(fleet: dict[str, Agent], api: Any) -> None:
    a, b = fleet["a"], fleet["b"]
    owned = [{"type": "GpuHealthy", "status": "False", "reason": "XID-79", "message": "forged"}]
    # its own Node: its key and faultline's conditions
    lite.patch_node_conditions(a.client, a.node, owned, [])
    lite.annotate_node(a.client, a.node, {evidence.KEY_ANNOTATION: a.key.public})
    # another Node: neither its key nor a condition
    said = _refusal(lambda: lite.annotate_node(b.client, a.node, {evidence.KEY_ANNOTATION: b.key.public}))
    assert f"only the Node its pod runs on ({b.node}), not {a.node}" in said
    assert _refused(lambda: lite.patch_node_conditions(b.client, a.node, owned, []))
    # its own Node, beyond faultline's conditions and key
    ready = [{"type": "Ready", "status": "False", "reason": "Forged", "message": "forged"}]
    assert "no Node condition but faultline's own" in _refusal(
        lambda: lite.patch_node_conditions(a.client, a.node, ready, []))  # fmt: skip
    assert "labels" in _refusal(lambda: a.client.request(
        "PATCH", f"/api/v1/nodes/{a.node}/status", {"metadata": {"labels": {"faultline.io/managed": "false"}}},
        content_type="application/strategic-merge-patch+json", what="labels"))  # fmt: skip
    assert "no annotation" in _refusal(
        lambda: lite.annotate_node(a.client, a.node, {"faultline.io/quarantine": "{}"}))  # fmt: skip
    assert "capacity" in _refusal(lambda: a.client.request(
        "PATCH", f"/api/v1/nodes/{a.node}/status", {"status": {"capacity": {"nvidia.com/gpu": "0"}}},
        content_type="application/strategic-merge-patch+json", what="capacity"))  # fmt: skip
    node = kube.nodes.read(api, a.node)
    assert node["metadata"]["annotations"][evidence.KEY_ANNOTATION] == a.key.public
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert "faultline.io/managed" not in node["metadata"].get("labels", {})


def test_faults_forged_for_another_node_are_never_acted_on(
    fleet: dict[str, Agent], worker: quarantine.QuarantineWorker, mongo_db: Any, api: Any
) -> None:
    a, b, c = fleet["a"], fleet["b"], fleet["c"]
    unsigned = store.Store(mongo_db)  # the store credential alone
    forged = {
        "unsigned": _fault(c.node, "XID-79"),
        "other-node": _fault(c.node, "XID-48"),  # signed by b's key, as b
        "posing": _fault(c.node, "XID-94"),  # b's signature, claiming to be c's
        "tampered": _fault(c.node, "XID-95", fatal=False),  # c's own, then made fatal
        "cluster": _fault(c.node, "XID-63"),  # claiming a cluster component, without its key
    }
    unsigned.write_fault(forged["unsigned"], 1)
    b.store.write_fault(forged["other-node"], 1)
    b.store.write_fault(forged["posing"], 1)
    mongo_db["faults"].update_one({"_id": forged["posing"].id}, {"$set": {"evidence.by": f"node:{c.node}"}})
    genuine = store.fault_doc(forged["tampered"]) | {"revision": 1}  # what c's agent signed: not fatal
    signature = c.key.sign(forged["tampered"].id, genuine)
    unsigned.write_fault(forged["tampered"].model_copy(update={"fatal": True}), 1)
    mongo_db["faults"].update_one({"_id": forged["tampered"].id}, {"$set": {"evidence": signature}})
    unsigned.write_fault(forged["cluster"], 1)
    doc = mongo_db["faults"].find_one({"_id": forged["cluster"].id})
    mac = hmac.new(b"guessed" * 8, evidence.payload(doc["_id"], doc), hashlib.sha256).digest()
    mongo_db["faults"].update_one({"_id": doc["_id"]}, {"$set": {
        "evidence": {"by": "cluster:analyzer", "sig": base64.b64encode(mac).decode()}}})  # fmt: skip

    a.store.write_fault(_fault(a.node), 1)  # the one genuine fault: a's own, on a
    procs.wait_for("the genuine fault quarantines its node", lambda: _cordoned(api, a.node), 10)
    procs.wait_for(
        "every forgery refused",
        lambda: all(_item_state(mongo_db, f.id) == "refused" for f in forged.values()),
        10,
    )
    procs.wait_for("resync passes over the refused faults",
                   lambda: _refused_count(worker, "bad-signature") >= 15, 10)  # fmt: skip
    assert not _cordoned(api, c.node)
    assert _refused_count(worker, "unsigned") >= 1
    assert _refused_count(worker, "other-node") >= 1
    assert _refused_count(worker, "bad-signature") >= 3  # posing, tampered, the cluster's
    assert _item_state(mongo_db, _fault(a.node).id) == "done"

    c.store.write_fault(_fault(c.node, "XID-79"), 2)  # c's agent itself sees XID 79 after all
    procs.wait_for("c's own fault counts", lambda: _cordoned(api, c.node), 10)


def test_a_forged_resolution_does_not_release_a_held_node(
    fleet: dict[str, Agent], worker: quarantine.QuarantineWorker, mongo_db: Any, api: Any
) -> None:
    a, b = fleet["a"], fleet["b"]
    a.store.write_fault(_fault(a.node), 1)
    procs.wait_for("held", lambda: _cordoned(api, a.node), 10)
    store.Store(mongo_db).write_fault(_fault(a.node, resolved=True), 2)  # a's signature left on other fields
    before = _refusals(worker)
    procs.wait_for("resync passes over the forged resolution", lambda: _refusals(worker) >= before + 5, 10)
    assert _cordoned(api, a.node)
    b.store.write_fault(_fault(a.node, resolved=True), 3)  # b's signature
    before = _refused_count(worker, "other-node")
    procs.wait_for("resync passes over b's resolution",
                   lambda: _refused_count(worker, "other-node") >= before + 5, 10)  # fmt: skip
    assert _cordoned(api, a.node)
    a.store.write_fault(_fault(a.node, resolved=True), 4)  # a's agent: the GPU is healthy again
    procs.wait_for("released on its own agent's word", lambda: not _cordoned(api, a.node), 10)
