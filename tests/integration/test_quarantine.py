"""The quarantine worker against the real API server and FerretDB: cordon, taint and label on a fatal
fault, release after resolution, an operator's cordon left alone, opt-out, dry run, stale faults, the
circuit breaker during a storm (latched until a person resets it; the cap on nodes held at once over a
sustained storm of the whole fleet), and two replicas that never double-act."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devtools import fakelet, procs
from devtools.cluster import LocalCluster
from faultline import conditions, kube, store
from faultline.errors import NotFoundError
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from workers import breaker, overrides, quarantine, rules

pytestmark = pytest.mark.integration
FAST: dict[str, Any] = {
    "hold_down": dt.timedelta(seconds=0.5), "resync_interval": 0.2, "threads": 4, "lease": dt.timedelta(seconds=5),
}  # fmt: skip


@pytest.fixture
def nodes(api: Any) -> Iterator[list[str]]:
    """Fresh GPU Node objects for one test (not heartbeated: only their spec and metadata matter here)."""
    made: list[str] = []
    core = kube.core(api)

    def make(count: int) -> list[str]:
        for _ in range(count):
            name = f"q-{uuid.uuid4().hex[:8]}"
            core.create_node(fakelet.node_manifest(fakelet.SimNode(name, "10.9.0.1"), 8))
            made.append(name)
        return made[-count:]

    yield make  # type: ignore[misc]
    for name in made:
        with contextlib.suppress(NotFoundError):
            kube.nodes.delete(api, name)


def fault(node: str, code: str = "XID-79", *, fatal: bool = True, resolved: bool = False,
          last_seen: dt.datetime | None = None) -> Fault:  # fmt: skip
    now = dt.datetime.now(dt.UTC)
    seen = last_seen or now
    return Fault(
        id=fault_id(node, "GPU", "0000:3b:00", code), node=node, entity=Entity(type="GPU", id="0000:3b:00"),
        code=code, component=Component.GPU, count=1, first_seen=seen, last_seen=seen, fatal=fatal,
        action=Action.RESTART_BM, state=FaultState.RESOLVED if resolved else FaultState.OPEN,
        resolved_at=now if resolved else None,
    )  # fmt: skip


def node_view(api: Any, name: str) -> dict[str, Any]:
    obj = kube.nodes.read(api, name)
    return {
        "cordoned": bool(obj["spec"].get("unschedulable")),
        "taints": sorted(  # the node controller's own left out: these nodes get no heartbeat
            (t["key"], t.get("value", ""), t["effect"])
            for t in obj["spec"].get("taints") or []
            if not t["key"].startswith("node.kubernetes.io/")
        ),
        "labels": obj["metadata"].get("labels") or {},
        "annotations": obj["metadata"].get("annotations") or {},
    }


def events(api: Any, node: str, reason: str) -> int:
    got = kube.core(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    return sum(1 for e in got if e.reason == reason)


def worker(mongo_db: Any, api: Any, **settings: Any) -> quarantine.QuarantineWorker:
    st = store.Store(mongo_db)
    st.ensure_indexes()
    return quarantine.QuarantineWorker(
        st, api, quarantine.Settings(**{**FAST, **settings}), f"test-{uuid.uuid4().hex[:4]}"
    )


@pytest.fixture
def running(mongo_db: Any, api: Any) -> Iterator[Any]:
    started: list[quarantine.QuarantineWorker] = []

    def start(**settings: Any) -> quarantine.QuarantineWorker:
        w = worker(mongo_db, api, **settings)
        w.start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.halt()


FAULT_TAINT = ("faultline.io/fault", "XID-79", "NoSchedule")
HOLD_ANNOTATIONS = ("karpenter.sh/do-not-disrupt", "cluster-autoscaler.kubernetes.io/scale-down-disabled")


def test_fatal_fault_quarantines_and_resolution_releases(
    running: Any, nodes: Any, mongo_db: Any, api: Any
) -> None:
    (name,) = nodes(1)
    w = running()
    w.store.write_fault(fault(name), 1)
    procs.wait_for("cordon", lambda: node_view(api, name)["cordoned"], 5)
    view = node_view(api, name)
    assert FAULT_TAINT in view["taints"]
    assert view["labels"]["faultline.io/state"] == "quarantined"
    assert view["annotations"]["faultline.io/faults"] == fault(name).id
    for key in HOLD_ANNOTATIONS:  # other systems (Karpenter, the cluster autoscaler) leave it alone
        assert view["annotations"][key] == "true", key
    procs.wait_for("the Event", lambda: events(api, name, "FaultlineQuarantined") == 1, 5)
    procs.wait_for(
        "the record", lambda: (mongo_db["nodes"].find_one({"_id": name}) or {}).get("quarantined"), 5
    )
    held = mongo_db["nodes"].find_one({"_id": name})
    assert held["quarantined"] and held["quarantined_at"] is not None
    procs.wait_for("the claim completed", lambda: mongo_db["queue"].find_one(
        {"_id": f"quarantine/{fault(name).id}"})["quarantine"]["state"] == "done", 5)  # fmt: skip

    w.store.write_fault(fault(name, resolved=True), 2)
    procs.wait_for("release", lambda: not node_view(api, name)["cordoned"], 10)
    view = node_view(api, name)
    assert FAULT_TAINT not in view["taints"]
    assert "faultline.io/state" not in view["labels"]
    assert not any(k.startswith("faultline.io/") or k in HOLD_ANNOTATIONS for k in view["annotations"])
    assert view["labels"]["nvidia.com/gpu.present"] == "true"  # the rest untouched
    procs.wait_for("the Event", lambda: events(api, name, "FaultlineReleased") == 1, 5)
    procs.wait_for("the record", lambda: mongo_db["nodes"].find_one({"_id": name})["quarantined"] is False, 5)

    w.store.write_fault(fault(name), 3)  # the same GPU faults again after its recovery
    procs.wait_for("quarantined again", lambda: node_view(api, name)["cordoned"], 5)
    procs.wait_for("a second Event", lambda: events(api, name, "FaultlineQuarantined") == 2, 5)
    # two episodes for reports: the first from cordon to release, the second still open
    first, second = sorted(mongo_db["episodes"].find({"node": name}), key=lambda e: e["quarantined_at"])
    assert (
        first["quarantined_at"] == held["quarantined_at"] and first["released_at"] > first["quarantined_at"]
    )
    assert (first["codes"], first["faults"]) == (["XID-79"], [fault(name).id])
    assert second.get("released_at") is None and second["quarantined_at"] > first["released_at"]
    assert w.state.held_for._sum.get() > 0  # the release's hold duration observed (a metric)


def test_an_operators_cordon_and_taints_stay(running: Any, nodes: Any, api: Any) -> None:
    (name,) = nodes(1)
    operator = {"key": "ops.example.com/maintenance", "value": "disk", "effect": "NoSchedule"}
    kube.core(api).patch_node(name, {"spec": {"unschedulable": True, "taints": [operator]}})
    w = running()
    w.store.write_fault(fault(name), 1)
    procs.wait_for("faultline's taint", lambda: FAULT_TAINT in node_view(api, name)["taints"], 5)
    w.store.write_fault(fault(name, resolved=True), 2)
    procs.wait_for("faultline's taint gone", lambda: FAULT_TAINT not in node_view(api, name)["taints"], 10)
    view = node_view(api, name)
    assert view["cordoned"]  # the operator's cordon
    assert view["taints"] == [("ops.example.com/maintenance", "disk", "NoSchedule")]


def test_opt_out_dry_run_non_fatal_and_stale_faults_change_nothing(
    running: Any, nodes: Any, mongo_db: Any, api: Any
) -> None:
    opted, dry, mild, old = nodes(4)
    kube.core(api).patch_node(opted, {"metadata": {"labels": {"faultline.io/managed": "false"}}})
    before = {n: node_view(api, n) for n in (opted, mild, old)}
    w = running()
    w.store.write_fault(fault(opted), 1)
    w.store.write_fault(fault(mild, "XID-13", fatal=False), 1)
    w.store.write_fault(fault(old, last_seen=dt.datetime.now(dt.UTC) - dt.timedelta(hours=3)), 1)
    procs.wait_for("three claims done", lambda: mongo_db["queue"].count_documents(
        {"quarantine.state": {"$in": ["done", "stale"]}}) == 3, 5)  # fmt: skip
    assert (
        mongo_db["queue"].find_one({"_id": f"quarantine/{fault(old).id}"})["quarantine"]["state"] == "stale"
    )
    dry_worker = running(dry_run=True)
    w.halt()
    dry_worker.store.write_fault(fault(dry), 1)
    procs.wait_for(
        "dry-run record", lambda: mongo_db["nodes"].find_one({"_id": f"dry-run:{dry}"}) is not None, 5
    )
    assert "cordoned" in mongo_db["nodes"].find_one({"_id": f"dry-run:{dry}"})["would"]
    assert not node_view(api, dry)["cordoned"]
    for n, view in before.items():
        assert node_view(api, n)["taints"] == view["taints"] and not node_view(api, n)["cordoned"], n
    assert events(api, opted, "FaultlineQuarantined") == 0


def test_a_do_not_disrupt_someone_else_set_stays_after_release(running: Any, nodes: Any, api: Any) -> None:
    (name,) = nodes(1)
    kube.nodes.patch(api, name, {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}})
    w = running()
    w.store.write_fault(fault(name), 1)
    procs.wait_for("cordon", lambda: node_view(api, name)["cordoned"], 5)
    record = json.loads(node_view(api, name)["annotations"]["faultline.io/quarantine"])
    assert record["annotations"] == ["cluster-autoscaler.kubernetes.io/scale-down-disabled"]  # not theirs
    w.store.write_fault(fault(name, resolved=True), 2)
    procs.wait_for("release", lambda: not node_view(api, name)["cordoned"], 10)
    kept = node_view(api, name)["annotations"]
    assert kept.get("karpenter.sh/do-not-disrupt") == "true"
    assert "cluster-autoscaler.kubernetes.io/scale-down-disabled" not in kept


def breaker_doc(mongo_db: Any) -> dict[str, Any]:
    return mongo_db["nodes"].find_one({"_id": "breaker:quarantine"}) or {}


def blocked_looks(w: quarantine.QuarantineWorker) -> float:
    """How often the worker has held a node back (each resync pass looks at every blocked node)."""
    return float(w.metrics.actions.labels(result="blocked")._value.get())


def faultline(mongo: Any, mongo_db: Any, *args: str) -> str:
    """A `faultline` command against the test's database, as a person runs it."""
    from typer.testing import CliRunner  # noqa: PLC0415

    from cli import app  # noqa: PLC0415

    got = CliRunner().invoke(app.app, [*args, "--mongodb-uri", mongo.uri, "--database", mongo_db.name])
    assert got.exit_code == 0, got.output
    return got.output


