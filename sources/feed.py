"""The cluster analyzer's input: the store's feed (`faultline.store.feed`), every writer's sequence read
from a position (a number per writer) and merged, handed on as feed documents for the analyzer's
workers to decode into `patterns.cluster.Record`s with their node's labels (`chunk_records`).

One partition (the merge is one reader): it polls `feed_after` every `poll` seconds while caught up
and, while there is more, reads on in a thread of its own while the flow decodes what it read. After
each read it hands on the documents read, undecoded, cut into at most `chunks` `Chunk`s (so that the
workers of every process share the decoding, which is most of the analyzer's work:
`dataflows.cluster`), then a `Tick`: everything up to `position` has been handed on in that read's
chunks, `feed` the same place as `{writer, n}` documents (the partitions' checkpoint says how far they
are). `position` counts the feed documents handed on (times 2**16, plus a record's index in its
document), one order for the windows and the derived faults' revisions. The watermark is the newest
event time read so far (each document's `newest`, so the reader need not decode it), never ahead of
this machine's clock by more than MAX_AHEAD (a node whose clock runs ahead must not age every window
out); each document in a chunk carries the watermark before it, so a record's watermark is the one it
would have in a single reading.

The merged order is the documents' stored time, ties by writer and number, each writer's in its own
order: not event time, which would hold every writer back until the slowest had shown it is past that
time (a writer that went quiet, forever). A slow writer's records come later, then, and the windows
take them as late: still counted where they are within `within` of the watermark, as they would be in
one global order, where the slow writer's batch also comes when it is written.

The source keeps no resume state of its own (Bytewax's recovery is not used): it starts where the
store's checkpoints say (`Store.analyzer_positions`): after the lowest one's feed position, and up to
each higher checkpoint's it reads only what the partitions there have taken in, numbering it up to
their `position` (the ticks in between all went to every partition, so they hold the same documents),
so a partition ignores exactly what it took in before the restart, whatever order the writers' newer
documents would now merge in. A store that cannot be reached is waited for (its error logged once per
outage); numbers pruned before they were read are skipped, logged and counted.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from faultline import store
from faultline.errors import TransientError
from faultline.store.feed import epoch as _epoch
from patterns.cluster import Record

log = logging.getLogger(__name__)
MAX_AHEAD = 300.0  # seconds an event time may run ahead of this clock before it stops moving the watermark
NO_LABELS: Mapping[str, str] = {}
Doc = tuple[int, float, float, store.FeedBatch]  # (place in the reading, watermark before it, ceiling, it)


class Chunk(NamedTuple):
    """Part `part` of read `read`'s feed documents, undecoded (decoded by `chunk_records`)."""

    read: int
    part: int
    docs: tuple[Doc, ...]


class Tick(NamedTuple):
    """Read `read` is handed on whole in `chunks` chunks: every feed document up to `position`, `feed`
    the same place as `{writer, n}` documents; `watermark` the newest event time read up to there."""

    read: int
    chunks: int
    position: int
    watermark: float
    feed: list[dict[str, Any]]


Item = Chunk | Tick


def records(batch: store.FeedBatch, labels: Callable[[str], Mapping[str, str]], seq: int) -> list[Record]:
    """A feed document's events and fault changes as records, in its order; `seq`: its place in the
    merged reading."""
    out = []
    for i, d in enumerate(batch.events):
        entity = (d.get("entities") or [{}])[0]
        out.append(Record(
            position=seq << 16 | i, kind="events", id=str(d["_id"]), t=_epoch(d["observed_at"]),
            node=str(d["node"]), code=str(d["code"]), component=str(d.get("component", "")),
            entity_type=str(entity.get("type", "")), entity_id=str(entity.get("id", "")),
            healthy=bool(d.get("healthy")), fatal=bool(d.get("fatal")), metadata=d.get("metadata") or {},
            labels=labels(str(d["node"])),
        ))  # fmt: skip
    for j, d in enumerate(batch.faults, start=len(batch.events)):
        entity = d.get("entity") or {}
        out.append(Record(
            position=seq << 16 | j, kind="faults", id=f"{d['_id']}@{d.get('revision')}",
            t=_epoch(d["last_seen"]), node=str(d["node"]), code=str(d["code"]),
            component=str(d.get("component", "")), entity_type=str(entity.get("type", "")),
            entity_id=str(entity.get("id", "")), fatal=bool(d.get("fatal")), state=str(d.get("state", "")),
            metadata=d.get("metadata") or {}, labels=labels(str(d["node"])),
            opened=_epoch(d["first_seen"]) if d.get("first_seen") else 0.0,
        ))  # fmt: skip
    return out


