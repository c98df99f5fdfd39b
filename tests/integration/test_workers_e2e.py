"""End to end on the real control plane and FerretDB: a simulated XID 79 on a node running pods ->
condition -> cordon + taint -> pods evicted (PDB respected) -> RemediationRequest -> reboot Job ->
simulated reboot -> healthy report -> faults resolved -> uncordon, with every step's time recorded.
Two replicas of every worker run side by side: each action must happen once."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import tarfile
from pathlib import Path
from typing import Any

import pytest

from devtools import fakelet, procs
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.errors import ConflictError
from faultline.models import (
    HEALTH_SAMPLE_CODE,
    Action,
    Component,
    Entity,
    Fault,
    FaultState,
    HealthEvent,
    fault_id,
)
from tests.integration.test_agent import poll, sim, start_agent, stop_agent
from tests.integration.test_drainer import pdb, pod, pods_on
from workers import breaker, drainer, janitor, quarantine, remediation

pytestmark = pytest.mark.integration


def test_xid_to_repair_to_uncordon(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, mongo_db: Any, namespace: str, tmp_path: Path
) -> None:
    node = cluster.node_names[3]
    core = kube.core(api)
    system_namespace(api)
    core.patch_namespace(namespace, {"metadata": {"labels": {drainer.MODE_LABEL: "Immediate"}}})
    for i in range(2):
        core.create_namespaced_pod(namespace, pod(f"train-{i}", node, labels={"app": "train"}))
    poll(
        "pods running",
        lambda: all(p.status.phase == "Running" for p in core.list_namespaced_pod(namespace).items),
        20,
    )
    pdb(api, namespace, "train", 1)  # bare pods: one may go, the last one stays while the budget exists

    st = store.Store(mongo_db)
    st.ensure_indexes()
    fast = {"lease": dt.timedelta(seconds=5), "threads": 2}

    def replicas(n: int) -> list[Any]:
        return [
            quarantine.QuarantineWorker(st, api, quarantine.Settings(
                hold_down=dt.timedelta(seconds=1), resync_interval=0.3,
                breaker=breaker.BreakerConfig(max_share=None, max_count=None), **fast), f"q{n}"),
            drainer.Drainer(st, api, drainer.Settings(poll=0.3, resync_interval=0.3, backoff_max=1.0, **fast),
                            f"d{n}"),
            remediation.Remediation(st, api, remediation.Settings(resync_interval=0.3, **fast), f"r{n}"),
            janitor.Janitor(st, api, janitor.Settings(poll=0.3, reboot_timeout=dt.timedelta(seconds=60),
                                                      validate_timeout=dt.timedelta(seconds=30), **fast), f"j{n}"),
        ]  # fmt: skip

    workers = replicas(1) + replicas(2)
    began = dt.datetime.now(dt.UTC).replace(microsecond=0)
    drainers = [w for w in workers if isinstance(w, drainer.Drainer)]
    agent = start_agent(cluster, mongo, node, mongo_db.name, tmp_path)
    times: dict[str, float] = {}
    try:
        for w in workers:
            w.start()
        boot_before = janitor.Janitor._boot_id(workers[3], node)
        sim(tmp_path, node, "--gpu", "3", "--xid", "79")
        times["condition"] = poll(
            "GpuHealthy False",
            lambda: kube.nodes.conditions(api, node).get("GpuHealthy", {}).get("status") == "False",
            10,
        )
        times["cordoned"] = poll("cordoned", lambda: bool(core.read_node(node).spec.unschedulable), 10)
        taints = {(t.key, t.value) for t in core.read_node(node).spec.taints or []}
        assert ("faultline.io/fault", "XID-79") in taints
        poll(
            "one pod evicted, the other held by the budget",
            lambda: len(pods_on(api, namespace, node)) == 1,
            30,
        )
        poll(
            "the budget refusing",
            lambda: (
                sum(d.metrics.actions.labels(result="eviction-refused")._value.get() for d in drainers) > 0
            ),
            10,
        )
        assert len(pods_on(api, namespace, node)) == 1  # never deleted around the budget
        kube.policy(api).delete_namespaced_pod_disruption_budget(
            "train", namespace
        )  # the job owner allows it
        times["drained"] = poll("pods evicted", lambda: pods_on(api, namespace, node) == [], 30)
        drain = st.drains.find_one({"_id": node})
        assert all(r["mode"] == "Immediate" for r in drain["pods"].values())

        def requests() -> list[dict[str, Any]]:  # this test's: other tests of the session used the node too
            found = kube.resources.list_requests(api, label_selector=f"faultline.io/node={node}")
            return [r for r in found if r["metadata"]["creationTimestamp"] >= f"{began:%Y-%m-%dT%H:%M:%SZ}"]

        times["requested"] = poll("a RemediationRequest", requests, 30)
        request = requests()[0]
        assert request["spec"]["action"] == "REBOOT" and request["spec"]["node"] == node
        # `faultline explain` tells the story so far: held for XID 79 by the default rule, the line behind
        # it, the drain of both pods, the reboot asked for, and what a person can do
        story = explain(cluster, mongo, mongo_db, node)
        assert story["exists"] and story["held"] and story["kubernetes"]["cordoned"]
        assert "faultline.io/fault=XID-79:NoSchedule" in story["kubernetes"]["taints"]
        xid = next(f for f in story["faults"] if f["code"] == "XID-79")
        assert (xid["state"], xid["fatal"], xid["action"]) == ("open", True, "RESTART_BM")
        assert xid["rules"] == ["fatal-faults-cordon"] and xid["quarantine"]["state"] == "done"
        assert xid["evidence"] and all(e["observed_at"] for e in xid["evidence"])
        assert story["drain"]["result"] == "drained" and story["drain"]["scope"] in (None, "node")
        assert sorted(p["name"] for p in story["drain"]["pods"] if not p["skipped"]) == ["train-0", "train-1"]
        (rounds,) = [r["rounds"] for r in story["repairs"] if r["rounds"]]
        assert rounds[-1]["step"] == "REBOOT" and rounds[-1]["request"] == request["metadata"]["name"]
        assert "REBOOT" in story["next"]
        assert f"kubectl uncordon {node}" in [a["command"] for a in story["actions"]]
        screen = explain(cluster, mongo, mongo_db, node, output="table")
        assert f"node {node}: held by faultline" in screen and "XID-79 on GPU" in screen
        assert "rules: fatal-faults-cordon; quarantine: done" in screen and "next: " in screen
        held = explain(cluster, mongo, mongo_db, node, command="status")
        assert [h["node"] for h in held["held"]] == [node] and held["faults"][0]["code"] == "XID-79"
        times["rebooted"] = poll(
            "a new boot id", lambda: janitor.Janitor._boot_id(workers[3], node) != boot_before, 30
        )  # type: ignore[arg-type]
        sim(tmp_path, node, "--gpu", "3", "--clear")  # the GPU reports healthy after the reboot
        times["resolved"] = poll("faults resolved", lambda: all(
            d["state"] == "resolved" for d in mongo_db["faults"].find({"node": node})), 20)  # fmt: skip
        times["uncordoned"] = poll("uncordoned", lambda: not core.read_node(node).spec.unschedulable, 30)
        repair = mongo_db["repairs"].find_one({"node": node})
        assert [r["outcome"] for r in repair["rounds"]] == ["Succeeded"]
        story = explain(cluster, mongo, mongo_db, node)
        assert not story["held"] and not story["kubernetes"]["cordoned"]
        assert all(f["state"] == "resolved" for f in story["faults"])
        assert story["next"] == "nothing: no open fault and not held"
        assert story["repairs"][-1]["rounds"][-1]["outcome"] == "Succeeded"
        status = kube.resources.get_request(api, request["metadata"]["name"])["status"]
        # the janitor replicas that looked at the round (a waiting repair is any replica's next look)
        lookers = repair["rounds"][0]["lookers"]
        assert status["phase"] == "Succeeded" and status["attempts"] == len(lookers) >= 1
        assert not any(t.key.startswith("faultline.io/") for t in core.read_node(node).spec.taints or [])
        # two replicas of each worker, each action once
        assert sum(d.metrics.actions.labels(result="evicted")._value.get() for d in drainers) == 2
        jobs = kube.batch(api).list_namespaced_job(
            "faultline-system", label_selector=f"faultline.io/node={node}"
        )
        assert len(jobs.items) == 1
        assert len(requests()) == 1
        assert mongo_db["repairs"].count_documents({"node": node}) == 1
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
        reasons = [e.reason for e in events if e.metadata.creation_timestamp >= began]
        for once in ("FaultlineQuarantined", "FaultlineRemediationRequested", "FaultlineRepairSucceeded"):
            assert reasons.count(once) == 1, (once, reasons)
        print("\nstep times (s, each from the previous):", {k: round(v, 2) for k, v in times.items()})
    finally:
        for w in workers:
            w.halt()
        stop_agent(agent)
        core.patch_node(node, {"spec": {"unschedulable": None}})
        forget_repairs(api, node)  # the node is shared with other tests of the session


def test_a_repair_that_fails_escalates_to_contact_support(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, mongo_db: Any, tmp_path: Path
) -> None:
    node = cluster.node_names[4]
    core = kube.core(api)
    kube.resources.ensure_crds(api)
    with contextlib.suppress(ConflictError), kube.client.translated("create", "Namespace faultline-system"):
        core.create_namespace({"metadata": {"name": "faultline-system"}})
    st = store.Store(mongo_db)
    st.ensure_indexes()
    now = dt.datetime.now(dt.UTC)
    xid = Fault(
        id=fault_id(node, "GPU", "0000:3a:00", "XID-79"), node=node, entity=Entity(type="GPU", id="0000:3a:00"),
        code="XID-79", component=Component.GPU, count=1, first_seen=now, last_seen=now, fatal=True,
        action=Action.RESTART_BM, state=FaultState.OPEN,
    )  # fmt: skip
    fast = {"lease": dt.timedelta(seconds=5), "threads": 2}
    no_reboot = {fakelet.SIM_ACTION: "none"}  # the reboot Job runs, the node never comes back rebooted
    workers = [
        quarantine.QuarantineWorker(st, api, quarantine.Settings(
            resync_interval=0.3, breaker=breaker.BreakerConfig(max_share=None, max_count=None), **fast), "q"),
        drainer.Drainer(st, api, drainer.Settings(poll=0.3, resync_interval=0.3, **fast), "d"),
        remediation.Remediation(st, api, remediation.Settings(resync_interval=0.3, **fast), "r"),
        janitor.Janitor(st, api, janitor.Settings(poll=0.3, reboot_timeout=dt.timedelta(seconds=2),
                                                  job_annotations=no_reboot, **fast), "j"),
    ]  # fmt: skip
    # what the node's agent and its repair Jobs would have left in the store: the GPUs' identity, the line
    # behind the fault, a health sample, a bug report
    ident = {"index": 2, "uuid": "GPU-e2e-2", "serial": "1652022099999", "model": "NVIDIA H100 80GB HBM3",
             "vbios": "96.00.99.00.01", "driver": "580.95.05"}  # fmt: skip
    st.record_gpus(node, [{**ident, "pci": "0000:3a:00"}], now)
    line = "NVRM: Xid (PCI:0000:3a:00): 79, pid=0, name=faultline, GPU has fallen off the bus."
    st.record_events([
        HealthEvent(id=f"e2e-{node}-xid", node=node, component=Component.GPU, check="xid", code="XID-79",
                    entities=(xid.entity,), healthy=False, fatal=True, action=Action.RESTART_BM, message=line,
                    observed_at=now, generated_at=now),
        HealthEvent(id=f"e2e-{node}-sample", node=node, component=Component.GPU, check="gpu-health-sample",
                    code=HEALTH_SAMPLE_CODE, entities=(xid.entity,), healthy=True, fatal=False, action=Action.NONE,
                    metadata={"ecc_dbe_volatile": "3", "temperature": "47"}, observed_at=now, generated_at=now),
    ])  # fmt: skip
    st.keep_bug_report(node, "nvidia-bug-report-round-1.log.gz", b"\x1f\x8b fake gzip", now)
    try:
        for w in workers:
            w.start()
        st.write_fault(xid, 1)
        poll("contact support", lambda: kube.nodes.conditions(api, node).get("FaultlineRemediation", {})
             .get("reason") == "ContactSupport", 60)  # fmt: skip
        repair = mongo_db["repairs"].find_one({"node": node})
        assert [(r["step"], r["outcome"]) for r in repair["rounds"]] == [
            ("REBOOT", "TimedOut"),
            ("CONTACT_SUPPORT", "ContactSupport"),
        ]
        assert "escalated after REBOOT did not clear" in repair["rounds"][1]["reason"]
        requests = kube.resources.list_requests(api, label_selector=f"faultline.io/node={node}")
        assert [r["status"]["phase"] for r in requests] == ["TimedOut"]  # no request for contact support
        assert core.read_node(node).spec.unschedulable  # stays quarantined for a human
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
        assert {"FaultlineRepairTimedOut", "FaultlineContactSupport"} <= {e.reason for e in events}
        # the RMA evidence, kept before the node waits for a person, and named by its condition
        bundle = mongo_db["rma"].find_one({"_id": f"{repair['_id']}#2"})
        assert (bundle["node"], bundle["step"]) == (node, "CONTACT_SUPPORT")
        assert [f["code"] for f in bundle["faults"]] == ["XID-79"]
        assert [e["message"] for e in bundle["evidence"][xid.id]] == [line]
        assert [(g["serial"], g["vbios"], g["driver"]) for g in bundle["gpus"]] == [
            ("1652022099999", "96.00.99.00.01", "580.95.05")]  # fmt: skip
        assert bundle["samples"]["0000:3a:00"][0]["metadata"]["ecc_dbe_volatile"] == "3"
        assert [r["step"] for r in bundle["repairs"][0]["rounds"]] == ["REBOOT"]  # kept as it escalated
        assert [b["name"] for b in bundle["bug_reports"]] == ["nvidia-bug-report-round-1.log.gz"]
        condition = kube.nodes.conditions(api, node)["FaultlineRemediation"]
        assert f"RMA evidence {bundle['_id']}" in condition["message"]
        for target in (node, "1652022099999"):  # by node, and by the GPU's serial
            tarball = tmp_path / f"{target}.tar.gz"
            out = rma(mongo, mongo_db, target, tarball)
            assert out.exit_code == 0, out.output
            with tarfile.open(tarball) as tar:
                names = tar.getnames()
                top = next(n.split("/")[0] for n in names if n.endswith("/bundle.json"))
                lines = tar.extractfile(f"{top}/kernel-lines.txt").read().decode()  # type: ignore[union-attr]
                report = tar.extractfile(f"bug-reports/{node}/nvidia-bug-report-round-1.log.gz")
                assert report is not None and report.read() == b"\x1f\x8b fake gzip"
            assert {f"{top}/bundle.json", f"{top}/gpus.json", f"{top}/repairs.json", "README.txt"} <= set(
                names
            )
            assert line in lines and "ecc_dbe_volatile=3" in lines
        story = explain(cluster, mongo, mongo_db, node)
        assert [b["id"] for b in story["rma"]] == [bundle["_id"]]
        assert story["next"].startswith("waiting for a person (CONTACT_SUPPORT)")
        missing = rma(mongo, mongo_db, "no-such-node", tmp_path / "none.tar.gz")
        assert missing.exit_code == 1 and "no RMA evidence of 'no-such-node'" in missing.output
    finally:
        for w in workers:
            w.halt()
        st.write_fault(xid.model_copy(update={"state": FaultState.RESOLVED, "resolved_at": now}), 2)
        core.patch_node(node, {"spec": {"unschedulable": None}})
        kube.nodes.write_conditions(api, node, [], ["FaultlineRemediation"])
        forget_repairs(api, node)  # the node is shared with other tests of the session


def explain(
    cluster: LocalCluster, mongo: LocalMongo, mongo_db: Any, node: str, *, output: str = "json",
    command: str = "explain",
) -> Any:  # fmt: skip
    """`faultline explain NODE` (or `status NODE`, or `status-all`: `status` of every node) as a person runs
    it: its JSON, or its screen."""
    from typer.testing import CliRunner  # noqa: PLC0415

    from cli import app  # noqa: PLC0415

    argv = [command, node] if command != "status-all" else ["status"]
    argv += ["-o", output, "--mongodb-uri", mongo.uri, "--database", mongo_db.name]
    if command == "explain":
        argv += ["--kubeconfig", str(cluster.kubeconfig)]
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        got = CliRunner().invoke(app.app, argv)
    finally:  # the command set up logging to the runner's stream, which closes: the workers' logs stay
        root.handlers[:] = handlers
    assert got.exit_code == 0, got.output
    return json.loads(got.stdout) if output == "json" else got.stdout


def rma(mongo: LocalMongo, mongo_db: Any, target: str, path: Path) -> Any:
    """`faultline rma TARGET --file PATH` against the test's database."""
    from typer.testing import CliRunner  # noqa: PLC0415

    from cli import app  # noqa: PLC0415

    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        return CliRunner().invoke(app.app, ["rma", target, "--file", str(path), "--mongodb-uri", mongo.uri,
                                            "--database", mongo_db.name])  # fmt: skip
    finally:
        root.handlers[:] = handlers


def forget_repairs(api: Any, node: str) -> None:
    """Remove this test's RemediationRequests and repair Jobs of a node the session's tests share."""
    selector = f"faultline.io/node={node}"
    kube.resources.delete_requests(api, label_selector=selector)
    kube.batch(api).delete_collection_namespaced_job(
        "faultline-system", label_selector=selector, propagation_policy="Background"
    )
    procs.wait_for(
        "the repair Jobs gone",
        lambda: not kube.batch(api).list_namespaced_job("faultline-system", label_selector=selector).items,
        30,
    )


def system_namespace(api: Any) -> None:
    """The CRD, and the janitor's namespace and ServiceAccount (created once per session)."""
    core = kube.core(api)
    kube.resources.ensure_crds(api)
    with contextlib.suppress(ConflictError), kube.client.translated("create", "Namespace faultline-system"):
        core.create_namespace({"metadata": {"name": "faultline-system"}})
    with contextlib.suppress(ConflictError), kube.client.translated("create", "ServiceAccount"):
        core.create_namespaced_service_account(
            "faultline-system", {"metadata": {"name": "faultline-janitor"}}
        )