def reset_breaker(mongo: Any, mongo_db: Any, why: str) -> str:
    """`faultline breaker reset`."""
    return faultline(mongo, mongo_db, "breaker", "reset", "--reason", why, "--by", "alice")


def test_breaker_trips_in_a_storm_stays_tripped_and_never_blocks_release(
    running: Any, nodes: Any, mongo: Any, mongo_db: Any, api: Any
) -> None:
    storm = nodes(4)
    cfg = breaker.BreakerConfig(window=dt.timedelta(minutes=10), max_share=None, max_count=2)
    w = running(breaker=cfg, threads=1)
    for name in storm:
        w.store.write_fault(fault(name), 1)
    procs.wait_for("breaker open", lambda: breaker_doc(mongo_db).get("state") == "open", 10)
    held = [n for n in storm if node_view(api, n)["cordoned"]]
    assert len(held) == 2
    blocked = [n for n in storm if n not in held]
    procs.wait_for("the others held back", lambda: all(
        mongo_db["queue"].find_one({"_id": f"quarantine/{fault(n).id}"})["quarantine"]["state"] == "blocked"
        for n in blocked
    ), 5)  # fmt: skip
    assert not any(node_view(api, n)["cordoned"] for n in blocked)
    w.store.write_fault(fault(held[0], resolved=True), 2)  # recovery goes ahead while it is open
    procs.wait_for("release while open", lambda: not node_view(api, held[0])["cordoned"], 10)
    # latched: many resync passes later (well past the old 3 s cool-down of this test) nothing new
    looks = blocked_looks(w)
    procs.wait_for("20 more resync looks", lambda: blocked_looks(w) >= looks + 20 * len(blocked), 30)
    assert breaker_doc(mongo_db)["state"] == "open"
    assert not any(node_view(api, n)["cordoned"] for n in blocked)
    out = faultline(mongo, mongo_db, "breaker", "status")
    assert "circuit breaker: open since" in out and "until a person runs `faultline breaker reset" in out
    out = reset_breaker(mongo, mongo_db, "storm understood")
    assert "reset (was open) by alice: storm understood" in out
    procs.wait_for("after the reset the held-back nodes go ahead", lambda: all(
        node_view(api, n)["cordoned"] for n in blocked), 15)  # fmt: skip
    doc = breaker_doc(mongo_db)
    assert (doc["state"], doc["reset_by"], doc["reset_reason"]) == ("closed", "alice", "storm understood")
    out = faultline(mongo, mongo_db, "status")
    assert "circuit breaker: closed since" in out and "by alice: storm understood" in out


