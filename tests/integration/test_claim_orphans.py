"""A worker killed between the two writes of a claim, a completion or a take-back (the lease document,
then the work document), on FerretDB: the item is taken back once that lease is dead, instead of
staying unclaimable (pending behind a number that exists) or claimed for good (the reaper's number
taken). Found by the chaos suite's remediation-kill: a repair stayed claimed by a dead worker and the
node was never repaired. And a repair's first claim orphaned (its stage had no number yet), a take-back
killed halfway, and claimers that keep trying an item nobody can claim yet."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest

from devtools import procs
from faultline import store
from faultline.store import claims
from workers import common

pytestmark = pytest.mark.integration
STAGE, LEASE = store.Stage.QUARANTINE, dt.timedelta(seconds=30)
LONG_AGO = dt.timedelta(seconds=claims.ORPHAN_S + 5)


@pytest.fixture
def st(mongo_db: Any) -> store.Store:
    s = store.Store(mongo_db)
    s.ensure_indexes()
    s.enqueue(STAGE, "k1", {"node": "n1", "first_seen": s.now(), "last_seen": s.now(), "fatal": True})
    return s


def _item(st: store.Store) -> dict[str, Any]:
    return st.queue.find_one({"_id": f"{STAGE}/k1"}) or {}


def _lease(st: store.Store, n: int, kind: str, *, until: dt.datetime | None, at: dt.datetime) -> None:
    st.leases.insert_one({"_id": f"{STAGE}/{STAGE}/k1/{n}", "fault": f"{STAGE}/k1", "stage": STAGE, "n": n,
                          "owner": "dead", "kind": kind, "until": until, "at": at})  # fmt: skip


def _claim(st: store.Store) -> store.Claim | None:
    (doc,) = st.pending(STAGE, 10, collection=store.Work.QUEUE)
    return st.try_claim(STAGE, doc, "alive", LEASE, collection=store.Work.QUEUE)


def test_a_claimer_killed_between_its_lease_and_the_item_leaves_it_claimable_once_the_lease_is_dead(
    st: store.Store,
) -> None:
    seq = int(_item(st)[STAGE]["seq"])
    now = st.now()
    _lease(st, seq + 1, "claimed", until=now + LEASE, at=now)  # alive as far as anyone can tell
    assert _claim(st) is None
    assert _item(st)[STAGE]["seq"] == seq  # a live claim is left alone
    st.leases.update_one({"_id": f"{STAGE}/{STAGE}/k1/{seq + 1}"}, {"$set": {"until": now - LEASE}})
    assert _claim(st) is None  # this try finds the orphan and takes the item back...
    assert (_item(st)[STAGE]["state"], _item(st)[STAGE]["seq"]) == (store.State.PENDING, seq + 2)
    claim = _claim(st)  # ...and the next one claims it
    assert claim is not None and claim.n == seq + 3


def test_a_completion_killed_between_its_lease_and_the_item_is_taken_back_by_the_reaper(
    st: store.Store,
) -> None:
    claim = _claim(st)
    assert claim is not None
    old = st.now() - LONG_AGO
    _lease(st, claim.n + 1, "closed:done", until=None, at=old)  # the close, its update never made
    st.leases.update_one({"_id": f"{STAGE}/{STAGE}/k1/{claim.n}"}, {"$set": {"until": old}})  # expired
    assert st.reap(STAGE, 10, collection=store.Work.QUEUE) == (1, 0)
    item = _item(st)[STAGE]
    assert (item["state"], item["seq"]) == (store.State.PENDING, claim.n + 2)
    assert "had no second write" in item["error"]
    assert _claim(st) is not None  # redone: every stage's handler is idempotent


def test_a_recent_close_is_left_to_its_writer(st: store.Store) -> None:
    claim = _claim(st)
    assert claim is not None
    now = st.now()
    _lease(st, claim.n + 1, "closed:done", until=None, at=now)  # its second write may be on its way
    st.leases.update_one({"_id": f"{STAGE}/{STAGE}/k1/{claim.n}"}, {"$set": {"until": now - LEASE}})
    assert st.reap(STAGE, 10, collection=store.Work.QUEUE) == (0, 0)
    assert _item(st)[STAGE]["state"] == store.State.CLAIMED


def test_a_repairs_first_claim_orphaned_before_its_stage_had_a_number_is_taken_back(st: store.Store) -> None:
    """A repair's stages start without a lease number: the janitor's first claim, killed between its
    lease and the document, left the stage pending with none, which the take-back must read as 0."""
    janitor, repairs = store.Stage.JANITOR, store.Work.REPAIRS
    rid = st.open_repair("n1", st.now())
    (doc,) = st.pending(store.Stage.REMEDIATION, 10, collection=repairs)
    decided = st.try_claim(store.Stage.REMEDIATION, doc, "remediation", LEASE, collection=repairs)
    assert decided is not None
    st.complete(decided, store.Completion(then=store.HandOver.TO_JANITOR))
    assert "seq" not in st.repairs.find_one({"_id": rid})[janitor]  # as every repair's janitor stage starts
    old = st.now() - LONG_AGO
    st.leases.insert_one({"_id": f"{janitor}/{rid}/1", "fault": rid, "stage": janitor, "n": 1,
                          "owner": "janitor-1", "kind": "claimed", "until": old, "at": old})  # fmt: skip

    def claim() -> store.Claim | None:
        (pending,) = st.pending(janitor, 10, collection=repairs)
        return st.try_claim(janitor, pending, "janitor-2", LEASE, collection=repairs)

    assert claim() is None  # this try takes it back...
    stage = st.repairs.find_one({"_id": rid})[janitor]
    assert (stage["state"], stage["seq"]) == (store.State.PENDING, 2)
    assert "lease 1 (claimed) had no second write" in stage["error"]
    taken = claim()  # ...and the next one claims it (before: every try failed on lease 1, for good)
    assert taken is not None and taken.n == 3


def test_a_take_back_killed_between_its_two_writes_is_taken_back_in_turn(st: store.Store) -> None:
    """A dead claim's lease, then the take-back's own lease, both without the document's write: the
    newest of them is the one to follow."""
    seq = int(_item(st)[STAGE]["seq"])
    old = st.now() - LONG_AGO
    _lease(st, seq + 1, "claimed", until=old, at=old)
    _lease(st, seq + 2, "orphan", until=None, at=old)  # the take-back, killed before its update
    assert _claim(st) is None
    item = _item(st)[STAGE]
    assert (item["state"], item["seq"]) == (store.State.PENDING, seq + 3)
    assert "lease " + str(seq + 2) + " (orphan)" in item["error"]
    claim = _claim(st)
    assert claim is not None and claim.n == seq + 4


def test_an_item_nobody_can_claim_yet_does_not_keep_a_claimer_from_its_waiting_claims(
    st: store.Store,
) -> None:
    """k1's orphaned lease is still alive (unclaimable for up to a lease), k2 waits between two looks of
    the loop's only claimer: the claimer comes back to k2 instead of trying k1 over and over."""
    seq = int(_item(st)[STAGE]["seq"])
    now = st.now()
    _lease(st, seq + 1, "claimed", until=now + LEASE, at=now)
    st.enqueue(STAGE, "k2", {"node": "n2", "first_seen": now, "last_seen": now, "fatal": True})
    looks: list[str] = []
    done = threading.Event()

    def handle(claim: store.Claim) -> common.Outcome:
        looks.append(claim.id)
        if len(looks) == 1:
            return common.Wait(0.1)
        done.set()
        return store.State.DONE

    loop = common.ClaimLoop(st, STAGE, "alive", handle, lease=LEASE, threads=1,
                            metrics=common.WorkerMetrics("orphan_wait_test"), collection=store.Work.QUEUE)  # fmt: skip
    loop.start()
    try:
        procs.wait_for("k2's second look", done.is_set, 10)
    finally:
        assert loop.halt(10)
    assert looks == [f"{STAGE}/k2", f"{STAGE}/k2"]
    assert _item(st)[STAGE]["state"] == store.State.PENDING  # k1 left to its lease


def test_an_old_copy_of_an_item_that_moved_on_takes_nothing_back(st: store.Store) -> None:
    """A claimer holding a copy read before the item was claimed and closed (a thread that stalled): the
    newest lease is a close made long ago, but the item moved with it, so there is no orphan to take."""
    (stale,) = st.pending(STAGE, 10, collection=store.Work.QUEUE)
    claim = _claim(st)
    assert claim is not None
    st.complete(claim, store.State.DONE)
    old = st.now() - LONG_AGO
    st.leases.update_one({"_id": f"{STAGE}/{STAGE}/k1/{claim.n}"}, {"$set": {"until": old}})  # ran out
    st.leases.update_one(
        {"_id": f"{STAGE}/{STAGE}/k1/{claim.n + 1}"}, {"$set": {"at": old}}
    )  # closed long ago
    assert st.try_claim(STAGE, stale, "late", LEASE, collection=store.Work.QUEUE) is None
    assert st.leases.find_one({"_id": f"{STAGE}/{STAGE}/k1/{claim.n + 2}"}) is None  # no stray number
    assert (_item(st)[STAGE]["state"], _item(st)[STAGE]["seq"]) == (store.State.DONE, claim.n + 1)
