"""The feed (`feed`): every node's new health events and fault changes, a numbered sequence per writer,
for the cluster analyzer, which reads them without change streams (FerretDB has none; MongoDB only on
replica sets; DocumentDB per collection).

Each write of the detection side (`record_batch`) stores its events and faults as before and then
inserts one feed document holding what the batch added (the events that were new and the fault writes
that applied, as stored), numbered 1, 2, 3, ... in its writer's own sequence: `_id` is
`<writer>/<n in 18 zero-padded digits>`, so the one filter every server answers from its index, `_id`
equality (and an `_id` range), reaches it. A writer is the agent of one node (by default the node of the
batch's first record), so no two processes race for a number: one global order did, measured on
FerretDB's SQLite with 52 writers at once (22 inserts a feed document, 15 batches/s against 289 for one).

Why numbers taken by insert, not a counter: FerretDB v1 applies find_one_and_update as "read, then
write by _id", so two writers can both get the same `$inc` (the claims' measurement, `claims`); what
every server does atomically is reject a duplicate `_id`. A writer inserts number `head + 1` of its
sequence and on a duplicate (its own earlier process, or a second process of the same writer name)
tries the next one. It tries a number only when the one before it exists, so the numbers of a writer
are always 1..head with no gap, and a document is whole when it is visible (one insert). A reader at
position `p` of a writer therefore never waits for a number that was taken but not yet written, and
never passes one that will be written later: when `p + 1` is absent, nothing after it exists either.

The heads (`feed_heads`, one small document per writer, `_id` the writer) are where a writer starts
(a restarted one continues after its last number) and how the reader finds the writers with something
new: one read of that small collection, where a query on the feed for its writers would be a scan of
every feed document on FerretDB (it evaluates every filter but `_id`'s after fetching the documents).
A head is raised with `$max` after each insert: stale (a crash in between) it costs a writer one
duplicate try, never a gap, as it only ever names a number that was inserted. Heads are kept when the
feed is pruned, so a writer's numbers are never used twice.

Exactly once in the feed, under replays (a restarted agent re-derives the events after its last
snapshot; a spooled write repeats the part that had succeeded): an event already stored, or a fault
write whose revision is already the stored one, goes into the feed only when no feed document holds
it yet (`keys`: event ids and `<fault id>@<revision>`, looked up only for such repeats). A retried
insert whose first try had landed (pymongo retries writes; FerretDB ignores the retry's transaction
number) is recognised by the writer's nonce and not inserted twice.

The reader's position is one number per writer (`Position`). `feed_after` merges what the writers
added after it in the order of the documents' stored time (`at`), ties by writer and number, each
writer's documents in their own order. The feed is pruned by age (`prune_feed`), never past what the
analyzer has read; a reader that finds a writer's next number pruned anyway (the analyzer away longer
than the retention) learns which numbers were lost (`FeedRead.lost`) instead of stopping.
"""

from __future__ import annotations

import datetime as dt
import heapq
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pymongo
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError, DuplicateKeyError

from faultline.errors import InputError
from faultline.models import Fault, HealthEvent
from faultline.store.faults import Faults, event_doc, fault_doc

FEED = "feed"
FEED_HEADS = "feed_heads"
FEED_CHUNK = 256  # records per feed document (a large spool drained at once takes several numbers)
_DUPLICATE = (11000, 11001)
_DIGITS = 18

Position = Mapping[str, int]  # writer -> the last of its numbers read (absent: none)


def feed_id(writer: str, n: int) -> str:
    """The `_id` of writer `writer`'s feed document `n`: a string, as FerretDB pushes only string `_id`
    filters down."""
    return f"{writer}/{n:0{_DIGITS}d}"


def fault_feed_key(fault_id: str, revision: int) -> str:
    return f"{fault_id}@{revision}"


def position_doc(position: Position) -> list[dict[str, Any]]:
    """A position as stored (in checkpoints): `{writer, n}` documents, as a writer's name (a node's)
    may hold dots, which a field name may not, and FerretDB stores no nested arrays."""
    return [{"writer": w, "n": int(n)} for w, n in sorted(position.items())]


def position_from(doc: Any) -> dict[str, int]:
    return {str(d["writer"]): int(d["n"]) for d in doc or ()}


@dataclass(frozen=True)
class FeedBatch:
    """One feed document: writer `writer`'s number `n`, `events` as stored in `health_events` (`_id`
    the event id) and `faults` as stored in `faults` (`_id` the fault id, with their `revision`)."""

    n: int
    at: dt.datetime
    events: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    writer: str = ""

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> FeedBatch:
        return cls(int(doc["n"]), doc["at"], list(doc.get("events") or []), list(doc.get("faults") or []),
                   str(doc["writer"]))  # fmt: skip


@dataclass(frozen=True)
class FeedRead:
    """What one read found after a position: the next batches in the merged order, and `lost`, the
    numbers `(writer, first, last)` that were pruned before they were read (read that writer on after
    `last`)."""

    batches: list[FeedBatch]
    lost: list[tuple[str, int, int]] = field(default_factory=list)


