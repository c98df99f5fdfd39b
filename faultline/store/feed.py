"""The feed (`feed`): every node's new health events and fault changes, in one numbered order, for the
cluster analyzer, which reads it without change streams (FerretDB has none; MongoDB only on replica
sets; DocumentDB per collection).

Each write of the detection side (`record_batch`) stores its events and faults as before and then
inserts one feed document numbered 1, 2, 3, ... (`_id` the number in 18 zero-padded digits, so the
one filter every server answers from its index, `_id` equality, reaches it) holding what the batch
added: the events that were new and the fault writes that applied, as stored.

Why numbers taken by insert, not a counter: FerretDB v1 applies find_one_and_update as "read, then
write by _id", so two writers can both get the same `$inc` (the claims' measurement, `claims`); what
every server does atomically is reject a duplicate `_id`. A writer inserts number `head + 1` and on a
duplicate tries the next one. It tries a number only when the one before it exists (it read it as the
head, or its insert of it failed as a duplicate), so the numbers in use are always 1..head with no gap,
and a document is whole when it is visible (one insert). A reader at position `p` therefore never
waits for a number that was taken but not yet written, and never passes one that will be written later:
when `p + 1` is absent, nothing after it exists either. (A watermark of committed numbers, or a bounded
wait for a gap, would be needed with a counter: a taken number's batch may still be in flight, or never
come when its writer died. Here there is nothing in flight.)

The head (`counters`, `_id: "feed"`) is only a hint of where to start, raised with `$max` after each
insert: stale (a `$max` raced on FerretDB) it costs a writer a few duplicate tries, never a gap, as it
only ever names a number that was inserted. Writers read it before every append, so a number pruned
long ago is never tried again.

Exactly once in the feed, under replays (a restarted agent re-derives the events after its last
snapshot; a spooled write repeats the part that had succeeded): an event already stored, or a fault
write whose revision is already the stored one, goes into the feed only when no feed document holds
it yet (`keys`: event ids and `<fault id>@<revision>`, looked up only for such repeats). A retried
insert whose first try had landed (pymongo retries writes; FerretDB ignores the retry's transaction
number) is recognised by the writer's nonce and not inserted twice.

The feed is pruned by age (`prune_feed`), never past what the analyzer has read; a reader that finds
its next number pruned anyway (the analyzer away longer than the retention) learns which numbers were
lost (`FeedRead.lost`) instead of stopping.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pymongo
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError, DuplicateKeyError

from faultline.models import Fault, HealthEvent
from faultline.store.faults import Faults, event_doc, fault_doc

FEED = "feed"
COUNTERS = "counters"
FEED_CHUNK = 256  # records per feed document (a large spool drained at once takes several numbers)
_DUPLICATE = (11000, 11001)


def feed_id(n: int) -> str:
    """The `_id` of feed document `n`: a string, as FerretDB pushes only string `_id` filters down."""
    return f"{n:018d}"


def fault_feed_key(fault_id: str, revision: int) -> str:
    return f"{fault_id}@{revision}"


@dataclass(frozen=True)
class FeedBatch:
    """One feed document: `events` as stored in `health_events` (`_id` the event id) and `faults` as
    stored in `faults` (`_id` the fault id, with their `revision`)."""

    n: int
    at: dt.datetime
    events: list[dict[str, Any]]
    faults: list[dict[str, Any]]

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> FeedBatch:
        return cls(int(doc["n"]), doc["at"], list(doc.get("events") or []), list(doc.get("faults") or []))


@dataclass(frozen=True)
class FeedRead:
    """What one read found after a position: the next batches in order, and `lost`, the numbers
    `(first, last)` that were pruned before they were read (then `batches` is empty; read on after
    `last`)."""

    batches: list[FeedBatch]
    lost: tuple[int, int] | None = None


class Feed(Faults):
    """The feed's writers (`record_batch`: the agents' sink), its reader (the analyzer) and retention."""

    @property
    def feed(self) -> Collection[Any]:
        return self.db[FEED]

    @property
    def counters(self) -> Collection[Any]:
        return self.db[COUNTERS]

    # -- writers: the detection side ----------------------------------------------------------------
    def record_batch(self, events: Iterable[HealthEvent], writes: Iterable[tuple[Fault, int]]) -> int:
        """Store a batch of the detection side (events by id, faults by revision, as `record_events` and
        `write_fault`) and feed what it added; returns how many events were new. Idempotent: a batch
        written again (a replay, a retry after a failure half-way) adds nothing twice, to the store or
        to the feed."""
        docs = [event_doc(e) for e in events]
        new_ids = self._insert_events(docs)
        fresh = [d for d in docs if d["_id"] in new_ids]
        repeated = [d for d in docs if d["_id"] not in new_ids]
        applied: list[tuple[Fault, int]] = []
        same: list[tuple[Fault, int]] = []
        for fault, revision in writes:
            (applied if self.write_fault(fault, revision) else same).append((fault, revision))
        if same:  # not applied: a newer revision is stored (skip it), or this one (fed already?)
            found = self.faults.find({"_id": {"$in": [f.id for f, _ in same]}}, {"revision": 1})
            stored = {d["_id"]: d.get("revision") for d in found}
            same = [(f, r) for f, r in same if stored.get(f.id) == r]
        fed = self.fed_keys([d["_id"] for d in repeated] + [fault_feed_key(f.id, r) for f, r in same])
        events_out = fresh + [d for d in repeated if d["_id"] not in fed]
        faults_out = [_fed_fault(f, r) for f, r in applied]
        faults_out += [_fed_fault(f, r) for f, r in same if fault_feed_key(f.id, r) not in fed]
        self.append_feed(events_out, faults_out)
        return len(new_ids)

    def _insert_events(self, docs: list[dict[str, Any]]) -> set[str]:
        """Insert event documents; the ids of those that were new (the others are stored already)."""
        if not docs:
            return set()
        try:
            self.events.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(err.get("code") not in _DUPLICATE for err in errors):
                raise
            failed = {int(err["index"]) for err in errors}
            return {d["_id"] for i, d in enumerate(docs) if i not in failed}
        return {d["_id"] for d in docs}

    def fed_keys(self, keys: Sequence[str]) -> set[str]:
        """Which of these event ids and fault keys (`fault_feed_key`) a feed document holds."""
        if not keys:
            return set()
        wanted = set(keys)
        found: set[str] = set()
        for doc in self.feed.find({"keys": {"$in": list(wanted)}}, {"keys": 1}):
            found.update(k for k in doc.get("keys") or () if k in wanted)
        return found

    def append_feed(self, events: list[dict[str, Any]], faults: list[dict[str, Any]]) -> list[int]:
        """Feed stored event and fault documents (`FEED_CHUNK` records a number); their numbers."""
        records = [("events", d) for d in events] + [("faults", d) for d in faults]
        numbers = []
        for start in range(0, len(records), FEED_CHUNK):
            chunk = records[start : start + FEED_CHUNK]
            body: dict[str, Any] = {
                "at": self.now(),
                "events": [d for kind, d in chunk if kind == "events"],
                "faults": [d for kind, d in chunk if kind == "faults"],
                "keys": [d["_id"] if kind == "events" else fault_feed_key(d["_id"], d["revision"])
                         for kind, d in chunk],
            }  # fmt: skip
            numbers.append(self._insert_numbered(body))
        return numbers

    def _insert_numbered(self, body: dict[str, Any]) -> int:
        nonce = uuid.uuid4().hex
        n = self.feed_head() + 1
        tries = 0
        while True:
            try:
                self.feed.insert_one({"_id": feed_id(n), "n": n, "nonce": nonce, **body})
                break
            except DuplicateKeyError:
                taken = self.feed.find_one({"_id": feed_id(n)}, {"nonce": 1})
                if taken is not None and taken.get("nonce") == nonce:
                    break  # our own insert, retried by the driver after its reply was lost
                tries += 1
                # each duplicate is another writer's insert, so this ends; the head may have moved far
                n = max(n + 1, self.feed_head() + 1) if tries % 8 == 0 else n + 1
        self.upsert(self.counters, {"_id": FEED}, {"$max": {"n": n}})
        return n

    # -- the reader: the analyzer -------------------------------------------------------------------
    def feed_head(self) -> int:
        """The highest feed number known to be taken (a hint: maybe a little behind, never ahead)."""
        doc = self.counters.find_one({"_id": FEED})
        return int(doc["n"]) if doc else 0

    def feed_after(self, position: int, limit: int = 256) -> FeedRead:
        """The feed documents after `position`, in order, at most `limit`: all there are up to the first
        number not (yet) visible. An empty read means caught up, unless `lost` says the next numbers
        were pruned."""
        head = self.feed_head()
        if head <= position:
            return FeedRead([])  # caught up (a number past the head may be arriving: read it next time)
        wanted = [feed_id(n) for n in range(position + 1, min(head, position + limit) + 1)]
        docs = {int(d["n"]): d for d in self.feed.find({"_id": {"$in": wanted}})}
        out = []
        n = position + 1
        while n in docs:
            out.append(FeedBatch.from_doc(docs[n]))
            n += 1
        if out:
            return FeedRead(out)
        # position + 1 was inserted (the head is past it) but is gone: pruned before it was read
        first = self.feed.find_one({"n": {"$gt": position}}, {"n": 1}, sort=[("n", pymongo.ASCENDING)])
        last = int(first["n"]) - 1 if first else head
        return FeedRead([], lost=(position + 1, last))

    # -- retention ----------------------------------------------------------------------------------
    def prune_feed(self, older_than: dt.timedelta, *, read_up_to: int | None = None) -> int:
        """Delete feed documents written before the cutoff (and, with `read_up_to`, only those numbered
        up to it: what the analyzer has read); how many."""
        flt: dict[str, Any] = {"at": {"$lt": self.now() - older_than}}
        if read_up_to is not None:
            flt["n"] = {"$lte": read_up_to}
        return int(self.feed.delete_many(flt).deleted_count)

    def ensure_feed_indexes(self) -> None:
        self.feed.create_index([("keys", pymongo.ASCENDING)])  # repeats' look-ups (multikey)
        self.feed.create_index([("n", pymongo.ASCENDING)])
        self.feed.create_index([("at", pymongo.ASCENDING)])


def _fed_fault(fault: Fault, revision: int) -> dict[str, Any]:
    doc = fault_doc(fault)
    doc["_id"] = fault.id
    doc["revision"] = revision
    return doc
