"""The store against a real wire-protocol server (FerretDB): idempotent event and fault writes, claims
with leases and fencing, the reaper and retention."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pymongo
import pymongo.errors
import pytest

from devtools import procs
from devtools.mongo import LocalMongo
from faultline import store
from faultline.errors import ConfigError, LeaseLostError
from faultline.models import (
    Action,
    Component,
    Entity,
    Fault,
    FaultState,
    HealthEvent,
    event_id,
    fault_id,
)
from workers import common

pytestmark = pytest.mark.integration
T0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)
STAGE, QUEUE = store.Stage.QUARANTINE, store.Work.QUEUE


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


def fault(
    node: str = "n1", code: str = "XID-79", count: int = 1, *, resolved: bool = False, minute: int = 0
) -> Fault:
    seen = T0 + dt.timedelta(minutes=minute)
    return Fault(
        id=fault_id(node, "GPU", "0000:3b:00", code), node=node, entity=Entity(type="GPU", id="0000:3b:00"),
        code=code, component=Component.GPU, count=count, first_seen=T0, last_seen=seen, fatal=True,
        action=Action.RESTART_BM, state=FaultState.RESOLVED if resolved else FaultState.OPEN,
        resolved_at=seen if resolved else None,
    )  # fmt: skip


def event(i: int) -> HealthEvent:
    ts = T0 + dt.timedelta(seconds=i)
    return HealthEvent(
        id=event_id("n1", "kmsg", "GPU", "0000:3b:00", "XID-79", ts), node="n1", component=Component.GPU,
        check="xid", code="XID-79", entities=(Entity(type="GPU", id="0000:3b:00"),), healthy=False, fatal=True,
        action=Action.RESTART_BM, generated_at=ts, observed_at=ts,
    )  # fmt: skip


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest) -> Any:
    """FerretDB on each of its storage backends: the claims' guarantees must not depend on one."""
    return request.getfixturevalue("mongo" if request.param == "sqlite" else "mongo_pg")


@pytest.fixture
def st(server: Any) -> Iterator[store.Store]:
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(server.uri, serverSelectionTimeoutMS=10_000)
    name = f"t_{uuid.uuid4().hex[:12]}"
    s = store.Store(client[name], clock=Clock())
    s.ensure_indexes()
    yield s
    client.drop_database(name)
    client.close()


def test_events_are_recorded_once(st: store.Store) -> None:
    assert st.record_events([event(1), event(2)]) == 2
    assert st.record_events([event(2), event(3), event(1)]) == 1  # a replay after a crash
    assert st.events.count_documents({}) == 3
    doc = st.events.find_one({"_id": event(3).id})
    assert doc["code"] == "XID-79" and doc["entities"] == [{"type": "GPU", "id": "0000:3b:00"}]


def test_fault_writes_apply_in_revision_order_only(st: store.Store) -> None:
    assert st.write_fault(fault(count=1), revision=1)
    assert st.write_fault(fault(count=5, minute=3), revision=3)
    assert not st.write_fault(fault(count=2, minute=1), revision=2)  # late, older view: ignored
    assert not st.write_fault(fault(count=5, minute=3), revision=3)  # replayed: ignored
    doc = st.faults.find_one({"_id": fault().id})
    assert (doc["count"], doc["revision"], doc["state"]) == (5, 3, "open")
    assert doc["last_seen"] == T0 + dt.timedelta(minutes=3)  # the store reads dates as aware UTC
    assert st.write_fault(fault(count=5, minute=4, resolved=True), revision=4)
    doc = st.faults.find_one({"_id": fault().id})
    assert doc["state"] == "resolved" and "quarantine" not in doc  # work items live in `queue`
    assert st.queue.find_one({"_id": f"quarantine/{fault().id}"}) is None  # resolved: no work left


def test_a_fault_that_comes_back_gets_a_new_work_item(st: store.Store) -> None:
    item = f"quarantine/{fault().id}"
    st.write_fault(fault(), revision=1)
    claim = st.claim(STAGE, "w1", dt.timedelta(minutes=5), collection=QUEUE)
    assert claim is not None
    st.complete(claim)
    st.write_fault(fault(minute=2, resolved=True), revision=2)
    assert st.queue.find_one({"_id": item}) is None
    st.write_fault(fault(minute=1, resolved=True), revision=1)  # an old write replayed: nothing changes
    clock = st.clock
    assert isinstance(clock, Clock)
    clock.now += dt.timedelta(minutes=5)
    st.write_fault(fault(count=2, minute=5), revision=3)  # the same GPU faults again
    assert st.queue.find_one({"_id": item})["quarantine"]["state"] == "pending"
    again = st.claim(STAGE, "w1", dt.timedelta(minutes=5), collection=QUEUE)
    assert again is not None and again.id == item  # numbered past the first item's leases
    st.complete(again, store.State.PENDING)
    st.write_fault(fault(minute=2, resolved=True), revision=2)  # a late replay of the old resolution
    assert st.queue.find_one({"_id": item})["quarantine"]["state"] == "pending"  # kept: the fault is open


