"""The feed (`feed`): every node's new health events and fault changes, a numbered sequence per writer,
for the cluster analyzer, which reads them without change streams (FerretDB has none; MongoDB only on
replica sets; DocumentDB per collection).

Each write of the detection side (`record_batch`) stores its events and faults as before and then
inserts one feed document holding what the batch added (the events that were new and the fault writes
that applied, as stored, as one BSON document compressed with zlib in the binary `zrecords`: FerretDB
converts one field instead of every field of every record, which took the analyzer's 20,000 events
from 8.1 s to 4.2 s, and a fifth of the bytes; older documents hold it uncompressed in `records`) and
`newest`, the time of its newest record (the reader's watermark without decoding the records),
numbered 1, 2, 3, ... in its writer's own sequence: `_id` is `<writer>/<n in 18 zero-padded digits>`,
and `slot` the second of its stored time `at` (how the reader finds documents in bulk: below). A writer
is the agent of one node (by default the node of the batch's first record), so no two processes race
for a number: one global order did, measured on FerretDB's SQLite with 52 writers at once (22 inserts
a feed document, 15 batches/s against 289 for one).

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
every feed document on FerretDB's SQLite (it passes only `_id` filters down).
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
writer's documents in their own order. It reads a slot at a time (`{"slot": s}`): FerretDB passes
equalities down to PostgreSQL but evaluates `$in` and ranges, even on `_id`, after fetching and decoding
every document of the collection, which made each read cost the whole feed (0.3 s at 1,000 feed
documents, 2 s at 5,000; a slot: 60 ms at either). FerretDB's SQLite passes down only `_id`, so there a
slot's read still fetches the whole feed (as every read did before). A document the slots did not hold
(stored late into a second already read, or by a writer whose clock is off) is read by its `_id`; after
`JUMP_AFTER` empty seconds the reader looks up where the writers' next documents are instead of reading
on second by second. The feed is pruned by age (`prune_feed`), never past what the
analyzer has read; a reader that finds a writer's next number pruned anyway (the analyzer away longer
than the retention) learns which numbers were lost (`FeedRead.lost`) instead of stopping.
"""

from __future__ import annotations

import datetime as dt
import heapq
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import bson
import pymongo
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError, DuplicateKeyError

from faultline.errors import InputError
from faultline.models import Fault, HealthEvent
from faultline.store.base import CODEC
from faultline.store.faults import Faults, event_doc, fault_doc

FEED = "feed"
FEED_HEADS = "feed_heads"
FEED_CHUNK = 256  # records per feed document (a large spool drained at once takes several numbers)
ZLEVEL = 1  # zlib level of a feed document's records: 5x smaller (measured, 16 events: 4.9 KB to 0.9 KB)
_DUPLICATE = (11000, 11001)
_DIGITS = 18

Position = Mapping[str, int]  # writer -> the last of its numbers read (absent: none)


SLOT_S = 1  # seconds of stored time a slot spans (feed documents are read a slot at a time)
JUMP_AFTER = 8  # empty slots read in a row before the reader looks up where the writers' next ones are
PROBES = 16  # writers whose next document is looked up (by `_id`) to find where to read from
READ_FIELDS = {"keys": False, "nonce": False}  # what the reader leaves out (for writers and retention)


def slot_of(at: dt.datetime) -> int:
    return int(_aware(at).timestamp()) // SLOT_S


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
    the event id) and `faults` as stored in `faults` (`_id` the fault id, with their `revision`).

    `body` is the document's records as stored (`zrecords`; before, uncompressed `records`; a v1
    document: the document), decoded on first use of
    `events` or `faults`: the analyzer's reader hands documents on undecoded and its workers decode them
    (`dataflows.cluster`). `newest`: the time of its newest record (an event's `observed_at`, a fault's
    `last_seen`) in epoch seconds, stored beside the records so the reader knows it without decoding
    them (a document from before it was stored: found by decoding)."""

    n: int
    at: dt.datetime
    body: Any
    writer: str = ""
    stored_newest: float | None = None
    compressed: bool = False  # `body` is zlib-compressed BSON (`zrecords`)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> FeedBatch:
        newest = doc.get("newest")
        body = doc["zrecords"] if "zrecords" in doc else doc.get("records", doc)
        return cls(int(doc["n"]), doc["at"], body, str(doc["writer"]),
                   float(newest) if isinstance(newest, int | float) else None, "zrecords" in doc)  # fmt: skip

    @cached_property
    def _decoded(self) -> Mapping[str, Any]:
        if not isinstance(self.body, bytes):
            fields: Mapping[str, Any] = self.body  # a v1 document
            return fields
        raw = zlib.decompress(self.body) if self.compressed else self.body
        decoded: Mapping[str, Any] = bson.decode(raw, codec_options=CODEC)
        return decoded

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(self._decoded.get("events") or [])

    @property
    def faults(self) -> list[dict[str, Any]]:
        return list(self._decoded.get("faults") or [])

    @property
    def newest(self) -> float:
        if self.stored_newest is not None:
            return self.stored_newest
        return newest_of(self.events, self.faults)


def epoch(t: dt.datetime) -> float:
    """A stored time in epoch seconds (a naive one is UTC, as pymongo reads them)."""
    return _aware(t).timestamp()


def newest_of(events: Sequence[Mapping[str, Any]], faults: Sequence[Mapping[str, Any]]) -> float:
    """The newest record time of a feed document's events and fault writes (-inf: none)."""
    return max([epoch(d["observed_at"]) for d in events] + [epoch(d["last_seen"]) for d in faults],
               default=float("-inf"))  # fmt: skip


