"""The janitor on the real control plane and FerretDB: cloud reboots and replacements through the local
provider fakes, a janitor killed mid-repair, and an external remediator's CR template."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import fakelet, procs
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.errors import ConflictError, NotFoundError
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from tests.fakes import cloud as fakes
from workers import janitor, remediation, remedies, templates
from workers.cloud import aws, gcp, oci

pytestmark = pytest.mark.integration
FAST = {"lease": dt.timedelta(seconds=2), "threads": 2, "poll": 0.2}


def _fault(node: str, code: str = "XID-79", action: Action = Action.RESTART_BM) -> Fault:
    now = dt.datetime.now(dt.UTC)
    return Fault(
        id=fault_id(node, "GPU", "0000:3a:00", code), node=node, entity=Entity(type="GPU", id="0000:3a:00"),
        code=code, component=Component.GPU, count=1, first_seen=now, last_seen=now, fatal=True, action=action,
        state=FaultState.OPEN,
    )  # fmt: skip


def _repair(st: store.Store, node: str, step: str, fault: Fault, request: str) -> str:
    """A repair round as the remediation worker leaves it for the janitor (and its RemediationRequest)."""
    key = _round_only(st, node, step, fault, request)
    body = {"apiVersion": kube.resources.RR_API_VERSION, "kind": "RemediationRequest",
            "metadata": {"name": request, "labels": {"faultline.io/node": node}},
            "spec": {"node": node, "action": step, "gpus": [fault.entity.id], "reason": "test",
                     "faultKeys": [fault.id], "step": 1}}  # fmt: skip
    st_api = _API[0]
    kube.resources.create_request(st_api, body)
    return key


_API: list[Any] = []


@pytest.fixture
def setup(api: Any) -> None:
    _API[:] = [api]
    kube.resources.ensure_crds(api)
    core = kube.core(api)
    with contextlib.suppress(ConflictError), kube.client.translated("create", "Namespace faultline-system"):
        core.create_namespace({"metadata": {"name": "faultline-system"}})
    with contextlib.suppress(ConflictError), kube.client.translated("create", "ServiceAccount"):
        core.create_namespaced_service_account(
            "faultline-system", {"metadata": {"name": "faultline-janitor"}}
        )


def _provider_id(api: Any, node: str, provider_id: str) -> None:
    """Nodes take a providerID once; the session's simulated nodes keep theirs across tests."""
    current = kube.core(api).read_node(node).spec.provider_id
    if current != provider_id:
        assert not current, f"{node} already has providerID {current}"
        kube.core(api).patch_node(node, {"spec": {"providerID": provider_id}})


def _outcome(st: store.Store, key: str) -> str | None:
    doc = st.db["repairs"].find_one({"_id": key}) or {}
    return (doc.get("rounds") or [{}])[-1].get("outcome")


def _aws_node(cluster: LocalCluster, api: Any, mongo_db: Any) -> tuple[str, str, store.Store, Fault]:
    """A simulated node as an EC2 instance, with an open fault on it."""
    node = cluster.node_names[2]
    instance_id = "i-0feedfacecafe0002"
    _provider_id(api, node, f"aws:///us-east-1a/{instance_id}")
    st = store.Store(mongo_db)
    st.ensure_indexes()
    fault = _fault(node)
    st.write_fault(fault, 1)
    return node, instance_id, st, fault


def _aws_janitor(
    st: store.Store, api: Any, fake: fakes.FakeCloud, reboot_timeout: dt.timedelta
) -> janitor.Janitor:
    """A janitor that reboots through the fake EC2 API."""
    env = {"AWS_ACCESS_KEY_ID": fakes.AWS_KEY, "AWS_SECRET_ACCESS_KEY": fakes.AWS_SECRET}
    provider = aws.AWS(aws.Settings(endpoint=f"{fake.url}/aws/ec2/", env=env))
    return janitor.Janitor(st, api, janitor.Settings(provider=provider, reboot_via="cloud",
                           reboot_timeout=reboot_timeout, **FAST), "j")  # fmt: skip