def test_an_item_read_before_its_fault_resolved_cannot_be_claimed(st: store.Store) -> None:
    st.write_fault(fault("n1"), revision=1)
    st.write_fault(fault("n2"), revision=1)
    read = st.pending(STAGE, 10, collection=QUEUE)  # a worker's list of candidates
    st.write_fault(fault("n1", minute=1, resolved=True), revision=2)  # n1's item goes meanwhile
    lease = dt.timedelta(minutes=5)
    gone, still = sorted(read, key=lambda d: d["node"])
    assert st.try_claim(STAGE, gone, "w1", lease, collection=QUEUE) is None
    claim = st.try_claim(STAGE, still, "w1", lease, collection=QUEUE)
    assert claim is not None and claim.doc["node"] == "n2"
    assert st.queue.find_one({"_id": gone["_id"]}) is None  # the failed claim made nothing back


def test_updates_keep_stage_progress(st: store.Store) -> None:
    st.write_fault(fault(), revision=1)
    claim = st.claim(STAGE, "w1", dt.timedelta(minutes=5), collection=QUEUE)
    assert claim is not None and claim.id == f"quarantine/{fault().id}"
    st.complete(claim)
    st.write_fault(fault(count=2), revision=2)
    st.write_fault(fault(count=2), revision=2)  # a replay: no second item
    assert st.queue.find_one({"_id": claim.id})["quarantine"]["state"] == "done"
    assert st.queue.count_documents({}) == 1


def test_claims_take_the_oldest_and_are_fenced(st: store.Store) -> None:
    st.write_fault(fault("n2", minute=2), revision=1)
    st.write_fault(fault("n1", minute=1), revision=1)
    first = st.claim(STAGE, "w1", dt.timedelta(minutes=5), collection=QUEUE)
    second = st.claim(STAGE, "w2", dt.timedelta(minutes=5), collection=QUEUE)
    assert first is not None and second is not None
    assert {first.id, second.id} == {f"quarantine/{fault(n).id}" for n in ("n1", "n2")}
    assert st.claim(STAGE, "w3", dt.timedelta(minutes=5), collection=QUEUE) is None
    st.renew(first, dt.timedelta(minutes=10))
    st.complete(first)
    with pytest.raises(LeaseLostError):
        st.complete(first)  # completing twice: the second finds its number taken
    doc = st.queue.find_one({"_id": first.id})
    assert (doc["quarantine"]["state"], doc["quarantine"]["attempts"]) == ("done", 1)


def test_claim_filters_by_equality(st: store.Store) -> None:
    st.write_fault(fault("n1"), revision=1)
    assert st.claim(STAGE, "w1", dt.timedelta(minutes=1), {"node": "n2"}, collection=QUEUE) is None
    assert st.claim(STAGE, "w1", dt.timedelta(minutes=1), {"node": "n1"}, collection=QUEUE) is not None


def test_concurrent_claimers_never_share_a_fault(st: store.Store, server: Any) -> None:
    for i in range(40):
        st.write_fault(fault(f"n{i:02d}"), revision=1)
    taken: list[str] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        client: pymongo.MongoClient[Any] = pymongo.MongoClient(server.uri)  # one connection pool each
        mine = store.Store(client[st.db.name], clock=st.clock)
        while (c := mine.claim(STAGE, name, dt.timedelta(minutes=5), collection=QUEUE)) is not None:
            with lock:
                taken.append(c.id)
        client.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(taken) == 40
    assert len(set(taken)) == 40


def test_a_halted_claim_loop_records_the_claim_in_hand_before_it_returns(st: store.Store) -> None:
    """Stopping a worker waits for the item being handled to be recorded: nothing writes to the store
    after its owner closes it (and the item is not left claimed until its lease runs out)."""
    st.write_fault(fault("n0"), revision=1)
    entered, release = threading.Event(), threading.Event()

    def handle(claim: store.Claim) -> store.State:
        entered.set()
        release.wait(10)
        return store.State.DONE

    loop = common.ClaimLoop(st, STAGE, "w0", handle, lease=dt.timedelta(minutes=1), threads=2,
                            metrics=common.WorkerMetrics("halt_test"), collection=QUEUE)  # fmt: skip
    loop.start()
    assert entered.wait(10)
    threading.Timer(0.3, release.set).start()
    assert loop.halt(10)
    assert st.queue.find_one({"node": "n0"})["quarantine"]["state"] == store.State.DONE
    assert not any(t.is_alive() for t in loop.running)


