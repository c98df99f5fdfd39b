"""RemediationRequests that people create, on the real control plane and FerretDB with simulated nodes:
the janitor adopts each one (no `faultline.io/node` label) and carries it out like its own repairs, or
refuses it with a clear status.

- a reboot request: the node cordoned, rebooted by the Job, validated against its open fault, released;
  a second request for the node meanwhile is refused, as is one for a node that does not exist;
- a request deleted before the janitor starts it is cancelled (no Job, no reboot); one deleted after
  it started completes, and its status is written nowhere;
- a janitor killed mid-repair: the next one takes the round over without a second Job or reboot.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.errors import NotFoundError
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from tests.integration.test_workers_e2e import system_namespace
from workers import janitor, remedies, user_requests

pytestmark = pytest.mark.integration
FAST = {"lease": dt.timedelta(seconds=2), "threads": 2, "poll": 0.2}
JOBS = "faultline-system"


def _fault(node: str) -> Fault:
    now = dt.datetime.now(dt.UTC)
    return Fault(
        id=fault_id(node, "GPU", "0000:3a:00", "XID-79"), node=node, entity=Entity(type="GPU", id="0000:3a:00"),
        code="XID-79", component=Component.GPU, count=1, first_seen=now, last_seen=now, fatal=True,
        action=Action.RESTART_BM, state=FaultState.OPEN,
    )  # fmt: skip


def _resolve(st: store.Store, fault: Fault) -> None:
    """What the node agent reports once the repaired GPU reads healthy."""
    st.write_fault(
        fault.model_copy(update={"state": FaultState.RESOLVED, "resolved_at": dt.datetime.now(dt.UTC)}), 2
    )


def _ask(api: Any, name: str, node: str, action: str = "REBOOT", **spec: Any) -> str:
    """`kubectl create` of a RemediationRequest, as a person writes it; its uid."""
    body = {"apiVersion": kube.resources.RR_API_VERSION, "kind": "RemediationRequest",
            "metadata": {"name": name, "annotations": {user_requests.REQUESTED_BY: "alice"}},
            "spec": {"node": node, "action": action, "reason": "the GPU hangs", **spec}}  # fmt: skip
    kube.resources.create_request(api, body)
    return str(kube.resources.get_request(api, name)["metadata"]["uid"])


def _status(api: Any, name: str) -> dict[str, Any]:
    return dict(kube.resources.get_request(api, name).get("status") or {})


def _phase(api: Any, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
    procs.wait_for(f"{name} {phase}", lambda: _status(api, name).get("phase") == phase, timeout)
    return _status(api, name)


def _delete(api: Any, name: str) -> None:
    with contextlib.suppress(NotFoundError), kube.client.translated("delete", f"RemediationRequest {name}"):
        kube.custom(api).delete_cluster_custom_object(
            kube.resources.RR_GROUP, kube.resources.RR_VERSION, kube.resources.RR_PLURAL, name
        )


def _jobs(api: Any, node: str) -> list[str]:
    found = kube.batch(api).list_namespaced_job(JOBS, label_selector=f"faultline.io/node={node}").items
    return sorted(j.metadata.name for j in found)


def _node(api: Any, node: str) -> tuple[bool, str | None]:
    """Cordoned?, and the request the janitor cordoned it for."""
    obj = kube.nodes.read(api, node)
    return bool(obj["spec"].get("unschedulable")), (obj["metadata"].get("annotations") or {}).get(
        user_requests.CORDONED_FOR
    )


def _events(api: Any, node: str, since: dt.datetime) -> list[str]:
    found = (
        kube.core(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    )
    return [f"{e.reason}: {e.message}" for e in found if e.metadata.creation_timestamp >= since]


@pytest.fixture
def scene(cluster: LocalCluster, api: Any, mongo_db: Any) -> Iterator[tuple[str, store.Store, list[str]]]:
    """A simulated node with an open fault, the store, and the names of the requests the test creates
    (removed afterwards with their Jobs, and the node uncordoned: the session's tests share it)."""
    system_namespace(api)
    node = cluster.node_names[0]
    assert _node(api, node) == (False, None)
    st = store.Store(mongo_db)
    st.ensure_indexes()
    names: list[str] = []
    try:
        yield node, st, names
    finally:
        for name in names:
            _delete(api, name)
        for job in _jobs(api, node):
            if job.startswith("request-"):
                kube.batch(api).delete_namespaced_job(job, JOBS, propagation_policy="Background")
        kube.core(api).patch_node(node, {"spec": {"unschedulable": None},
                                         "metadata": {"annotations": {user_requests.CORDONED_FOR: None}}})  # fmt: skip


def test_a_reboot_request_is_carried_out_and_validated_and_a_second_one_refused(
    cluster: LocalCluster, api: Any, scene: tuple[str, store.Store, list[str]]
) -> None:
    node, st, names = scene
    fault = _fault(node)
    st.write_fault(fault, 1)
    began = dt.datetime.now(dt.UTC).replace(microsecond=0)
    first, second, nowhere = (f"user-{what}-{os.getpid()}" for what in ("reboot", "again", "nowhere"))
    names += [first, second, nowhere]
    before = cluster.fakelet.nodes[node].boot_id
    worker = janitor.Janitor(st, api, janitor.Settings(reboot_timeout=dt.timedelta(seconds=30),
                             validate_timeout=dt.timedelta(seconds=30), **FAST), "j")  # fmt: skip
    worker.start()
    try:
        uid = _ask(api, first, node)
        missing = f"no-such-node-{os.getpid()}"
        _ask(api, nowhere, missing)
        refused = _phase(api, nowhere, "Refused")
        assert refused["message"] == f"spec.node: node {missing!r} does not exist"
        validating = _phase(api, first, "Validating")
        rebooted = cluster.fakelet.nodes[node].boot_id
        assert rebooted != before and validating["attempts"] == 1
        assert _node(api, node) == (True, first)  # cordoned for the request while it runs

        _ask(api, second, node)
        refused = _phase(api, second, "Refused")
        assert refused["message"] == (f"a repair of node {node} is already running: {node}/request-1, "
                                      f"REBOOT ({first})")  # fmt: skip
        assert _status(api, first)["phase"] == "Validating"  # not yet: the fault is still open

        _resolve(st, fault)
        done = _phase(api, first, "Succeeded")
        assert done["message"] == "the node agent reports the GPUs healthy again"
        procs.wait_for("uncordoned", lambda: _node(api, node) == (False, None), 10)
    finally:
        worker.halt()
    assert cluster.fakelet.nodes[node].boot_id == rebooted  # one reboot
    assert _jobs(api, node).count(f"request-{uid}") == 1
    repairs = st.repairs_of(node)
    assert [r.id for r in repairs] == [f"{node}/request-1"]  # the refused ones were never adopted
    repair = repairs[0]
    assert repair.user is not None and (repair.user.name, repair.user.uid, repair.user.by) == (
        first,
        uid,
        "alice",
    )
    assert [(r.step, r.fault_keys, r.outcome) for r in repair.rounds] == [("REBOOT", [fault.id], "Succeeded")]
    assert repair.janitor.state == store.State.DONE and repair.remediation.state == store.State.IDLE
    events = _events(api, node, began)
    assert sum(e.startswith("FaultlineRequestRefused: ") and second in e for e in events) == 1, events
    assert sum(e.startswith("FaultlineRepairSucceeded: ") and first in e for e in events) == 1, events


def test_a_request_deleted_before_it_starts_is_not_carried_out(
    cluster: LocalCluster,
    api: Any,
    scene: tuple[str, store.Store, list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    node, st, names = scene
    fault = _fault(node)
    st.write_fault(fault, 1)
    early, late = f"user-early-{os.getpid()}", f"user-late-{os.getpid()}"
    names += [early, late]
    before = cluster.fakelet.nodes[node].boot_id
    worker = janitor.Janitor(st, api, janitor.Settings(reboot_timeout=dt.timedelta(seconds=30),
                             validate_timeout=dt.timedelta(seconds=30), **FAST), "j")  # fmt: skip
    uid = _ask(api, early, node)
    worker.adopter.run()  # adopted, not started: nothing claims it yet
    assert _status(api, early)["phase"] == "Pending"
    assert [r.id for r in st.repairs_of(node)] == [f"{node}/request-1"]
    _delete(api, early)
    worker.start()
    try:
        procs.wait_for(
            "cancelled", lambda: st.repairs_of(node)[0].rounds[0].outcome == remedies.CANCELLED, 20
        )
        assert f"request-{uid}" not in _jobs(api, node)
        assert cluster.fakelet.nodes[node].boot_id == before
        assert _node(api, node) == (False, None)

        # deleted after it started: the repair completes, its status is written nowhere, and no error
        _ask(api, late, node)
        _phase(api, late, "Validating")
        _delete(api, late)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="workers.janitor"):
            _resolve(st, fault)
            procs.wait_for(
                "validated", lambda: st.repair(f"{node}/request-2").rounds[0].outcome == "Succeeded", 30
            )  # type: ignore[union-attr]
        procs.wait_for("uncordoned", lambda: _node(api, node) == (False, None), 10)
    finally:
        worker.halt()
    gone = [r for r in caplog.records if r.name == "workers.janitor"]
    assert [r.getMessage() for r in gone] == [
        f"RemediationRequest {late} is gone: status Succeeded not written"
    ]
    assert all(r.levelno == logging.INFO for r in gone)
    cancelled = st.repair(f"{node}/request-1")
    assert cancelled is not None and cancelled.result == "cancelled"


def test_a_janitor_killed_mid_request_is_taken_over_without_a_second_job(
    cluster: LocalCluster,
    mongo: LocalMongo,
    api: Any,
    mongo_db: Any,
    scene: tuple[str, store.Store, list[str]],
) -> None:
    node, st, names = scene
    fault = _fault(node)
    st.write_fault(fault, 1)
    name = f"user-killed-{os.getpid()}"
    names.append(name)
    argv = [sys.executable, "-m", "faultline", "worker", "janitor", "--mongodb-uri", mongo.uri, "--database",
            mongo_db.name, "--kubeconfig", str(cluster.kubeconfig), "--lease", "2s", "--poll", "0.2s",
            "--validate-timeout", "60s"]  # fmt: skip
    first = subprocess.Popen(argv, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        uid = _ask(api, name, node)
        _phase(api, name, "Validating", 40)  # the Job ran and the node came back rebooted
        rebooted = cluster.fakelet.nodes[node].boot_id
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        assert _node(api, node) == (True, name)
        second = janitor.Janitor(
            st, api, janitor.Settings(reboot_timeout=dt.timedelta(seconds=20), **FAST), "second"
        )
        second.start()
        try:
            _resolve(st, fault)
            done = _phase(api, name, "Succeeded")
            procs.wait_for("uncordoned", lambda: _node(api, node) == (False, None), 10)
        finally:
            second.halt()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
    assert done["attempts"] == 2  # two janitors held it
    assert cluster.fakelet.nodes[node].boot_id == rebooted  # no second reboot
    assert _jobs(api, node).count(f"request-{uid}") == 1
    # the killed process's looks, then the second's (each look is a claim: a wait holds none)
    owners = [
        d["owner"] for d in mongo_db["leases"].find({"stage": janitor.STAGE, "kind": "claimed"}).sort("n", 1)
    ]
    assert owners[0].startswith("janitor/") and owners[-1] == "second"
    assert owners.index("second") == len(owners) - owners.count("second")  # none by the first after
    assert [r.id for r in st.repairs_of(node)] == [f"{node}/request-1"]
