"""A worker killed between the two writes of a claim, a completion or a take-back (the lease document,
then the work document), on FerretDB: the item is taken back once that lease is dead, instead of
staying unclaimable (pending behind a number that exists) or claimed for good (the reaper's number
taken). Found by the chaos suite's remediation-kill: a repair stayed claimed by a dead worker and the
node was never repaired."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from faultline import store
from faultline.store import claims

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