def test_a_claimer_outlives_a_failed_completion_and_the_item_is_redone(st: store.Store) -> None:
    """The store unreachable as a claim is recorded: the claimer thread lives on, and the item is
    reaped once its lease runs out and handled again."""

    class Flaky(store.Store):
        failures = 1

        def complete(self, *args: Any, **kwargs: Any) -> None:
            if self.failures:
                self.failures -= 1
                raise pymongo.errors.AutoReconnect("connection reset (test)")
            super().complete(*args, **kwargs)

    flaky = Flaky(st.db, clock=st.clock)
    handled: list[str] = []
    loop = common.ClaimLoop(flaky, STAGE, "w0", lambda c: handled.append(c.id) or store.State.DONE,
                            lease=dt.timedelta(minutes=1), threads=1, every=0.1,
                            metrics=common.WorkerMetrics("flaky_test"), collection=QUEUE)  # fmt: skip
    st.write_fault(fault("n0"), revision=1)
    loop.start()
    try:
        procs.wait_for("the failed completion", lambda: flaky.failures == 0 and len(handled) == 1, 10)
        assert st.queue.find_one({"node": "n0"})["quarantine"]["state"] == store.State.CLAIMED
        st.clock.now += dt.timedelta(minutes=2)  # type: ignore[attr-defined]  # the lease runs out
        procs.wait_for("redone", lambda: st.queue.find_one({"node": "n0"})["quarantine"]["state"] == store.State.DONE,
                       10)  # fmt: skip
    finally:
        assert loop.halt(10)
    assert len(handled) == 2 and handled[0] == handled[1]


def test_reaper_requeues_expired_claims_and_parks_repeat_offenders(st: store.Store) -> None:
    clock = st.clock
    assert isinstance(clock, Clock)
    st.write_fault(fault("n1"), revision=1)
    st.write_fault(fault("n2"), revision=1)
    a = st.claim(STAGE, "w1", dt.timedelta(minutes=1), collection=QUEUE)
    assert a is not None
    clock.now += dt.timedelta(minutes=2)
    assert st.reap(STAGE, max_attempts=3, collection=QUEUE) == (1, 0)
    with pytest.raises(LeaseLostError):
        st.renew(a, dt.timedelta(minutes=1))  # the lease expired and was taken back
    with pytest.raises(LeaseLostError):
        st.complete(a)
    for _ in range(2):
        c = st.claim(STAGE, "w2", dt.timedelta(minutes=1), collection=QUEUE)
        assert c is not None and c.id == a.id
        clock.now += dt.timedelta(minutes=2)
        st.reap(STAGE, max_attempts=3, collection=QUEUE)
    doc = st.queue.find_one({"_id": a.id})
    assert (doc["quarantine"]["state"], doc["quarantine"]["attempts"]) == ("parked", 3)


def test_retention_deletes_old_events(st: store.Store) -> None:
    st.record_events([event(i) for i in range(5)])
    clock = st.clock
    assert isinstance(clock, Clock)
    clock.now = T0 + dt.timedelta(days=8, seconds=2)
    assert st.prune_events(dt.timedelta(days=8)) == 2  # events 0 and 1 are older than the cutoff
    assert st.events.count_documents({}) == 3


