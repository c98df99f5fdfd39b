"""The MongoDB store (ARCHITECTURE §5): the only module that imports pymongo.

Collections: `health_events` (append-only, one document per event id), `faults` (one document per fault
key, written from the detector's view of the fault), `queue` (the work items of fault-level stages, one
per stage and fault: `quarantine/<fault key>`), `nodes`, `drains`, `repairs`, `leases`.

Why work items live apart from the faults: FerretDB 1.x (SQLite) does not use its `_id` index for
updates (the index is on `sjson->"_id"`, the query on `sjson->'$._id'`), so every update reads the whole
collection: 11 ms per update with 1,000 faults stored, 2 ms with 1,000 small queue items. Claims update
their item twice; the faults themselves are written only by the node agents.

Every write is idempotent, so at-least-once streams and retries cannot double count:
- events are inserted with their deterministic id as `_id`; a duplicate is absorbed by the unique index;
- a fault is written with the detector's cumulative figures and a revision number: the update only
  applies when its revision is newer than the stored one (`$max`/`$min` would not order state changes).

Consumers take work by claims on an equality-indexed stage state, arbitrated by unique inserts into
`leases` (see `claim`), renewed while working, completed only by the owner (fencing). Only features
MongoDB >= 6, FerretDB 1.x and DocumentDB share are used: no transactions, TTL indexes, change streams,
update pipelines or `$lookup`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pymongo
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import BulkWriteError, ConnectionFailure, DuplicateKeyError, ServerSelectionTimeoutError

from faultline.errors import LeaseLostError, TransientError
from faultline.models import Fault, FaultState, HealthEvent

STAGES = ("quarantine",)  # fault-level stages: each new open fault gets a queue item for each
CLAIM_SCAN = 32  # pending faults looked at per claim before giving up (others may be taking them)
PENDING, CLAIMED, DONE, PARKED = "pending", "claimed", "done", "parked"
Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    # BSON dates have millisecond precision: keep the clock at that precision so comparisons round-trip
    now = dt.datetime.now(dt.UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def _naive(t: dt.datetime) -> dt.datetime:
    """BSON dates come back naive (UTC); write them the same way so equality holds."""
    return t.astimezone(dt.UTC).replace(tzinfo=None, microsecond=t.microsecond // 1000 * 1000)


@dataclass(frozen=True)
class Claim:
    id: str
    stage: str
    owner: str
    lease_until: dt.datetime
    doc: dict[str, Any]
    n: int  # this claim's number in `leases`
    collection: str = "faults"


def connect(uri: str, database: str = "faultline", *, clock: Clock = utcnow, timeout: float = 10.0) -> Store:
    """A Store on a new client (create it where it is used: Bytewax may fork). `timeout` bounds how long a
    call waits for an unreachable server before it fails with TransientError."""
    ms = int(timeout * 1000)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(
        uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms
    )
    return Store(client[database], clock=clock)


@contextlib.contextmanager
def unreachable_is_transient(what: str) -> Iterator[None]:
    """Connection failures as TransientError, so callers retry or spool without importing pymongo."""
    try:
        yield
    except (ConnectionFailure, ServerSelectionTimeoutError) as exc:
        raise TransientError(f"{what}: MongoDB unreachable: {exc}", delay=1.0) from exc


class Store:
    def __init__(self, db: Database[Any], *, clock: Clock = utcnow) -> None:
        self.db = db
        self.clock = clock
        self.events: Collection[Any] = db["health_events"]
        self.faults: Collection[Any] = db["faults"]
        self.nodes: Collection[Any] = db["nodes"]
        self.leases: Collection[Any] = db["leases"]
        self.drains: Collection[Any] = db["drains"]  # one document per node being drained (drainer)
        self.queue: Collection[Any] = db["queue"]  # work items of the fault-level stages

    def ensure_indexes(self) -> None:
        self.events.create_index([("node", pymongo.ASCENDING), ("observed_at", pymongo.ASCENDING)])
        self.events.create_index([("generated_at", pymongo.ASCENDING)])
        self.faults.create_index([("node", pymongo.ASCENDING), ("state", pymongo.ASCENDING)])
        self.leases.create_index([("fault", pymongo.ASCENDING)])
        for stage in STAGES:
            self.queue.create_index([(f"{stage}.state", pymongo.ASCENDING)])
        self.queue.create_index([("node", pymongo.ASCENDING)])
        self.drains.create_index([("drain.state", pymongo.ASCENDING)])
        self.nodes.create_index([("quarantined", pymongo.ASCENDING)])

    # -- writes from the detection side ---------------------------------------------------------------
    def record_events(self, events: Iterable[HealthEvent]) -> int:
        """Insert events (idempotent by id); return how many were new."""
        docs = [_event_doc(e) for e in events]
        if not docs:
            return 0
        try:
            return len(self.events.insert_many(docs, ordered=False).inserted_ids)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(err.get("code") not in (11000, 11001) for err in errors):
                raise
            return int(exc.details.get("nInserted", len(docs) - len(errors)))

    def write_fault(self, fault: Fault, revision: int) -> bool:
        """Store the detector's view of a fault if `revision` is newer than what is stored.

        An open fault gets a pending queue item for every fault-level stage when it opens (a replay of
        the same write makes none twice, and one lost to a crash between the two writes is made by the
        replay); a resolved fault's items are removed, so a fault that comes back under the same key
        gets new ones. Returns whether the fault's write applied."""
        doc = _fault_doc(fault)
        doc["revision"] = revision
        doc["updated_at"] = _naive(self.clock())
        try:
            result = self.faults.update_one(
                {"_id": fault.id, "revision": {"$lt": revision}}, {"$set": doc}, upsert=True
            )
            applied = result.upserted_id is not None or result.modified_count == 1
        except DuplicateKeyError:
            applied = False  # the stored revision is as new or newer: a replay of an older write
        if fault.state == FaultState.OPEN:  # after the fault, so a worker that takes the item finds it
            item = {"node": fault.node, "first_seen": doc["first_seen"], "last_seen": doc["last_seen"],
                    "fatal": fault.fatal}  # fmt: skip
            for stage in STAGES:
                self.enqueue(stage, fault.id, item)
        elif applied or (self.faults.find_one({"_id": fault.id}, {"state": 1}) or {}).get("state") != "open":
            # resolved (and not an old write replayed after a newer opening): its items go, so that the
            # fault coming back under the same key is worked on again
            self.queue.delete_many({"_id": {"$in": [f"{stage}/{fault.id}" for stage in STAGES]}})
        return applied

    def enqueue(self, stage: str, key: str, fields: dict[str, Any]) -> bool:
        """A pending work item `<stage>/<key>` in `queue`, unless it exists (in any state); whether new.

        An item made again after its fault resolved and came back must not reuse the lease numbers of
        the one before (they exist in `leases`): its numbers start at the time of its making in
        microseconds, past any number the earlier item reached (it would need a claim a microsecond)."""
        now = self.clock()
        try:
            self.queue.insert_one({
                "_id": f"{stage}/{key}", "key": key, **fields,
                stage: {"state": PENDING, "attempts": 0, "updated_at": _naive(now),
                        "seq": int(now.timestamp() * 1_000_000)},
            })  # fmt: skip
        except DuplicateKeyError:
            return False
        return True

    # -- claims ---------------------------------------------------------------------------------------
    # FerretDB v1 applies a conditional update as "read, then write by _id", so two claimers can both
    # win a find_one_and_update (measured: 4 threads took 119 claims of 40 documents). What every
    # server does atomically is reject a duplicate _id. So each claim, completion and takeover of one
    # (stage, fault) inserts the next numbered document into `leases`; exactly one inserter wins each
    # number, and a stale reader can only try a number that already exists.
    def claim(
        self,
        stage: str,
        owner: str,
        lease: dt.timedelta,
        extra: dict[str, Any] | None = None,
        *,
        spread: bool = False,
        collection: str = "faults",
        order: tuple[str, ...] = ("first_seen",),
    ) -> Claim | None:
        """Take the first pending document of `stage` in `collection` (faults by default), by `order`
        (ascending fields; a leading "-" descends), optionally filtered by equality on more fields.
        `spread`: take any of the first CLAIM_SCAN (for many claimers at once)."""
        docs = self.pending(stage, CLAIM_SCAN, extra, collection=collection, order=order)
        if spread:  # concurrent claimers start at different places instead of all racing for the first
            random.shuffle(docs)
        for doc in docs:
            claim = self.try_claim(stage, doc, owner, lease, collection=collection)
            if claim is not None:
                return claim
        return None

    def pending(
        self,
        stage: str,
        limit: int,
        extra: dict[str, Any] | None = None,
        *,
        collection: str = "faults",
        order: tuple[str, ...] = ("first_seen",),
    ) -> list[dict[str, Any]]:
        """Up to `limit` pending documents of `stage`, in `order` (candidates for `try_claim`)."""
        sort = [(f.lstrip("-"), pymongo.DESCENDING if f[0] == "-" else pymongo.ASCENDING) for f in order]
        found = self.db[collection].find({f"{stage}.state": PENDING, **(extra or {})})
        return list(found.sort([*sort, ("_id", pymongo.ASCENDING)]).limit(limit))

    def try_claim(
        self, stage: str, doc: dict[str, Any], owner: str, lease: dt.timedelta, *, collection: str = "faults"
    ) -> Claim | None:
        """Claim `doc` as it was read: the next lease number after the one it shows. A stale copy (claimed,
        completed or reaped since) names a number that exists already, so it fails: None; so does a copy
        of a document deleted since."""
        n = int(doc[stage].get("seq", 0)) + 1
        now = self.clock()
        until = now + lease
        if not self._take(stage, doc["_id"], n, owner, "claimed", until):
            return None  # another worker took this number first
        fields = {
            f"{stage}.state": CLAIMED,
            f"{stage}.seq": n,
            f"{stage}.attempts": int(doc[stage].get("attempts", 0)) + 1,
            f"{stage}.lease_owner": owner,
            f"{stage}.lease_until": _naive(until),
            f"{stage}.updated_at": _naive(now),
        }
        if self.db[collection].update_one({"_id": doc["_id"]}, {"$set": fields}).matched_count == 0:
            return None  # the item went after it was read (its fault resolved): nothing to claim
        doc = {**doc, stage: {**doc[stage], **{k.split(".", 1)[1]: v for k, v in fields.items()}}}
        return Claim(doc["_id"], stage, owner, until, doc, n, collection)

    def _take(self, stage: str, fault: str, n: int, owner: str, kind: str, until: dt.datetime | None) -> bool:
        try:
            self.leases.insert_one(
                {"_id": f"{stage}/{fault}/{n}", "fault": fault, "stage": stage, "n": n, "owner": owner,
                 "kind": kind, "until": _naive(until) if until else None, "at": _naive(self.clock())}
            )  # fmt: skip
        except DuplicateKeyError:
            return False
        return True

    def renew(self, claim: Claim, lease: dt.timedelta) -> Claim:
        """Extend the lease. Only the lease document is written: FerretDB v1 updates a document by reading
        it and writing it back whole, so a renewal written to the work document while the handler
        updates it could undo the handler's change (seen: a pushed repair round lost)."""
        if self.leases.find_one({"_id": f"{claim.stage}/{claim.id}/{claim.n + 1}"}) is not None:
            raise LeaseLostError(f"{claim.stage} claim on {claim.id} was taken over")
        until = self.clock() + lease
        self.leases.update_one(
            {"_id": f"{claim.stage}/{claim.id}/{claim.n}"}, {"$set": {"until": _naive(until)}}
        )
        return Claim(claim.id, claim.stage, claim.owner, until, claim.doc, claim.n, claim.collection)

    def complete(
        self, claim: Claim, state: str = DONE, error: str | None = None, also: dict[str, Any] | None = None
    ) -> None:
        """Close the claim (`done`, `parked`, or `pending` to give it back); fenced by the next number.
        `also`: more fields to set in the same update (the next stage's hand-over, so that stage cannot
        claim the document while this one still writes it)."""
        if not self._take(claim.stage, claim.id, claim.n + 1, claim.owner, f"closed:{state}", None):
            raise LeaseLostError(f"{claim.stage} claim on {claim.id} is no longer held by {claim.owner}")
        self.db[claim.collection].update_one(
            {"_id": claim.id},
            {"$set": {
                f"{claim.stage}.state": state, f"{claim.stage}.seq": claim.n + 1,
                f"{claim.stage}.lease_owner": None, f"{claim.stage}.lease_until": None,
                f"{claim.stage}.updated_at": _naive(self.clock()), f"{claim.stage}.error": error,
                **(also or {}),
            }},
        )  # fmt: skip

    def reap(self, stage: str, max_attempts: int, *, collection: str = "faults") -> tuple[int, int]:
        """Take back expired claims: to pending, or parked once out of attempts; (requeued, parked).
        A claim's expiry is in its lease document, which renewals extend."""
        now = self.clock()
        requeued = parked = 0
        coll = self.db[collection]
        for doc in coll.find({f"{stage}.state": CLAIMED}):
            n = int(doc[stage].get("seq", 0)) + 1
            held = self.leases.find_one({"_id": f"{stage}/{doc['_id']}/{n - 1}"}, {"until": 1})
            if held is not None and held.get("until") is not None and held["until"] >= _naive(now):
                continue
            if not self._take(stage, doc["_id"], n, "reaper", "expired", None):
                continue  # the owner completed it just now, or another reaper got there first
            out_of_attempts = int(doc[stage].get("attempts", 0)) >= max_attempts
            coll.update_one(
                {"_id": doc["_id"]},
                {
                    "$set": {
                        f"{stage}.state": PARKED if out_of_attempts else PENDING,
                        f"{stage}.seq": n,
                        f"{stage}.lease_owner": None,
                        f"{stage}.lease_until": None,
                        f"{stage}.updated_at": _naive(now),
                        f"{stage}.error": "lease expired"
                        + (f" {max_attempts} times" if out_of_attempts else ""),
                    }
                },
            )
            parked += out_of_attempts
            requeued += not out_of_attempts
        return requeued, parked

    @staticmethod
    def upsert(collection: Collection[Any], flt: dict[str, Any], update: dict[str, Any]) -> None:
        """update_one with upsert, where two concurrent upserts of one _id may race: FerretDB inserts
        for both and one fails on the unique _id; the loser then finds the document and updates it."""
        try:
            collection.update_one(flt, update, upsert=True)
        except DuplicateKeyError:
            collection.update_one(flt, update)

    def prune_events(self, older_than: dt.timedelta) -> int:
        """Retention without TTL indexes (FerretDB has none): delete events generated before the cutoff."""
        cutoff = _naive(self.clock() - older_than)
        return int(self.events.delete_many({"generated_at": {"$lt": cutoff}}).deleted_count)


def _event_doc(e: HealthEvent) -> dict[str, Any]:
    doc = e.model_dump(mode="python")
    doc["_id"] = doc.pop("id")
    doc["entities"] = [dict(x) for x in doc["entities"]]
    doc["generated_at"] = _naive(e.generated_at)
    doc["observed_at"] = _naive(e.observed_at)
    return doc


def _fault_doc(f: Fault) -> dict[str, Any]:
    doc = f.model_dump(mode="python")
    doc.pop("id")
    doc["entity"] = dict(doc["entity"])
    for key in ("first_seen", "last_seen", "resolved_at"):
        if doc[key] is not None:
            doc[key] = _naive(doc[key])
    return doc