def handed_on(
    read: int, docs: Sequence[Doc], chunks: int, seq: int, watermark: float, feed: list[dict[str, Any]]
) -> list[Item]:
    """Read `read` as the source hands it on: its documents in at most `chunks` chunks, then its tick
    (everything up to `seq`, the place of its last document in the reading)."""
    size = max(1, -(-len(docs) // chunks))  # documents a chunk, rounded up
    out: list[Item] = [Chunk(read, i, tuple(docs[start : start + size]))
                       for i, start in enumerate(range(0, len(docs), size))]  # fmt: skip
    out.append(Tick(read, len(out), seq << 16 | 0xFFFF, watermark, feed))
    return out


def chunk_records(chunk: Chunk, labels: Callable[[str], Mapping[str, str]]) -> list[tuple[Record, float]]:
    """A chunk's records in its order, each with the watermark up to it (its own time included)."""
    out = []
    for seq, before, ceiling, batch in chunk.docs:
        watermark = before
        for r in records(batch, labels, seq):
            watermark = max(watermark, min(r.t, ceiling))
            out.append((r, watermark))
    return out


class _FeedPartition(StatefulSourcePartition[Item, None]):
    def __init__(self, src: FeedSource) -> None:
        self.src = src
        self.store = src.connect()
        marks = sorted(src.start, key=lambda m: m[0]) or [(0, {})]
        self.seq = marks[0][0] >> 16
        self.position = dict(marks[0][1])
        self.stages = [(u >> 16, dict(p)) for u, p in marks[1:] if u >> 16 > self.seq]
        self.watermark = src.watermark
        self.awake: dt.datetime | None = None
        self.down_since: float | None = None
        self.slot: int | None = None  # the feed's slot the next read starts at (`Store.feed_after`)
        self.read = 0  # the reads handed on (a tick each), this run
        self.ahead: Future[store.FeedRead] | None = None  # the next read, under way while the flow decodes
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="feed-read")

    def _read(
        self, position: store.Position, upto: store.Position | None, slot: int | None
    ) -> store.FeedRead:
        with store.unreachable_is_transient("reading the feed"):
            return self.store.feed_after(position, self.src.batch, upto=upto, slot=slot)

    def next_batch(self) -> list[Item]:
        self.src.beat()
        if self.src.stop is not None and self.src.stop.is_set():
            raise StopIteration
        try:
            if self.ahead is not None:
                ahead, self.ahead = self.ahead, None
                got = ahead.result()
            else:
                got = self._read(dict(self.position), self._upto(), self.slot)
        except TransientError as exc:
            if self.down_since is None:
                self.down_since = time.monotonic()
                log.warning("store unreachable: the feed is not read", extra={"reason": str(exc)})
            self._sleep(min(max(exc.delay, self.src.poll), 5.0))
            return []
        if self.down_since is not None:
            log.info("store reachable again: reading the feed",
                     extra={"after_s": round(time.monotonic() - self.down_since, 1)})  # fmt: skip
            self.down_since = None
        self.slot = got.slot
        for writer, first, last in got.lost:
            log.warning("feed documents pruned before they were read: skipped",
                        extra={"writer": writer, "first": first, "last": last,
                               "count": last - first + 1})  # fmt: skip
            self.src.on_lost(last - first + 1)
            self.seq += 1  # a place of its own in the merged reading, so the tick after it moves on
            self.position[writer] = last
        docs: list[Doc] = []
        ceiling = time.time() + MAX_AHEAD
        for batch in got.batches:
            self.seq += 1
            docs.append((self.seq, self.watermark, ceiling, batch))
            self.watermark = max(self.watermark, min(batch.newest, ceiling))
            self.position[batch.writer] = batch.n
        staged = False
        while self.stages and all(self.position.get(w, 0) >= n for w, n in self.stages[0][1].items()):
            # what the partitions at this checkpoint took in is handed on again: on from their position
            self.seq = max(self.seq, self.stages.pop(0)[0])
            staged = True
        if not docs and not got.lost and not staged:
            self._sleep(self.src.poll)
            return []
        self.awake = None
        # the next read while the workers decode this one (the store's time and the decoding overlap)
        self.ahead = self.reader.submit(self._read, dict(self.position), self._upto(), self.slot)
        out = handed_on(self.read, docs, self.src.chunks, self.seq, self.watermark,
                        store.position_doc(self.position))  # fmt: skip
        self.read += 1
        return out

    def _upto(self) -> store.Position | None:
        """How far the next read may go: up to the next checkpoint's position while one is staged."""
        return dict(self.stages[0][1]) if self.stages else None

    def _sleep(self, seconds: float) -> None:
        self.awake = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)

    def next_awake(self) -> dt.datetime | None:
        return self.awake

    def snapshot(self) -> None:
        return None  # progress lives in the store's checkpoints, written after the windows took it in

    def close(self) -> None:
        self.reader.shutdown(wait=True, cancel_futures=True)  # a read under way ends before its client does
        self.store.close()


class FeedSource(FixedPartitionedSource[Item, None]):
    """`connect` makes the partition's store (in the worker: Bytewax may fork); `start` the partitions'
    checkpoints as `(position, feed position)` (`Store.analyzer_positions`; empty: the feed from its
    beginning) and `watermark` the newest event time read before the lowest (its checkpoints'), so a
    restart judges late records as the run before it did; setting `stop` ends the input. `chunks`: the
    most chunks a read is cut into (the flow's workers, over every process, times a few). `reader`:
    whether this process has the partition (in Bytewax's cluster mode one process reads: the one
    holding the lease). `beat`: called at every read (the flow's liveness: Bytewax asks for the next
    read only while the flow moves)."""

    def __init__(
        self, connect: Callable[[], store.Store], start: Sequence[tuple[int, store.Position]], *,
        poll: float = 0.5, batch: int = 1024,
        stop: threading.Event | None = None, on_lost: Callable[[int], None] = lambda _n: None,
        watermark: float = float("-inf"), chunks: int = 1, reader: bool = True,
        beat: Callable[[], None] = lambda: None,
    ) -> None:  # fmt: skip
        if chunks < 1:
            raise ValueError(f"chunks must be at least 1, not {chunks}")
        self.connect = connect
        self.chunks = chunks
        self.reader = reader
        self.start = start
        self.watermark = watermark
        self.poll = poll
        self.batch = batch
        self.stop = stop
        self.on_lost = on_lost
        self.beat = beat

    def list_parts(self) -> list[str]:
        return ["feed"] if self.reader else []

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _FeedPartition:
        return _FeedPartition(self)