@pytest.mark.redteam
def test_a_sustained_storm_over_the_fleet_is_capped_until_a_person_resets(
    running: Any, nodes: Any, mongo: Any, mongo_db: Any, api: Any
) -> None:
    """Every node of a 40-node fleet faults and keeps faulting; with the cap at 5 nodes held at once no more
    than 5 are ever cordoned, over many resync rounds and releases, until a person resets the breaker; then
    5 more are taken and it trips again at the cap."""
    fleet = nodes(40)
    cap = breaker.BreakerConfig(window=dt.timedelta(minutes=10), max_share=None, max_count=None, max_held=5)
    w = running(breaker=cap)
    for name in fleet:
        w.store.write_fault(fault(name), 1)
    seen_max = 0

    def cordoned() -> set[str]:
        nonlocal seen_max
        got = {n for n in fleet if node_view(api, n)["cordoned"]}
        seen_max = max(seen_max, len(got))
        assert len(got) <= 5, sorted(got)
        return got

    procs.wait_for("the breaker trips at the cap", lambda: breaker_doc(mongo_db).get("state") == "open", 20)
    first = cordoned()
    assert len(first) == 5 and "cap 5" in breaker_doc(mongo_db)["reason"]
    looks = blocked_looks(w)  # the storm goes on: the faults are seen again, resync passes come and go
    for count in range(2, 5):
        for name in fleet:
            if name not in first:
                w.store.write_fault(fault(name), count)
        cordoned()
    procs.wait_for(
        "many resync rounds", lambda: bool(cordoned() or True) and blocked_looks(w) >= looks + 35 * 5, 60
    )
    assert cordoned() == first
    for name in first:  # the first five are repaired: released even while tripped
        w.store.write_fault(fault(name, resolved=True), 5)
    procs.wait_for("released while tripped", lambda: not cordoned(), 15)
    looks = blocked_looks(w)
    procs.wait_for(
        "more resync rounds", lambda: bool(cordoned() or True) and blocked_looks(w) >= looks + 35 * 5, 60
    )
    assert not cordoned() and breaker_doc(mongo_db)["state"] == "open"  # latched, with nothing held
    reset_breaker(mongo, mongo_db, "bad pack rolled back")
    procs.wait_for("5 more taken after the reset", lambda: len(cordoned()) == 5, 20)
    procs.wait_for("tripped again at the cap", lambda: breaker_doc(mongo_db).get("state") == "open", 10)
    looks = blocked_looks(w)
    procs.wait_for(
        "and it holds", lambda: bool(cordoned() or True) and blocked_looks(w) >= looks + 30 * 5, 60
    )
    assert len(cordoned()) == 5 and seen_max == 5 and not (cordoned() & first)