class Feed(Faults):
    """The feed's writers (`record_batch`: the agents' sink), its reader (the analyzer) and retention."""

    @property
    def feed(self) -> Collection[Any]:
        return self.db[FEED]

    @property
    def feed_writers(self) -> Collection[Any]:
        return self.db[FEED_HEADS]

    # -- writers: the detection side ----------------------------------------------------------------
    def record_batch(
        self, events: Iterable[HealthEvent], writes: Iterable[tuple[Fault, int]], *, writer: str | None = None
    ) -> int:
        """Store a batch of the detection side (events by id, faults by revision, as `record_events` and
        `write_fault`) and feed what it added, in `writer`'s sequence (None: the node of the batch's
        first record, as an agent writes its own node's); returns how many events were new. Idempotent:
        a batch written again (a replay, a retry after a failure half-way) adds nothing twice, to the
        store or to the feed."""
        events = list(events)
        writes = list(writes)
        if writer is None:
            nodes = [e.node for e in events] + [f.node for f, _ in writes]
            writer = nodes[0] if nodes else ""
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
        if events_out or faults_out:
            self.append_feed(writer, events_out, faults_out)
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

    def append_feed(
        self, writer: str, events: list[dict[str, Any]], faults: list[dict[str, Any]]
    ) -> list[int]:
        """Feed stored event and fault documents in `writer`'s sequence (`FEED_CHUNK` records a number);
        their numbers."""
        if not writer or "/" in writer:
            raise InputError(f"feed writer {writer!r}: must be a non-empty name without '/'")
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
            numbers.append(self._insert_numbered(writer, body))
        return numbers

    def _insert_numbered(self, writer: str, body: dict[str, Any]) -> int:
        nonce = uuid.uuid4().hex
        n = self.feed_heads([writer]).get(writer, 0) + 1
        while True:
            try:
                self.feed.insert_one(
                    {"_id": feed_id(writer, n), "writer": writer, "n": n, "nonce": nonce, **body}
                )
                break
            except DuplicateKeyError:
                taken = self.feed.find_one({"_id": feed_id(writer, n)}, {"nonce": 1})
                if taken is not None and taken.get("nonce") == nonce:
                    break  # our own insert, retried by the driver after its reply was lost
                n += 1  # inserted by this writer's process before (its head not raised yet), or a twin's
        self.upsert(self.feed_writers, {"_id": writer}, {"$max": {"n": n}, "$set": {"at": body["at"]}})
        return n

    # -- the reader: the analyzer -------------------------------------------------------------------
    def feed_heads(self, writers: Sequence[str] | None = None) -> dict[str, int]:
        """Every writer's highest number known to be taken (or only those of `writers`): a hint, maybe a
        little behind, never ahead."""
        flt = (
            {}
            if writers is None
            else {"_id": writers[0]}
            if len(writers) == 1
            else {"_id": {"$in": list(writers)}}
        )
        return {str(d["_id"]): int(d["n"]) for d in self.feed_writers.find(flt, {"n": 1})}

    def feed_after(self, position: Position, limit: int = 256, *, upto: Position | None = None) -> FeedRead:
        """The feed documents after `position`, merged (stored time, then writer and number; each
        writer's in its order), at most `limit` (shared by the writers with something new; one of each
        when more are): of each writer all there are up to its first number not (yet) visible, and with
        `upto` none past its number there (a writer absent from it: none). An empty read means caught
        up, unless `lost` says a writer's next numbers were pruned."""
        heads = self.feed_heads()
        if upto is not None:
            heads = {w: min(n, upto.get(w, 0)) for w, n in heads.items()}
        behind = sorted(w for w, n in heads.items() if n > position.get(w, 0))
        if not behind:
            return FeedRead([])  # caught up (a number past a head may be arriving: read it next time)
        each = max(1, limit // len(behind))
        wanted = [
            feed_id(w, n)
            for w in behind
            for n in range(position.get(w, 0) + 1, min(heads[w], position.get(w, 0) + each) + 1)
        ]
        docs = {(str(d["writer"]), int(d["n"])): d for d in self.feed.find({"_id": {"$in": wanted}})}
        runs: list[list[FeedBatch]] = []
        lost: list[tuple[str, int, int]] = []
        for w in behind:
            run = []
            n = position.get(w, 0) + 1
            while (w, n) in docs:
                run.append(FeedBatch.from_doc(docs[(w, n)]))
                n += 1
            if run:
                runs.append(run)
                continue
            # its next number was inserted (the head is past it) but is gone: pruned before it was read
            first = self.feed.find_one(
                {"_id": {"$gt": feed_id(w, position.get(w, 0)), "$lte": feed_id(w, 10**_DIGITS - 1)}},
                {"n": 1}, sort=[("_id", pymongo.ASCENDING)],
            )  # fmt: skip
            last = int(first["n"]) - 1 if first else heads[w]
            lost.append((w, position.get(w, 0) + 1, min(last, heads[w])))
        merged = heapq.merge(*runs, key=lambda b: (_aware(b.at), b.writer, b.n))
        return FeedRead(list(merged), lost)

    # -- retention ----------------------------------------------------------------------------------
    def prune_feed(self, older_than: dt.timedelta, *, read_up_to: Position | None = None) -> int:
        """Delete feed documents written before the cutoff (and, with `read_up_to`, only those a reader
        at that position has read: a writer absent from it keeps all); how many."""
        flt: dict[str, Any] = {"at": {"$lt": self.now() - older_than}}
        if read_up_to is None:
            return int(self.feed.delete_many(flt).deleted_count)
        old = self.feed.find(flt, {"writer": 1, "n": 1})
        ids = [d["_id"] for d in old if int(d["n"]) <= read_up_to.get(str(d.get("writer")), 0)]
        deleted = 0
        for start in range(0, len(ids), 1000):
            deleted += int(self.feed.delete_many({"_id": {"$in": ids[start : start + 1000]}}).deleted_count)
        return deleted

    def ensure_feed_indexes(self) -> None:
        self.feed.create_index([("keys", pymongo.ASCENDING)])  # repeats' look-ups (multikey)
        self.feed.create_index([("at", pymongo.ASCENDING)])


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _fed_fault(fault: Fault, revision: int) -> dict[str, Any]:
    doc = fault_doc(fault)
    doc["_id"] = fault.id
    doc["revision"] = revision
    return doc