@dataclass(frozen=True)
class FeedRead:
    """What one read found after a position: the next batches in the merged order, and `lost`, the
    numbers `(writer, first, last)` that were pruned before they were read (read that writer on after
    `last`)."""

    batches: list[FeedBatch]
    lost: list[tuple[str, int, int]] = field(default_factory=list)
    slot: int | None = None  # where the next read starts (pass it back as `feed_after`'s `slot`)


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
            at = self.now()
            chunk_events = [d for kind, d in chunk if kind == "events"]
            chunk_faults = [d for kind, d in chunk if kind == "faults"]
            body: dict[str, Any] = {
                "at": at,
                "slot": slot_of(at),
                "zrecords": bson.Binary(zlib.compress(bson.encode(
                    {"events": chunk_events, "faults": chunk_faults}, codec_options=CODEC), ZLEVEL)),
                "newest": newest_of(chunk_events, chunk_faults),
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

    def feed_after(
        self, position: Position, limit: int = 256, *, upto: Position | None = None, slot: int | None = None
    ) -> FeedRead:
        """The feed documents after `position`, merged (stored time, then writer and number; each
        writer's in its order), at most `limit`: of each writer all there are up to its first number not
        (yet) visible, and with `upto` none past its number there (a writer absent from it: none). An
        empty read means caught up, unless `lost` says a writer's next numbers were pruned. `slot`: the
        `slot` of the read before (None: found from the writers' next documents).

        Read a slot (a second of stored time) at a time, `{"slot": s}`: an equality, the filter FerretDB
        passes down to PostgreSQL (and MongoDB answers from the `slot` index), where `$in` and ranges,
        even on `_id`, make FerretDB fetch and decode every feed document (measured: 0.3 s a read at
        1,000 feed documents, 2 s at 5,000). A writer's next document that the slots read did not hold
        although they should have (its head's slot was read, or a later number of it was: stored late,
        or by a writer whose clock is off) is read by its `_id`; one that is not there was pruned."""
        heads, head_slot = self._heads(upto)
        behind = sorted(w for w, n in heads.items() if n > position.get(w, 0))
        now = slot_of(self.now())
        if not behind:  # caught up (a number past a head may be arriving: read it next time)
            return FeedRead([], slot=now - 1 if slot is None else max(slot, now - 1))
        read = _Reading(position, heads, head_slot, limit)
        start = self._next_slot(read, behind, now) if slot is None else slot
        last = max([now, *(head_slot[w] for w in behind)])
        empty, s, wanted, total = 0, start, read.wanted, read.behind
        while s <= last and (s == start or len(read.found) < wanted):  # the first slot at least
            got = read.add(self.feed.find({"slot": s}, READ_FIELDS))
            empty = 0 if got else empty + 1
            s += 1
            if empty >= JUMP_AFTER and s <= last:  # a quiet stretch: on to where the next documents are
                s, empty = max(s, self._next_slot(read, behind, last)), 0
        scanned = s - 1
        if len(read.found) >= wanted >= total:  # all there is to the heads: nothing in between
            scanned = max([scanned, *(slot_of(d["at"]) for d in read.found.values())])
        runs = [run for w in behind if (run := self._run(read, w, scanned))]
        taken = list(heapq.merge(*runs, key=lambda b: (_aware(b.at), b.writer, b.n)))[:limit]
        kept = {(b.writer, b.n) for b in taken}
        # on from the first document not taken; else from after the slots read, re-reading the newest
        # second (it may still fill)
        left = [slot_of(d["at"]) for k, d in read.found.items() if k not in kept]
        nxt = max(start, min([*left, min(scanned + 1, now - 1)]))
        return FeedRead(taken, [(w, *read.lost[w]) for w in sorted(read.lost)], slot=nxt)

    def _heads(self, upto: Position | None) -> tuple[dict[str, int], dict[str, int]]:
        """Every writer's head (capped by `upto`, where given) and the slot of its newest document."""
        heads: dict[str, int] = {}
        slots: dict[str, int] = {}
        for d in self.feed_writers.find({}, {"n": 1, "at": 1}):
            w = str(d["_id"])
            heads[w] = int(d["n"]) if upto is None else min(int(d["n"]), upto.get(w, 0))
            slots[w] = slot_of(d["at"]) if d.get("at") else 0
        return heads, slots

    def _run(self, read: _Reading, writer: str, scanned: int) -> list[FeedBatch]:
        """The writer's documents from its position on, in its order, up to the first one not visible
        or not in the slots read (up to `scanned`)."""
        run: list[FeedBatch] = []
        n = read.position.get(writer, 0) + 1
        while n <= read.heads[writer]:
            doc = read.found.get((writer, n))
            if doc is None:
                later = any(w == writer and k > n for w, k in read.found)
                if not later and read.head_slot[writer] > scanned:
                    break  # in a slot not read yet
                doc = self.feed.find_one(
                    {"_id": feed_id(writer, n)}, READ_FIELDS
                )  # stored late, or a clock off
                if doc is None:
                    if not run and writer not in read.lost:
                        read.lost[writer] = self._pruned(writer, n, read.heads[writer])
                    break
                read.found[(writer, n)] = doc
            elif slot_of(doc["at"]) > scanned:
                break  # looked up ahead of the slots read: taken when they are
            run.append(FeedBatch.from_doc(doc))
            n += 1
        return run

    def _next_slot(self, read: _Reading, behind: Sequence[str], default: int) -> int:
        """The lowest slot of the next documents not found yet of (up to PROBES of) the writers behind,
        looked up by `_id` (those read go into `found`, the pruned into `lost`); `default` if none."""
        slots = []
        probes = 0
        for w in behind:
            n = read.position.get(w, 0) + 1
            while (w, n) in read.found:
                n += 1
            if n > read.heads[w] or w in read.lost:
                continue
            doc = self.feed.find_one({"_id": feed_id(w, n)}, READ_FIELDS)
            if doc is None:
                read.lost[w] = self._pruned(w, n, read.heads[w])
            else:
                read.found[(w, n)] = doc
                slots.append(slot_of(doc["at"]))
            probes += 1
            if probes >= PROBES:
                break
        return min(slots, default=default)

    def _pruned(self, writer: str, first: int, head: int) -> tuple[int, int]:
        """The numbers from `first` on that were pruned before they were read: up to the first that is
        still there (or the head)."""
        after = self.feed.find_one(
            {"_id": {"$gte": feed_id(writer, first), "$lte": feed_id(writer, 10**_DIGITS - 1)}},
            {"n": 1}, sort=[("_id", pymongo.ASCENDING)],
        )  # fmt: skip
        return first, min(int(after["n"]) - 1 if after else head, head)

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
        self.feed.create_index([("slot", pymongo.ASCENDING)])  # the reader's equality (MongoDB, DocumentDB)


@dataclass
class _Reading:
    """One `feed_after`: what it reads after, and what it found."""

    position: Position
    heads: dict[str, int]
    head_slot: dict[str, int]
    limit: int
    found: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # (writer, n) -> document
    lost: dict[str, tuple[int, int]] = field(default_factory=dict)  # writer -> (first, last) pruned

    @property
    def behind(self) -> int:
        """Documents there are up to the heads."""
        return sum(max(0, n - self.position.get(w, 0)) for w, n in self.heads.items())

    @property
    def wanted(self) -> int:
        """Documents to find before the slots stop: `limit`, or all there are if fewer."""
        return min(self.limit, self.behind)

    def add(self, docs: Iterable[dict[str, Any]]) -> int:
        """Keep the documents of a slot that come after the position (up to the heads); how many."""
        got = 0
        for d in docs:
            w, n = str(d["writer"]), int(d["n"])
            if self.position.get(w, 0) < n <= self.heads.get(w, 0) and (w, n) not in self.found:
                self.found[(w, n)] = d
                got += 1
        return got


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _fed_fault(fault: Fault, revision: int) -> dict[str, Any]:
    doc = fault_doc(fault)
    doc["_id"] = fault.id
    doc["revision"] = revision
    return doc