@pytest.mark.redteam
def test_a_replica_that_had_not_seen_a_reset_cannot_undo_it(
    nodes: Any, mongo: Any, mongo_db: Any, api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica's view of the breaker is up to a second old (a minute here, to see it every time). One that counted a quarantine, then missed a
    person's reset, would trip on its stale count and store "open" over the reset; its change is made only
    from the revision it read, so it reads the reset and decides again: the next node is admitted and the
    person's reset stands. Trips still land (from the revision read)."""
    first, second = nodes(2)
    monkeypatch.setattr(quarantine, "BREAKER_REFRESH_S", 60.0)
    w = worker(mongo_db, api, breaker=breaker.BreakerConfig(max_share=None, max_count=1))  # not started
    assert w._admit(first, dt.datetime.now(dt.UTC))  # its view: one quarantine in the window
    reset_breaker(mongo, mongo_db, "storm understood")
    revision = breaker_doc(mongo_db)["revision"]
    # on the stale count this trips; the reset is read instead, and counts from then
    now = dt.datetime.now(dt.UTC)
    assert w._admit(second, now)
    doc = breaker_doc(mongo_db)
    assert (doc["state"], doc["reset_by"], doc["revision"]) == ("closed", "alice", revision)
    # a third node past the limit since the reset: a real trip, stored from the revision read
    assert not w._admit("third", now + dt.timedelta(milliseconds=1))
    doc = breaker_doc(mongo_db)
    assert (doc["state"], doc["revision"]) == ("open", revision + 1) and "limit 1" in doc["reason"]


def test_breaker_changes_are_made_only_from_the_revision_read(mongo_db: Any) -> None:
    st = store.Store(mongo_db)
    assert st.breaker().revision == 0
    assert st.save_breaker("open", None, "trip", revision=0)  # no document yet: created
    assert not st.save_breaker("open", None, "again", revision=0)  # another replica's, from 0 too
    assert st.breaker().revision == 1 and st.breaker().reason == "trip"
    st.reset_breaker("closed", dt.datetime.now(dt.UTC), "reset", by="alice", why="done")
    assert not st.save_breaker("open", None, "stale", revision=1)
    got = st.breaker()
    assert (got.state, got.revision, got.reset_by) == ("closed", 2, "alice")
    assert st.save_breaker("open", None, "fresh", revision=2)
    assert (st.breaker().state, st.breaker().revision) == ("open", 3)
    mongo_db["nodes"].replace_one({"_id": "breaker:quarantine"}, {"state": "open"})  # an older version's
    assert st.breaker().revision == 0 and st.save_breaker("closed", None, "legacy", revision=0)


def test_two_replicas_never_double_act(running: Any, nodes: Any, mongo_db: Any, api: Any) -> None:
    names = nodes(6)
    unlimited = breaker.BreakerConfig(max_share=None, max_count=None)
    first, second = running(breaker=unlimited), running(breaker=unlimited)
    for name in names:
        first.store.write_fault(fault(name), 1)
        first.store.write_fault(fault(name, "XID-48"), 1)  # two faults per node: two claims, one node
    procs.wait_for("all cordoned", lambda: all(node_view(api, n)["cordoned"] for n in names), 10)
    procs.wait_for(
        "claims done", lambda: mongo_db["queue"].count_documents({"quarantine.state": "done"}) == 12, 10
    )
    for name in names:  # one new quarantine each (a second fault may still update its taint's value)
        assert events(api, name, "FaultlineQuarantined") == 1, name
    claims = first.metrics.claims._value.get() + second.metrics.claims._value.get()
    assert claims == 12  # each fault claimed exactly once across the replicas


# -- operator overrides (workers.overrides) -------------------------------------------------------------
def _as_operator(cluster: LocalCluster) -> Any:
    """An API client that writes as `kubectl` does (its field manager is its user agent)."""
    api = kube.api_client(cluster.kubeconfig)
    api.user_agent = "kubectl/v1.37.2 (linux/amd64) kubernetes/test"
    return api


def test_an_operators_uncordon_cancels_the_quarantine_until_a_new_fault(
    cluster: LocalCluster, nodes: Any, mongo_db: Any, api: Any
) -> None:
    (name,) = nodes(1)
    w = worker(mongo_db, api)
    w.store.write_fault(fault(name), 1)
    assert w.reconcile(name) == "quarantined" and node_view(api, name)["cordoned"]

    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    kube.nodes.patch(_as_operator(cluster), name, {"spec": {"unschedulable": None}})  # `kubectl uncordon`
    assert w.reconcile(name) == "cancelled"
    view = node_view(api, name)
    assert not view["cordoned"] and FAULT_TAINT not in view["taints"]  # faultline's taint goes with it
    record = json.loads(view["annotations"][overrides.CANCELLED_ANNOTATION])
    assert record["faults"] == [fault(name).id]
    # an uncordon removes the field, and its manager with it: the API cannot say who; when faultline saw it
    assert record["by"] == "unknown" and dt.datetime.fromisoformat(record["at"]) >= before
    assert events(api, name, "FaultlineQuarantineCancelled") == 1
    assert not mongo_db["nodes"].find_one({"_id": name})["quarantined"]  # the drainer stops

    w.store.write_fault(fault(name).model_copy(update={"count": 5}), 2)  # the same fault again
    w.resync()
    assert w.reconcile(name) == "unchanged" and not node_view(api, name)["cordoned"]

    other = fault(name, "XID-48")  # a new fault quarantines again
    w.store.write_fault(other, 3)
    assert w.reconcile(name) == "quarantined"
    view = node_view(api, name)
    assert view["cordoned"] and ("faultline.io/fault", "XID-48", "NoSchedule") in view["taints"]
    assert view["annotations"][rules.FAULTS_ANNOTATION] == other.id  # the cancelled one is not behind it

    w.store.write_fault(fault(name, resolved=True), 4)  # the cancelled fault resolves: its record goes
    w.reconcile(name)
    assert overrides.CANCELLED_ANNOTATION not in node_view(api, name)["annotations"]


def test_removing_faultlines_taint_also_cancels(
    cluster: LocalCluster, nodes: Any, mongo_db: Any, api: Any
) -> None:
    (name,) = nodes(1)
    w = worker(mongo_db, api)
    w.store.write_fault(fault(name), 1)
    w.reconcile(name)
    obj = kube.nodes.read(api, name)
    mine = {"key": "ops.example.com/gpu-check", "value": "manual", "effect": "NoSchedule"}
    kept = [t for t in obj["spec"]["taints"] if t["key"] != "faultline.io/fault"]
    kube.nodes.patch(_as_operator(cluster), name, {"spec": {"taints": [*kept, mine]}})  # kubectl edit
    assert w.reconcile(name) == "cancelled"
    view = node_view(api, name)
    assert not view["cordoned"]  # the cordon was faultline's: it goes too
    assert ("ops.example.com/gpu-check", "manual", "NoSchedule") in view["taints"]
    record = json.loads(view["annotations"][overrides.CANCELLED_ANNOTATION])
    assert record["by"] == "kubectl" and record["at"]  # the API kept who wrote the taints


def test_a_pause_takes_back_faultlines_marks_until_it_ends(nodes: Any, mongo_db: Any, api: Any) -> None:
    (name,) = nodes(1)
    w = worker(mongo_db, api)
    w.store.write_fault(fault(name), 1)
    w.reconcile(name)
    until = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.nodes.patch(api, name, {"metadata": {"annotations": {overrides.PAUSE_ANNOTATION: until}}})
    assert w.reconcile(name) == "paused"
    view = node_view(api, name)
    assert not view["cordoned"] and FAULT_TAINT not in view["taints"]
    assert events(api, name, "FaultlinePaused") == 1
    item = mongo_db["queue"].find_one({"_id": f"quarantine/{fault(name).id}"})
    assert item["quarantine"]["state"] == "paused"  # the resync pass looks at the node again
    assert w.reconcile(name) == "paused" and events(api, name, "FaultlinePaused") == 1  # said once

    kube.nodes.patch(
        api, name, {"metadata": {"annotations": {overrides.PAUSE_ANNOTATION: "2020-01-01T00:00:00Z"}}}
    )
    w.resync()  # the pause is over: the open fault quarantines the node again
    assert node_view(api, name)["cordoned"]
    item = mongo_db["queue"].find_one({"_id": f"quarantine/{fault(name).id}"})
    assert item["quarantine"]["state"] == "done"

    kube.nodes.patch(api, name, {"metadata": {"annotations": {overrides.PAUSE_ANNOTATION: "tomorrow"}}})
    assert w.reconcile(name) == "unchanged" and node_view(api, name)["cordoned"]  # not a time: not paused
    got = kube.core(api).list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    bad = [e for e in got if e.reason == "FaultlineBadAnnotation"]
    assert (
        bad and bad[0].type == "Warning" and "faultline.io/paused-until='tomorrow'" in (bad[0].message or "")
    )


def test_the_force_label_quarantines_without_a_fault_and_its_removal_releases(
    nodes: Any, mongo_db: Any, api: Any
) -> None:
    (name,) = nodes(1)
    w = worker(mongo_db, api)
    kube.nodes.patch(api, name, {"metadata": {"labels": {overrides.FORCE_LABEL: "disk-check"}}})
    w.resync()  # no fault, no claim: the resync pass finds the label
    view = node_view(api, name)
    assert view["cordoned"] and overrides.MANUAL_TAINT in view["taints"]
    assert view["annotations"][rules.FAULTS_ANNOTATION] == overrides.MANUAL_FAULT
    assert mongo_db["nodes"].find_one({"_id": name})["quarantined"]  # the drainer empties it
    got = kube.core(api).list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    assert any("forced by label faultline.io/force-quarantine=disk-check" in (e.message or "") for e in got)

    kube.nodes.patch(api, name, {"spec": {"unschedulable": None}})  # an uncordon does not cancel a force
    assert w.reconcile(name) == "forced" and node_view(api, name)["cordoned"]

    kube.nodes.patch(api, name, {"metadata": {"labels": {overrides.FORCE_LABEL: None}}})
    w.resync()
    view = node_view(api, name)
    assert not view["cordoned"] and not view["taints"]
    assert not mongo_db["nodes"].find_one({"_id": name})["quarantined"]


def test_a_silent_agents_conditions_turn_unknown_and_its_next_report_sets_them_back(
    nodes: Any, mongo_db: Any, api: Any
) -> None:
    silent, alive = nodes(2)
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fresh = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, beat in ((silent, old), (alive, fresh)):
        kube.nodes.write_conditions(api, name, [
            {"type": "GpuHealthy", "status": "True", "reason": "NoFaults", "message": "no open faults",
             "lastHeartbeatTime": beat, "lastTransitionTime": beat},
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "",
             "lastHeartbeatTime": old, "lastTransitionTime": old},
        ], [])  # fmt: skip
    w = worker(mongo_db, api)
    assert silent in w.mark_silent_agents() and alive not in w.mark_silent_agents()
    got = kube.nodes.conditions(api, silent)
    assert (got["GpuHealthy"]["status"], got["GpuHealthy"]["reason"]) == ("Unknown", "AgentNotReporting")
    assert got["MemoryPressure"]["status"] == "False"  # the kubelet's own are not faultline's to judge
    assert kube.nodes.conditions(api, alive)["GpuHealthy"]["status"] == "True"
    # the agent reports again: its conditions (faultline.kube.nodes.apply_conditions, as the agent's sink)
    kube.nodes.apply_conditions(api, silent, conditions.desired([], types=["GpuHealthy"]))
    assert kube.nodes.conditions(api, silent)["GpuHealthy"]["status"] == "True"