def test_cloud_reboot_through_the_aws_api(
    cluster: LocalCluster, api: Any, mongo_db: Any, setup: None
) -> None:
    node, instance_id, st, fault = _aws_node(cluster, api, mongo_db)
    with fakes.FakeCloud() as fake:
        fake.on_reboot = lambda i: (
            cluster.fakelet.reboot(node, down_seconds=1.0) if i == instance_id else None
        )
        worker = _aws_janitor(st, api, fake, dt.timedelta(seconds=30))
        before = cluster.fakelet.nodes[node].boot_id
        key = _repair(st, node, remedies.REBOOT, fault, "cloud-reboot-1")
        worker.start()
        try:
            procs.wait_for("rebooted through EC2", lambda: cluster.fakelet.nodes[node].boot_id != before, 20)
            st.write_fault(fault.model_copy(update={"state": FaultState.RESOLVED,
                                                    "resolved_at": dt.datetime.now(dt.UTC)}), 2)  # fmt: skip
            procs.wait_for("validated", lambda: _outcome(st, key) == "Succeeded", 30)
        finally:
            worker.halt()
        assert fake.actions("aws") == [("RebootInstances", instance_id)]
        jobs = kube.batch(api).list_namespaced_job(
            "faultline-system", label_selector=f"faultline.io/node={node}"
        )
        assert jobs.items == []  # the provider rebooted it, no Job ran
        rounds = st.db["repairs"].find_one({"_id": key})["rounds"]
        assert "EC2 RebootInstances" in rounds[0]["cloud_call"]


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        ({"labels": {"faultline.io/managed": "false"}}, "labelled faultline.io/managed=false"),
        (
            {"annotations": {"faultline.io/paused-until": "2999-01-01T00:00:00Z"}},
            "paused on the node until 2999",
        ),
    ],
)
@pytest.mark.redteam
def test_an_operators_pause_or_opt_out_refuses_the_repair(
    cluster: LocalCluster, api: Any, mongo_db: Any, setup: None, meta: dict[str, Any], says: str
) -> None:
    node, _instance_id, st, fault = _aws_node(cluster, api, mongo_db)
    kube.core(api).patch_node(node, {"metadata": meta})
    try:
        with fakes.FakeCloud() as fake:
            worker = _aws_janitor(st, api, fake, dt.timedelta(seconds=30))
            request = f"refused-{'label' if 'labels' in meta else 'pause'}-1"
            key = _repair(st, node, remedies.REBOOT, fault, request)
            worker.start()
            try:
                procs.wait_for("refused", lambda: _outcome(st, key) == "Cancelled", 20)
            finally:
                worker.halt()
            assert fake.actions("aws") == []  # nothing was rebooted
        doc = st.db["repairs"].find_one({"_id": key})
        assert says in doc["rounds"][-1]["message"]
        status = kube.resources.get_request(api, request).get("status") or {}
        assert status.get("phase") == "Refused" and says in status.get("message", "")
    finally:
        undo = {k: dict.fromkeys(v) for k, v in meta.items()}
        kube.core(api).patch_node(node, {"metadata": undo})