def test_retention_command_prunes_by_age_and_refuses_nonsense(mongo_db: Any, mongo: Any) -> None:
    """`faultline store retention`, as the periodic job runs it, against the real server."""
    now = dt.datetime.now(dt.UTC)
    st = store.Store(mongo_db)
    st.ensure_indexes()
    old = [
        event(i).model_copy(update={"generated_at": now - dt.timedelta(days=20, minutes=i)}) for i in range(3)
    ]
    new = [event(10 + i).model_copy(update={"generated_at": now - dt.timedelta(hours=i)}) for i in range(2)]
    st.record_events(old + new)
    st.feed_writers.insert_one({"_id": "n1", "n": 2})  # the analyzer's feed: one old document, one new
    st.feed.insert_many([{"_id": "n1/000000000000000001", "writer": "n1", "n": 1, "at": now - dt.timedelta(days=20)},
                         {"_id": "n1/000000000000000002", "writer": "n1", "n": 2, "at": now}])  # fmt: skip
    st.keep_bug_report("n1", "old.log.gz", b"old", now - dt.timedelta(days=100))
    st.keep_bug_report("n1", "new.log.gz", b"new", now - dt.timedelta(days=10))
    base = [sys.executable, "-m", "faultline", "store", "retention", "--mongodb-uri", mongo.uri,
            "--database", mongo_db.name]  # fmt: skip
    done = subprocess.run(
        [*base, "--older-than", "14d"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "deleted 3 health events older than 14d", "deleted 1 feed documents older than 14d",
        "deleted 1 bug reports collected more than 90d ago",
    ]  # fmt: skip
    assert st.events.count_documents({}) == 2
    assert [r["name"] for r in st.bug_reports("n1")] == ["new.log.gz"]
    assert [d["n"] for d in st.feed.find({})] == [2]
    bad = subprocess.run(
        [*base, "--older-than", "soon"], check=False, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "--older-than" in bad.stderr
    assert st.events.count_documents({}) == 2


def test_local_server_refuses_an_unknown_backend() -> None:
    with pytest.raises(ConfigError, match=r"unknown FerretDB backend 'mysql' \(one of sqlite, postgresql\)"):
        LocalMongo(backend="mysql")


def test_a_store_whose_postgresql_is_not_up_yet_is_transient_and_a_duplicate_is_not(
    mongo: LocalMongo, tmp_path: Any
) -> None:
    """The chart's embedded store starting: FerretDB answers before its PostgreSQL does, with an
    InternalError (not a connection failure). That is the store not ready (TransientError: workers wait,
    the agent spools); a real error such as a duplicate key still passes through."""
    from devtools import tools  # noqa: PLC0415
    from faultline.errors import TransientError  # noqa: PLC0415

    port = procs.free_port()
    ferret = subprocess.Popen(
        [str(tools.binary("ferretdb")), f"--listen-addr=127.0.0.1:{port}",
         f"--postgresql-url=postgres://127.0.0.1:{procs.free_port()}/postgres"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        st = store.connect(f"mongodb://u:p@127.0.0.1:{port}/?authMechanism=PLAIN&authSource=%24external", "x",
                           timeout=5)  # fmt: skip
        procs.wait_for("FerretDB listening", lambda: _listening(port), 10)
        with (
            pytest.raises(TransientError, match=r"the store cannot serve now: .*failed to connect"),
            store.unreachable_is_transient("creating indexes"),
        ):
            st.ensure_indexes()
        st.close()
    finally:
        ferret.kill()
        ferret.wait(10)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo.uri)
    try:
        coll = client[f"t_dup_{uuid.uuid4().hex[:6]}"]["c"]
        coll.insert_one({"_id": 1})
        with pytest.raises(pymongo.errors.DuplicateKeyError), store.unreachable_is_transient("inserting"):
            coll.insert_one({"_id": 1})
        client.drop_database(coll.database.name)
    finally:
        client.close()


def _listening(port: int) -> bool:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_slow_store_calls_are_logged_by_kind_at_most_once_a_while(
    mongo: LocalMongo, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call counts as slow here (threshold 0): the first of a kind is logged with the command, the
    collection and the filter's field names (never their values); the next ones of that kind only once
    `every` has passed, with how many there were and the slowest; another kind has its own line."""
    from faultline.store.connection import SlowCalls  # noqa: PLC0415

    listener = SlowCalls(slow=0.0, every=3600.0)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo.uri, event_listeners=[listener])
    db = client[f"t_slow_{uuid.uuid4().hex[:8]}"]
    try:
        with caplog.at_level("WARNING", logger="faultline.store.connection"):
            db["faults"].insert_one({"_id": "a", "node": "secret-node", "state": "open"})
            for _ in range(3):
                list(db["faults"].find({"node": "secret-node", "state": "open"}))
            db["queue"].update_one({"_id": "a"}, {"$set": {"x": 1}}, upsert=True)
        lines = [(r.command, r.collection, r.filter) for r in caplog.records if r.msg == "store call slow"]  # type: ignore[attr-defined]
        assert lines == [
            ("insert", "faults", ""),
            ("find", "faults", "node,state"),
            ("update", "queue", "_id"),
        ]
        assert "secret-node" not in caplog.text
        listener.every = 0.0  # the next call of a kind is logged again, with the ones held back
        caplog.clear()
        with caplog.at_level("WARNING", logger="faultline.store.connection"):
            list(db["faults"].find({"node": "n"}))
            list(db["faults"].find({"state": "open", "node": "n"}))
        lines = [(r.filter, r.count) for r in caplog.records if r.msg == "store call slow"]  # type: ignore[attr-defined]
        assert lines == [("node", 1), ("node,state", 3)]  # a kind of its own; the two held back and this one
    finally:
        client.drop_database(db.name)
        client.close()