def test_the_read_of_every_node_for_silent_agents_also_counts_the_gpu_nodes(
    mongo_db: Any, api: Any, nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes(2)
    w = worker(mongo_db, api)
    reads = []
    real = kube.nodes.list_all

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(kube.nodes, "list_all", counted)
    w.mark_silent_agents()
    assert len(reads) == 1
    want = sum(quarantine._gpus(n) > 0 for n in real(api))
    assert want >= 2
    assert w._gpu_node_count() == want and len(reads) == 1  # within gpu_count_ttl of that read: no other
    w.gpu_nodes = (w.gpu_nodes[0] - w.settings.gpu_count_ttl.total_seconds() - 1, w.gpu_nodes[1])
    assert w._gpu_node_count() == want and len(reads) == 2  # past it: read again


def test_a_reconcile_holding_an_older_read_of_the_faults_reads_them_again(
    mongo_db: Any, api: Any, nodes: Any
) -> None:
    """Found by the chaos suite on a slow store: a claim's thread that waited for the node's lock with the
    faults as read before another thread released the node must not cordon it again from that read."""
    (name,) = nodes(1)
    w = worker(mongo_db, api, hold_down=dt.timedelta(0))
    w.store.write_fault(fault(name), 1)
    assert w.reconcile(name) == "quarantined" and node_view(api, name)["cordoned"]
    read_at = time.monotonic()
    stale = w.store.faults_of({name}, quarantine.STAGE)[name]  # the fault open
    w.store.write_fault(fault(name, resolved=True), 2)
    assert w.reconcile(name) == "released" and not node_view(api, name)["cordoned"]
    assert w.reconcile(name, docs=stale, read_at=read_at) == "unchanged"  # read again: resolved
    assert not node_view(api, name)["cordoned"]
    fresh_at = time.monotonic()  # a read after the last reconcile is used as it is
    assert w.reconcile(name, docs=stale, read_at=fresh_at) == "quarantined"


def test_a_claim_handled_while_the_faults_are_read_again_keeps_the_time_of_the_read_it_uses(
    mongo_db: Any, api: Any, nodes: Any
) -> None:
    """Found by the chaos suite's store outage on a loaded machine: a claim handled while another thread
    read the candidates' faults again took the new read's time with the documents of the read before, so
    a node released since that older read was cordoned again from it."""
    (name,) = nodes(1)
    w = worker(mongo_db, api, hold_down=dt.timedelta(0))
    w.store.write_fault(fault(name), 1)
    w.store.write_fault(fault(name, "XID-13", fatal=False), 1)  # a minor fault: its item is claimed below
    assert w.reconcile(name) == "quarantined"
    w._prefetch([{"node": name}])  # the older read: the fatal fault open
    w.store.write_fault(fault(name, resolved=True), 2)
    assert w.reconcile(name) == "released" and not node_view(api, name)["cordoned"]

    reading, finish = threading.Event(), threading.Event()
    faults_of = w.store.faults_of

    def slow_faults_of(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "prefetch":  # the new read, held until the claim is handled
            reading.set()
            assert finish.wait(30)
        return faults_of(*args, **kwargs)

    w.store.faults_of = slow_faults_of  # type: ignore[method-assign]
    reader = threading.Thread(target=w._prefetch, args=([{"node": name}],), name="prefetch")
    reader.start()
    try:
        assert reading.wait(30)
        doc = next(d for d in w.store.pending(quarantine.STAGE, 10, collection=store.Work.QUEUE)
                   if d["key"] == fault(name, "XID-13").id)  # fmt: skip
        claim = w.store.try_claim(quarantine.STAGE, doc, w.owner, dt.timedelta(seconds=30),
                                  collection=store.Work.QUEUE)  # fmt: skip
        assert claim is not None
        w._handle(claim)
        assert not node_view(api, name)["cordoned"]  # the fault read again: resolved
    finally:
        finish.set()
        reader.join()