def test_a_janitor_stopped_mid_repair_leaves_the_round_open_for_a_takeover(
    cluster: LocalCluster, api: Any, mongo_db: Any, setup: None
) -> None:
    """A janitor stopped (SIGTERM, a rolling update) while it waits for a node to come back gives no
    verdict: no TimedOut round, no escalation, no Event; the round goes back to pending with its cloud
    call recorded, so whoever takes it over does not reboot the node a second time."""
    node, instance_id, st, fault = _aws_node(cluster, api, mongo_db)
    with fakes.FakeCloud() as fake:  # the reboot is accepted, the node never comes back
        worker = _aws_janitor(st, api, fake, dt.timedelta(minutes=5))
        key = _repair(st, node, remedies.REBOOT, fault, "stopped-reboot-1")
        worker.start()
        try:
            procs.wait_for("the cloud call recorded",
                           lambda: mongo_db["repairs"].find_one({"_id": key})["rounds"][0].get("cloud_call"), 20)  # fmt: skip
        finally:
            assert worker.halt(10)
        assert fake.actions("aws") == [("RebootInstances", instance_id)]
    doc = mongo_db["repairs"].find_one({"_id": key})
    assert doc["rounds"][0]["outcome"] is None and len(doc["rounds"]) == 1
    assert doc["janitor"]["state"] == store.State.PENDING
    assert doc["remediation"]["state"] == "idle"  # nothing to escalate
    got = kube.core(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    assert not [e.reason for e in got if "stopped-reboot-1" in (e.message or "")]


def test_a_repair_over_the_in_flight_cap_waits_and_goes_ahead_when_one_finishes(
    cluster: LocalCluster, api: Any, mongo_db: Any, setup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the fleet-wide cap at one repair in flight and another node's reboot under way, a new round
    does not start: nothing is called, it is given back (pending, its attempts fresh, its start taken
    back), not failed; once the other round has its outcome, it goes ahead."""
    monkeypatch.setattr(janitor, "CAP_RETRY_S", 0.5)
    node, instance_id, st, fault = _aws_node(cluster, api, mongo_db)
    at = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)
    st.db["repairs"].insert_one({  # another node's round, started and waiting (its look due in an hour)
        "_id": "elsewhere/1", "node": "elsewhere", "episode": at, "first_seen": at, "fatal": True,
        "rounds": [{"step": remedies.REBOOT, "request": "elsewhere-1", "fault_keys": [], "gpus": [],
                    "reason": "test", "requested_at": at, "started_at": at, "outcome": None, "at": None}],
        "remediation": {"state": "idle", "attempts": 0},
        "janitor": {"state": store.State.PENDING, "attempts": 0, "retry_after": at + dt.timedelta(hours=1)},
    })  # fmt: skip
    assert [r.repair_id for r in st.repairs_in_flight()] == ["elsewhere/1"]
    with fakes.FakeCloud() as fake:  # the reboot is accepted, the node never comes back
        env = {"AWS_ACCESS_KEY_ID": fakes.AWS_KEY, "AWS_SECRET_ACCESS_KEY": fakes.AWS_SECRET}
        provider = aws.AWS(aws.Settings(endpoint=f"{fake.url}/aws/ec2/", env=env))
        worker = janitor.Janitor(st, api, janitor.Settings(
            provider=provider, reboot_via="cloud", reboot_timeout=dt.timedelta(minutes=5),
            max_repairs_in_flight=1, **FAST), "j")  # fmt: skip
        key = _repair(st, node, remedies.REBOOT, fault, "capped-reboot-1")
        worker.start()
        try:
            held = worker.metrics.limited.labels(limit="repairs")
            procs.wait_for("held back three times", lambda: held._value.get() >= 3, 20)
            doc = mongo_db["repairs"].find_one({"_id": key})
            assert fake.actions("aws") == []  # nothing called
            assert doc["rounds"][0]["outcome"] is None and "started_at" not in doc["rounds"][0]
            assert doc["janitor"]["state"] in (store.State.PENDING, store.State.CLAIMED)
            assert doc["janitor"]["attempts"] <= 1 and doc["janitor"].get("error") is None  # no failure
            assert doc["remediation"]["state"] == "idle"  # nothing to escalate
            st.db["repairs"].update_one({"_id": "elsewhere/1"}, {"$set": {"rounds.0.outcome": "Succeeded"}})
            procs.wait_for("then it goes ahead",
                           lambda: mongo_db["repairs"].find_one({"_id": key})["rounds"][0].get("cloud_call"), 20)  # fmt: skip
        finally:
            assert worker.halt(10)
        assert fake.actions("aws") == [("RebootInstances", instance_id)]


def test_replace_through_gcp_and_oci(
    cluster: LocalCluster, api: Any, mongo_db: Any, setup: None, tmp_path: Path
) -> None:
    """GCE recreates a managed instance under the same name (a new boot); an OCI instance is terminated
    and its Node removed. Either way the old hardware's faults are resolved by the janitor."""
    from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: PLC0415

    st = store.Store(mongo_db)
    st.ensure_indexes()
    core = kube.core(api)
    same_name = cluster.node_names[1]
    _provider_id(api, same_name, "gce://proj/us-central1-b/gke-gpu-pool-1-recreate")
    gone = "replace-me-oci"
    core.create_node(
        {
            "metadata": {"name": gone},
            "spec": {"providerID": f"oci://ocid1.instance.oc1.iad.gone{os.getpid()}"},
        }
    )
    faults = {n: _fault(n, "XID-48", Action.REPLACE_VM) for n in (same_name, gone)}
    for f in faults.values():
        st.write_fault(f, 1)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with fakes.FakeCloud(oci_public_key=key.public_key()) as fake:
        fake.gce_groups["gke-gpu-pool-1-recreate"] = (
            "projects/1/zones/us-central1-b/instanceGroupManagers/gpu-grp"
        )
        fake.on_replace = lambda i: (cluster.fakelet.reboot(same_name, down_seconds=1.0)
                                     if i == "gke-gpu-pool-1-recreate" else core.delete_node(gone))  # fmt: skip
        providers: dict[str, Any] = {
            same_name: gcp.GCP(gcp.Settings(endpoint=f"{fake.url}/compute/v1", poll=0.05,
                                            env={"GCE_METADATA_HOST": fake.url.removeprefix("http://")})),
            gone: oci.OCI(oci.Settings(config_file=fakes.oci_config(tmp_path, key), endpoint=fake.url)),
        }  # fmt: skip
        for node, provider in providers.items():
            worker = janitor.Janitor(st, api, janitor.Settings(provider=provider,
                                     reboot_timeout=dt.timedelta(seconds=30), **FAST), f"j-{node}")  # fmt: skip
            repair = _repair(st, node, remedies.REPLACE, faults[node], f"replace-{node}")
            worker.start()
            try:
                procs.wait_for(f"{node} replaced", lambda r=repair: _outcome(st, r) is not None, 30)
            finally:
                worker.halt()
            assert _outcome(st, repair) == "Succeeded", st.db["repairs"].find_one({"_id": repair})
            doc = st.faults.find_one({"_id": faults[node].id})
            assert doc["state"] == FaultState.RESOLVED and doc["resolved_by"].startswith("janitor: ")
            # the evidence was kept before the provider's call (the fault still open then), and the
            # request names it
            (bundle,) = st.rma_bundles(node=node)
            assert bundle["_id"] == f"{repair}#1" and bundle["step"] == "REPLACE"
            assert [(f["code"], f["state"]) for f in bundle["faults"]] == [("XID-48", "open")]
            request = kube.resources.get_request(api, f"replace-{node}")
            assert request["status"]["evidence"] == bundle["_id"]
        assert fake.actions("gcp") == [("recreate:gpu-grp", "gke-gpu-pool-1-recreate")]
        assert [a for a, _ in fake.actions("oci")] == ["TERMINATE"]
    with pytest.raises(NotFoundError):
        kube.nodes.read(api, gone)


def test_a_janitor_killed_mid_repair_is_taken_over(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, mongo_db: Any, setup: None
) -> None:
    """Killed after the reboot Job rebooted the node, while validating: the next janitor does not reboot
    again and validates against the boot id recorded before the repair."""
    node = cluster.node_names[0]
    st = store.Store(mongo_db)
    st.ensure_indexes()
    fault = _fault(node)
    st.write_fault(fault, 1)
    before = cluster.fakelet.nodes[node].boot_id
    key = _repair(st, node, remedies.REBOOT, fault, f"killed-{os.getpid()}")
    argv = [sys.executable, "-m", "faultline", "worker", "janitor", "--mongodb-uri", mongo.uri, "--database",
            mongo_db.name, "--kubeconfig", str(cluster.kubeconfig), "--lease", "2s", "--poll", "0.2s",
            "--validate-timeout", "60s", "--image-pull-secrets", "registry-a"]  # fmt: skip
    first = subprocess.Popen(argv, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        procs.wait_for(
            "the reboot Job rebooted the node", lambda: cluster.fakelet.nodes[node].boot_id != before, 40
        )
        rebooted = cluster.fakelet.nodes[node].boot_id
        procs.wait_for("validating", lambda: kube.resources.get_request(
            api, f"killed-{os.getpid()}").get("status", {})
            .get("phase") == "Validating", 20)  # fmt: skip
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        recorded = st.db["repairs"].find_one({"_id": key})["rounds"][0]
        assert recorded["boot_before"] == before and recorded["started_at"] is not None
        st.write_fault(
            fault.model_copy(update={"state": FaultState.RESOLVED, "resolved_at": dt.datetime.now(dt.UTC)}), 2
        )
        second = janitor.Janitor(
            st, api, janitor.Settings(reboot_timeout=dt.timedelta(seconds=20), **FAST), "second"
        )
        second.start()
        try:
            procs.wait_for("taken over and validated", lambda: _outcome(st, key) is not None, 30)
        finally:
            second.halt()
        assert _outcome(st, key) == "Succeeded"
        assert cluster.fakelet.nodes[node].boot_id == rebooted  # no second reboot
        jobs = kube.batch(api).list_namespaced_job(
            "faultline-system", label_selector=f"faultline.io/node={node}"
        )
        assert [j.metadata.name for j in jobs.items] == [f"killed-{os.getpid()}"]
        sc = jobs.items[0].spec.template.spec.containers[0].security_context
        assert (sc.privileged, sc.run_as_user) == (True, 0)  # the image's user could not reboot anything
        assert [s.name for s in jobs.items[0].spec.template.spec.image_pull_secrets] == ["registry-a"]
        # the pod carries the repair label, so a drain of its node leaves it (workers.drainer.evictable)
        labels = jobs.items[0].spec.template.metadata.labels  # with the Job controller's own
        assert (labels["faultline.io/repair"], labels["faultline.io/node"]) == ("reboot", node)
        # which is also how the simulated kubelet knows the pod reboots its node: nothing test-only on it
        assert fakelet.SIM_ACTION not in (jobs.items[0].spec.template.metadata.annotations or {})
        # the killed process's looks, then the second's (each look is a claim: a wait holds none)
        owners = [
            d["owner"]
            for d in mongo_db["leases"].find({"stage": janitor.STAGE, "kind": "claimed"}).sort("n", 1)
        ]
        assert owners[0].startswith("janitor/") and owners[-1] == "second"
        assert owners.index("second") == len(owners) - owners.count("second")  # none by the first after
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)


GPU_REPAIR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "gpurepairs.repair.example.com"},
    "spec": {"group": "repair.example.com", "scope": "Namespaced",
             "names": {"plural": "gpurepairs", "singular": "gpurepair", "kind": "GpuRepair"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}  # fmt: skip
TEMPLATE = """
apiVersion: repair.example.com/v1
kind: GpuRepair
metadata:
  namespace: default
  annotations: {requested-by: "faultline ${action} for ${node}"}
spec:
  target: ${node}
  operation: ${action}
  devices: ${gpus}
  faults: ${faultKeys}
  why: "${reason}"
"""


@pytest.fixture
def crd_dir(tmp_path: Path) -> Path:
    (tmp_path / "crds").mkdir()
    (tmp_path / "crds" / "gpurepairs.yaml").write_text(yaml.safe_dump(GPU_REPAIR_CRD))
    return tmp_path / "crds"


def test_an_external_remediators_template(
    cluster: LocalCluster, api: Any, mongo_db: Any, setup: None, crd_dir: Path, tmp_path: Path
) -> None:
    kube.resources.ensure_crds(api, crd_dir)
    node = cluster.node_names[4]
    st = store.Store(mongo_db)
    st.ensure_indexes()
    fault = _fault(node)
    st.write_fault(fault, 1)
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    st.nodes.insert_one({"_id": node, "quarantined": True, "quarantined_at": now})
    (tmp_path / "template.yaml").write_text(TEMPLATE)
    template = templates.load(tmp_path / "template.yaml")
    workers = [
        remediation.Remediation(st, api, remediation.Settings(template=template, require_drain=False,
                                external_timeout=dt.timedelta(seconds=30), resync_interval=0.2, **{k: v for k, v in FAST.items() if k != "poll"}), "r"),
        janitor.Janitor(st, api, janitor.Settings(**FAST), "j"),
    ]  # fmt: skip
    custom = kube.custom(api)
    try:
        for w in workers:
            w.start()
        procs.wait_for("a GpuRepair", lambda: custom.list_namespaced_custom_object(
            "repair.example.com", "v1", "default", "gpurepairs", label_selector=f"faultline.io/node={node}")["items"], 20)  # fmt: skip
        made = custom.list_namespaced_custom_object("repair.example.com", "v1", "default", "gpurepairs",
                                                    label_selector=f"faultline.io/node={node}")["items"]  # fmt: skip
        assert len(made) == 1
        spec = made[0]["spec"]
        assert spec == {"target": node, "operation": "REBOOT", "devices": ["0000:3a:00"], "faults": [fault.id],
                        "why": "from RESTART_BM"}  # fmt: skip
        assert made[0]["metadata"]["annotations"]["requested-by"] == f"faultline REBOOT for {node}"
        assert not kube.resources.list_requests(api, label_selector=f"faultline.io/node={node}")
        # the external remediator repairs the node; the node agent then reports it healthy
        st.write_fault(
            fault.model_copy(update={"state": FaultState.RESOLVED, "resolved_at": dt.datetime.now(dt.UTC)}), 2
        )
        repair = lambda: st.db["repairs"].find_one({"node": node}) or {}  # noqa: E731
        try:
            procs.wait_for(
                "validated", lambda: (repair().get("rounds") or [{}])[-1].get("outcome") is not None, 20
            )
        except Exception:
            print("REPAIR", repair(), "FAULT", st.faults.find_one({"_id": fault.id}))
            raise
        assert [(r["step"], r["outcome"], r.get("external")) for r in repair()["rounds"]] == [
            ("REBOOT", "Succeeded", True)
        ]
        jobs = kube.batch(api).list_namespaced_job(
            "faultline-system", label_selector=f"faultline.io/node={node}"
        )
        assert jobs.items == []  # the janitor carried nothing out itself
    finally:
        for w in workers:
            w.halt()


def _round_only(
    st: store.Store, node: str, step: str, fault: Fault, request: str, tag: str = "", **said: Any
) -> str:
    """A repair round in the store alone, naming `request` (which `_repair` then creates; written with the
    store's credential alone, as root on some GPU node could, it names whatever it likes)."""
    episode = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)
    key = f"{node}/{episode.isoformat()}" + (f"-{tag}" if tag else "")
    st.db["repairs"].insert_one({
        "_id": key, "node": node, "episode": episode, "first_seen": episode, "fatal": True,
        "rounds": [{"step": step, "request": request, "fault_keys": [fault.id], "gpus": [fault.entity.id],
                    "reason": "test", "requested_at": episode, "outcome": None, "at": None, **said}],
        "remediation": {"state": "idle", "attempts": 0}, "janitor": {"state": store.State.PENDING, "attempts": 0},
    })  # fmt: skip
    return key


@pytest.mark.redteam
def test_the_janitor_carries_out_only_what_a_remediation_request_asks_for(
    cluster: LocalCluster, api: Any, mongo_db: Any, setup: None
) -> None:
    """Rounds forged in the store: naming no request, another node's request, a request for another step,
    or one carried out already. None is carried out (no Job), each is refused with why, and the requests
    named (someone else's) are left as they were."""
    node, other = cluster.node_names[3], cluster.node_names[1]
    st = store.Store(mongo_db)
    st.ensure_indexes()
    fault = _fault(node)
    st.write_fault(fault, 1)
    theirs = _repair(st, other, remedies.REBOOT, _fault(other), "forged-theirs-1")  # a genuine one, elsewhere
    st.db["repairs"].delete_one({"_id": theirs})  # only its request is left
    _repair(st, node, remedies.REBOOT, fault, "forged-done-1")
    st.db["repairs"].delete_many({"node": node})
    kube.resources.patch_request_status(
        api, "forged-done-1", {"phase": "Succeeded", "finishedAt": "2026-01-01T00:00:00Z"}
    )
    _repair(st, node, remedies.REBOOT, fault, "forged-step-1")
    st.db["repairs"].delete_many({"node": node})
    forged = {
        _round_only(st, node, remedies.REBOOT, fault, "forged-none-1", "a"): "no RemediationRequest forged-none-1",
        _round_only(st, node, remedies.REBOOT, fault, "forged-theirs-1", "b"): f"is for node '{other}'",
        _round_only(st, node, remedies.GPU_RESET, fault, "forged-step-1", "c"): "asks for 'REBOOT', not GPU_RESET",
        _round_only(st, node, remedies.REBOOT, fault, "forged-done-1", "d"): "was carried out already",
        # a round claiming its step was done already (a Job run, a provider called, validation begun)
        _round_only(st, node, remedies.REBOOT, fault, "forged-none-2", "e", acted_at=dt.datetime.now(dt.UTC),
                    started_at=dt.datetime.now(dt.UTC)): "no RemediationRequest forged-none-2",
        _round_only(st, node, remedies.REPLACE, fault, "forged-none-3", "f", cloud_call="replaced",
                    boot_before="<node gone>"): "no RemediationRequest forged-none-3",
    }  # fmt: skip
    worker = janitor.Janitor(st, api, janitor.Settings(**FAST), "j-forged")
    worker.start()
    try:
        procs.wait_for("every forged round refused",
                       lambda: all(_outcome(st, key) == "Cancelled" for key in forged), 20)  # fmt: skip
    finally:
        worker.halt()
    for key, says in forged.items():
        doc = st.db["repairs"].find_one({"_id": key})
        assert says in doc["rounds"][-1]["message"], doc["rounds"][-1]["message"]
        assert doc["result"] == "refused"
    assert kube.jobs.list_all(api, "faultline-system", label_selector=f"faultline.io/node={node}") == []
    assert st.db["faults"].find_one({"_id": fault.id})["state"] == "open"  # no forged REPLACE resolved it
    assert not kube.resources.get_request(api, "forged-theirs-1").get("status")  # not written on
    assert kube.resources.get_request(api, "forged-step-1").get("status", {}).get("phase") is None
