"""The feed the cluster analyzer reads (`faultline.store.feed`) on a real server (FerretDB): a sequence
per writer without gaps under concurrent writers (and two processes of one writer), a restarted writer
that continues its numbering, a reader that merges the writers and sees every event exactly once while
they write (and across its restarts), replays that add nothing twice, and retention that never passes
the reader silently."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import bson
import pymongo
import pytest

from devtools.mongo import LocalMongo
from faultline import store
from faultline.errors import InputError
from faultline.models import (
    Action,
    Component,
    Entity,
    Fault,
    FaultState,
    HealthEvent,
    NodeUpdate,
    event_id,
    fault_id,
)
from faultline.store.base import CODEC
from faultline.store.faults import event_doc
from faultline.store.feed import FEED_CHUNK, JUMP_AFTER, slot_of
from sinks.mongo import MongoSink
from sources.feed import NO_LABELS, FeedSource, Tick, chunk_records

pytestmark = pytest.mark.integration
T0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)


def event(node: str, i: int, code: str = "XID-13") -> HealthEvent:
    ts = T0 + dt.timedelta(seconds=i)
    return HealthEvent(
        id=event_id(node, "kmsg", "GPU", "0000:3b:00", code, ts), node=node, component=Component.GPU,
        check="xid", code=code, entities=(Entity(type="GPU", id="0000:3b:00"),), healthy=False,
        fatal=False, action=Action.RESTART_APP, generated_at=ts, observed_at=ts,
    )  # fmt: skip


def fault(node: str, count: int) -> Fault:
    return Fault(
        id=fault_id(node, "GPU", "0000:3b:00", "XID-79"), node=node, entity=Entity(type="GPU", id="0000:3b:00"),
        code="XID-79", component=Component.GPU, count=count, first_seen=T0,
        last_seen=T0 + dt.timedelta(seconds=count), fatal=True, action=Action.RESTART_BM, state=FaultState.OPEN,
    )  # fmt: skip


def read_all(
    st: store.Store, position: store.Position | None = None, limit: int = 50, *, carry: bool = True
) -> tuple[list[store.FeedBatch], dict[str, int]]:
    """Read on until caught up, each read from the slot the one before gave (as the analyzer's source
    does; `slot=None` on each: found anew)."""
    out: list[store.FeedBatch] = []
    at = dict(position or {})
    slot = None
    while True:
        got = st.feed_after(at, limit=limit, slot=slot)
        slot = got.slot if carry else None
        assert got.lost == []
        if not got.batches:
            return out, at
        out += got.batches
        for b in got.batches:
            at[b.writer] = b.n


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_writers_number_without_gaps_and_a_reader_sees_each_event_once(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """On both FerretDB backends (PostgreSQL serves concurrent writers in parallel, SQLite one at a time)."""
    mongo: LocalMongo = request.getfixturevalue("mongo" if backend == "sqlite" else "mongo_pg")
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo.uri)
    mongo_db = client[f"t_feed_{uuid.uuid4().hex[:8]}"]
    try:
        _concurrent_writers(mongo, mongo_db)
    finally:
        client.drop_database(mongo_db.name)
        client.close()


def _concurrent_writers(mongo: LocalMongo, mongo_db: Any) -> None:
    writers, batches, per_batch = 6, 15, 3
    done = threading.Event()
    seen: list[str] = []
    numbers: list[tuple[str, int]] = []
    errors: list[BaseException] = []

    def write(w: int) -> None:
        st = store.connect(mongo.uri, mongo_db.name)
        twin = "twin" if w >= 4 else None  # two processes writing one writer's sequence: they race
        try:
            for b in range(batches):
                evs = [event(f"node-{w}", b * per_batch + k) for k in range(per_batch)]
                got = st.record_batch(evs, [(fault(f"node-{w}", b + 1), b + 1)], writer=twin)
                assert got == per_batch
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            st.close()

    def read() -> None:  # reads while the writers write: must miss nothing that comes later
        st = store.connect(mongo.uri, mongo_db.name)
        position: dict[str, int] = {}
        try:
            while True:
                finished = done.is_set()
                got = st.feed_after(position, limit=20)
                assert got.lost == []
                for batch in got.batches:
                    numbers.append((batch.writer, batch.n))
                    seen.extend(d["_id"] for d in batch.events)
                    position[batch.writer] = batch.n
                if finished and not got.batches:
                    return
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            st.close()

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    assert not errors, errors

    for name in [f"node-{w}" for w in range(4)] + ["twin"]:  # every number of each writer once, in order
        assert [n for writer, n in numbers if writer == name] == list(
            range(1, (batches * (2 if name == "twin" else 1)) + 1)
        )
    expected = {event(f"node-{w}", i).id for w in range(writers) for i in range(batches * per_batch)}
    assert Counter(seen) == Counter(expected)  # every event exactly once
    st = store.Store(mongo_db)
    feed, _ = read_all(st)
    for w in range(writers):  # each writer's batches in the order it wrote them
        mine = [b for b in feed if b.events and b.events[0]["node"] == f"node-{w}"]
        assert [b.faults[0]["count"] for b in mine] == list(range(1, batches + 1))
        assert [b.faults[0]["revision"] for b in mine] == list(range(1, batches + 1))


def test_a_batch_written_again_feeds_nothing_twice(mongo_db: Any) -> None:
    st = store.Store(mongo_db)
    evs = [event("n1", i) for i in range(3)]
    st.record_batch(evs, [(fault("n1", 3), 3)])
    st.record_batch(evs, [(fault("n1", 3), 3)])  # a replay: the same events, the same revision
    st.record_batch(evs[:1], [(fault("n1", 2), 2)])  # an older write replayed: not applied, not fed
    feed, _ = read_all(st)
    assert [(b.writer, b.n) for b in feed] == [("n1", 1)]
    assert [d["_id"] for d in feed[0].events] == [e.id for e in evs]
    assert [(d["_id"], d["revision"]) for d in feed[0].faults] == [(fault("n1", 3).id, 3)]
    assert st.feed_heads() == {"n1": 1}


def test_what_was_stored_but_not_fed_is_fed_by_the_replay(mongo_db: Any) -> None:
    """A writer cut off between storing and feeding (killed, or the store gone after the first calls):
    its replay finds the events and the fault revision stored, and feeds them, once."""
    st = store.Store(mongo_db)
    evs = [event("n1", i) for i in range(4)]
    st.record_events(evs[:3])  # stored, never fed
    st.write_fault(fault("n1", 3), 3)
    st.record_batch(evs, [(fault("n1", 3), 3)])
    st.record_batch(evs, [(fault("n1", 3), 3)])
    feed, _ = read_all(st)
    assert len(feed) == 1
    assert sorted(d["_id"] for d in feed[0].events) == sorted(e.id for e in evs)
    assert [d["revision"] for d in feed[0].faults] == [3]
    assert st.fed_keys([evs[0].id, "no-such-event"]) == {evs[0].id}


def test_large_batches_take_several_numbers_and_empty_ones_none(mongo_db: Any) -> None:
    st = store.Store(mongo_db)
    assert st.record_batch([], []) == 0
    assert st.feed_heads() == {}
    evs = [event("n1", i) for i in range(FEED_CHUNK + 10)]
    st.record_batch(evs, [])
    feed, position = read_all(st)
    assert [len(b.events) for b in feed] == [FEED_CHUNK, 10]
    assert position == {"n1": 2}
    assert [d["_id"] for b in feed for d in b.events] == [e.id for e in evs]


def test_retention_keeps_what_the_reader_has_not_read_and_reports_what_it_lost(mongo_db: Any) -> None:
    now = [T0]
    st = store.Store(mongo_db, clock=lambda: now[0])
    for i in range(5):
        st.record_batch([event("n1", i)], [])
        now[0] += dt.timedelta(hours=1)
    # 5 documents written at T0 .. T0+4h; now T0+5h. Older than 2h: 1, 2, 3; read up to 2: 1, 2 only
    assert st.prune_feed(dt.timedelta(hours=2), read_up_to={"n1": 2}) == 2
    got = st.feed_after({"n1": 2})
    assert [b.n for b in got.batches] == [3, 4, 5]
    # without a reader's position (the retention command), the reader at 1 has lost 2 and 3
    assert st.prune_feed(dt.timedelta(hours=2)) == 1
    got = st.feed_after({"n1": 1})
    assert got.batches == [] and got.lost == [("n1", 2, 3)]
    assert [b.n for b in st.feed_after({"n1": 3}).batches] == [4, 5]
    # writers go on after the head, never into pruned numbers
    st.record_batch([event("n1", 99)], [])
    assert [b.n for b in st.feed_after({"n1": 5}).batches] == [6]


def test_the_agents_sink_feeds_what_it_spooled_once_the_store_is_back(tmp_path: Path) -> None:
    """The node agent's sink while the store is away: its spooled events and fault writes reach the feed
    once it is back, each event once (the spool's coalescing keeps the newest write of the fault)."""

    def update(i: int) -> NodeUpdate:
        f = fault("n1", i + 1)
        return NodeUpdate("n1", [f], [(f, i + 1)], [event("n1", i)])

    server = LocalMongo(workdir=tmp_path / "ferretdb")
    server.start()
    sink = MongoSink(server.uri, "agent", spool=tmp_path / "spool", timeout=1.0, feed=True).build(
        "mongo_out", 0, 1
    )
    try:
        sink.write_batch([update(0)])
        port = server.port
        server.stop()
        sink.write_batch([update(1)])
        sink.write_batch([update(2)])
        server = LocalMongo(workdir=tmp_path / "ferretdb", port=port)
        server.start()
        sink.write_batch([update(3)])  # the spool first, then this batch
        st = store.connect(server.uri, "agent")
        try:
            feed, _ = read_all(st)
        finally:
            st.close()
    finally:
        sink.close()
        server.stop()
    assert Counter(d["_id"] for b in feed for d in b.events) == Counter(event("n1", i).id for i in range(4))
    assert [d["revision"] for b in feed for d in b.faults] == [1, 3, 4]


def test_an_agents_sink_without_the_feed_writes_none(
    mongo: LocalMongo, mongo_db: Any, tmp_path: Path
) -> None:
    """The feed is written only where an analyzer reads it (the agent's analyzer_feed): without it the
    sink stores events and faults as before, and no feed document or head."""
    f = fault("n1", 1)
    sink = MongoSink(mongo.uri, mongo_db.name, spool=tmp_path / "spool", timeout=1.0).build("mongo_out", 0, 1)
    try:
        sink.write_batch([NodeUpdate("n1", [f], [(f, 1)], [event("n1", 0)])])
    finally:
        sink.close()
    st = store.Store(mongo_db)
    assert st.has_event(event("n1", 0).id) and st.faults.find_one({"_id": f.id}) is not None
    assert st.feed.count_documents({}) == 0 and st.feed_heads() == {}


def test_the_analyzers_source_skips_what_was_pruned_unread_then_reads_on(
    mongo: LocalMongo, mongo_db: Any
) -> None:
    st = store.Store(mongo_db)
    for i in range(3):
        st.record_batch([event("n1", i)], [])
    st.feed.delete_many({"n": {"$lte": 2}})  # retention ran while the analyzer was away
    lost: list[int] = []
    src = FeedSource(lambda: store.connect(mongo.uri, mongo_db.name), [], on_lost=lost.append)
    part = src.build_part("feed", "feed", None)
    try:
        assert part.next_batch() == [Tick(0, 0, 1 << 16 | 0xFFFF, float("-inf"), [{"writer": "n1", "n": 2}])]
        assert lost == [2]
        *chunks, tick = part.next_batch()
        records = [r for c in chunks for r, _ in chunk_records(c, lambda n: {"zone": f"z-{n}"})]
        assert [(r.id, r.node, r.labels, r.position) for r in records] == [
            (event("n1", 2).id, "n1", {"zone": "z-n1"}, 2 << 16)
        ]  # fmt: skip
        seen = event("n1", 2).observed_at.timestamp()
        assert tick == Tick(1, 1, 2 << 16 | 0xFFFF, seen, [{"writer": "n1", "n": 3}])
        assert part.next_batch() == [] and part.next_awake() is not None  # caught up: it sleeps
    finally:
        part.close()


def test_two_writers_interleaved_are_merged_by_stored_time_each_document_once(mongo_db: Any) -> None:
    """Each writer numbers its own documents; the reader merges them by the time they were stored (ties
    by writer), each writer's in its order, whatever the reads' sizes."""
    now = [T0]
    st = store.Store(mongo_db, clock=lambda: now[0])
    for i, writer in enumerate(["b", "a", "b", "a", "a", "b"]):  # the last two at the same time
        now[0] = T0 + dt.timedelta(seconds=min(i, 4))
        st.record_batch([event(f"node-{writer}", i)], [], writer=writer)
    assert st.feed_heads() == {"a": 3, "b": 3}
    merged = [("b", 1), ("a", 1), ("b", 2), ("a", 2), ("a", 3), ("b", 3)]
    for limit in (1, 2, 50):
        for carry in (True, False):
            feed, position = read_all(st, limit=limit, carry=carry)
            assert [(b.writer, b.n) for b in feed] == merged  # none lost, none twice
            assert position == {"a": 3, "b": 3}
    # read from the middle of both: only what comes after each writer's number
    feed, _ = read_all(st, {"a": 2, "b": 1})
    assert [(b.writer, b.n) for b in feed] == [("b", 2), ("a", 3), ("b", 3)]
    # a batch of other nodes' records goes to the node of its first one unless a writer is named
    st.record_batch([event("node-c", 10), event("node-a", 11)], [])
    assert st.feed_heads() == {"a": 3, "b": 3, "node-c": 1}
    with pytest.raises(InputError, match="feed writer 'x/y'"):
        st.record_batch([event("node-c", 12)], [], writer="x/y")


def test_a_restarted_writer_continues_its_numbering(mongo: LocalMongo, mongo_db: Any) -> None:
    """A writer's next process (the agent restarted) continues after its last number, also when it died
    between its insert and raising its head, and after its documents were pruned."""
    first = store.connect(mongo.uri, mongo_db.name)
    try:
        for i in range(2):
            first.record_batch([event("n1", i)], [])
    finally:
        first.close()
    st = store.connect(mongo.uri, mongo_db.name)  # the restarted agent
    try:
        st.record_batch([event("n1", 2)], [])
        assert st.feed_heads() == {"n1": 3}
        st.feed_writers.update_one({"_id": "n1"}, {"$set": {"n": 1}})  # died before raising its head to 3
        st.record_batch([event("n1", 3)], [])  # tries 2 and 3 (taken), then 4
        assert st.feed_heads() == {"n1": 4}
        assert st.prune_feed(dt.timedelta(0)) == 4
        st.record_batch([event("n1", 4)], [])
        assert st.feed_after({}).lost == [("n1", 1, 4)]  # a reader from the start: 1..4 pruned unread
        feed, position = read_all(st, {"n1": 4})
        assert [(b.n, [d["_id"] for d in b.events]) for b in feed] == [(5, [event("n1", 4).id])]
        assert position == {"n1": 5}
    finally:
        st.close()


def drain_source(part: Any) -> tuple[list[Any], list[Any]]:
    """Everything a source partition hands on until it is caught up: its records and ticks."""
    records, ticks = [], []
    while batch := part.next_batch():
        for item in batch:
            if isinstance(item, Tick):
                ticks.append((item.position, item.watermark, item.feed))
            else:
                records += [r for r, _ in chunk_records(item, lambda _n: NO_LABELS)]
    return records, ticks


def test_an_analyzer_restarted_mid_stream_takes_each_record_once_across_writers(
    mongo: LocalMongo, mongo_db: Any
) -> None:
    """Partitions checkpointed at different ticks, then a restart from the lowest, while the writers wrote
    on (a slow writer's documents stored with earlier times than some already read, a new writer): each
    partition takes in every record exactly once, before or after the restart."""
    now = [T0]
    st = store.Store(mongo_db, clock=lambda: now[0])

    def write(writer: str, i: int, at: int) -> None:
        now[0] = T0 + dt.timedelta(seconds=at)
        st.record_batch([event(writer, i)], [])

    for i, (w, at) in enumerate([("a", 1), ("b", 2), ("c", 3), ("a", 4), ("b", 5), ("c", 6), ("a", 7)]):
        write(w, i, at)
    connect = lambda: store.connect(mongo.uri, mongo_db.name)  # noqa: E731
    part = FeedSource(connect, [], batch=2).build_part("feed", "feed", None)
    try:
        records, ticks = drain_source(part)
    finally:
        part.close()
    assert len(records) == 7 and len(ticks) >= 3
    # three partitions: one never checkpointed, one at the first tick, one at the last but one
    marks = [(0, [])] + [(pos, fed) for pos, _wm, fed in (ticks[0], ticks[-2])]
    taken = [Counter(r.id for r in records if r.position <= upto) for upto, _ in marks]
    for i, (w, at) in enumerate([("c", 2), ("d", 3), ("b", 8), ("a", 9), ("c", 10)], start=7):
        write(w, i, at)  # c's first ones slower than b's: stored before what was read already
    start = [(upto, store.position_from(fed)) for upto, fed in marks]
    part = FeedSource(connect, start, batch=2).build_part("feed", "feed", None)
    try:
        again, ticks2 = drain_source(part)
    finally:
        part.close()
    everything = Counter({event(w, i).id: 1 for i, (w, _at) in enumerate(
        [("a", 1), ("b", 2), ("c", 3), ("a", 4), ("b", 5), ("c", 6), ("a", 7),
         ("c", 2), ("d", 3), ("b", 8), ("a", 9), ("c", 10)])})  # fmt: skip
    for (upto, _), before in zip(marks, taken, strict=True):
        after = Counter(r.id for r in again if r.position > upto)  # what this partition takes in now
        assert before + after == everything
    positions = [pos for pos, _wm, _fed in ticks2]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert store.position_from(ticks2[-1][2]) == {"a": 4, "b": 3, "c": 4, "d": 1}


def test_pruned_before_read_is_counted_lost_per_writer_while_the_others_read_on(
    mongo: LocalMongo, mongo_db: Any
) -> None:
    now = [T0]
    st = store.Store(mongo_db, clock=lambda: now[0])
    for i in range(3):
        st.record_batch([event("a", i)], [])
    now[0] += dt.timedelta(hours=2)
    st.record_batch([event("a", 3)], [])
    st.record_batch([event("b", 4)], [])
    st.record_batch([event("b", 5)], [])
    # the analyzer has read a's first only; retention by age alone (the retention command) takes a's 1..3
    assert st.prune_feed(dt.timedelta(hours=1)) == 3
    got = st.feed_after({"a": 1})
    assert got.lost == [("a", 2, 3)] and [(b.writer, b.n) for b in got.batches] == [("b", 1), ("b", 2)]
    now[0] += dt.timedelta(seconds=1)
    assert st.prune_feed(dt.timedelta(0), read_up_to={"a": 4, "b": 1}) == 2  # never past the reader
    assert sorted((d["writer"], d["n"]) for d in st.feed.find({})) == [("b", 2)]
    lost: list[int] = []
    part = FeedSource(lambda: store.connect(mongo.uri, mongo_db.name), [(1 << 16 | 0xFFFF, {"a": 1})],
                      on_lost=lost.append).build_part("feed", "feed", None)  # fmt: skip
    try:
        records, ticks = drain_source(part)
    finally:
        part.close()
    assert lost == [3, 1]  # a's 2..4 and b's 1 were pruned unread; b's 2 is read
    assert [r.id for r in records] == [event("b", 5).id]
    assert store.position_from(ticks[-1][2]) == {"a": 4, "b": 2}


def test_documents_stored_late_or_by_a_writer_whose_clock_is_off_are_read_once(mongo_db: Any) -> None:
    """The reader reads a second of stored time at a time; a document whose second it had read already
    (stored late, or by a writer whose clock is behind) and one far ahead of its clock are still read,
    each once, in the writer's order."""
    now = [T0]
    reader = store.Store(mongo_db, clock=lambda: now[0])
    for i in range(6):
        now[0] = T0 + dt.timedelta(seconds=i)
        reader.record_batch([event("node-a", i)], [], writer="a")
    feed, position = read_all(reader)
    assert [(b.writer, b.n) for b in feed] == [("a", n) for n in range(1, 7)]
    behind = store.Store(mongo_db, clock=lambda: T0 + dt.timedelta(seconds=1))  # seconds read already
    ahead = store.Store(mongo_db, clock=lambda: T0 + dt.timedelta(hours=2))
    behind.record_batch([event("node-b", 10)], [], writer="b")
    behind.record_batch([event("node-b", 11)], [], writer="b")
    ahead.record_batch([event("node-c", 12)], [], writer="c")
    now[0] = T0 + dt.timedelta(seconds=7)
    reader.record_batch([event("node-a", 13)], [], writer="a")
    got = reader.feed_after(position, slot=slot_of(T0 + dt.timedelta(seconds=5)))
    assert sorted((b.writer, b.n) for b in got.batches) == [("a", 7), ("b", 1), ("b", 2), ("c", 1)]
    assert [b.n for b in got.batches if b.writer == "b"] == [1, 2]
    for b in got.batches:
        position[b.writer] = b.n
    assert reader.feed_after(position, slot=got.slot).batches == []


def test_a_quiet_feed_is_not_read_second_by_second(mongo: LocalMongo) -> None:
    """After an hour without a document, the next one is found with a few reads, not one per second."""
    finds: list[dict[str, Any]] = []

    class Listener(pymongo.monitoring.CommandListener):
        def started(self, event: pymongo.monitoring.CommandStartedEvent) -> None:
            if event.command_name == "find" and event.command.get("find") == "feed":
                finds.append(dict(event.command.get("filter") or {}))

        def succeeded(self, event: pymongo.monitoring.CommandSucceededEvent) -> None:
            pass

        def failed(self, event: pymongo.monitoring.CommandFailedEvent) -> None:
            pass

    client: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo.uri, event_listeners=[Listener()])
    db = client[f"t_feed_{uuid.uuid4().hex[:8]}"]
    try:
        now = [T0]
        st = store.Store(db, clock=lambda: now[0])
        st.ensure_indexes()
        st.record_batch([event("node-a", 0)], [], writer="a")
        feed, position = read_all(st)
        assert [b.n for b in feed] == [1]
        got = st.feed_after(position)
        assert got.batches == [] and got.slot is not None
        now[0] = T0 + dt.timedelta(hours=1)
        st.record_batch([event("node-b", 1)], [], writer="b")  # a writer not seen before
        st.record_batch([event("node-a", 2)], [], writer="a")
        finds.clear()
        later = st.feed_after(position, slot=got.slot)
        assert [(b.writer, b.n) for b in later.batches] == [("a", 2), ("b", 1)]  # same time: by writer
        assert len(finds) <= 3 + JUMP_AFTER, finds  # 8 empty seconds, the writers' next ones, their second
    finally:
        client.drop_database(db.name)
        client.close()


def test_feed_documents_of_every_format_so_far_are_read_alike(mongo: LocalMongo, mongo_db: Any) -> None:
    """Documents are written compressed with their newest time (`zrecords`, `newest`); those written
    before, uncompressed (`records`) or with the records as fields (v1), without `newest`, are read the
    same: the same records, and the same watermark from decoding them."""
    now = [T0]
    st = store.Store(mongo_db, clock=lambda: now[0])
    st.record_batch([event("a", 0), event("a", 1)], [])  # today's format
    (doc,) = st.feed.find({})
    assert (
        "zrecords" in doc and "records" not in doc and doc["newest"] == event("a", 1).observed_at.timestamp()
    )
    older = [event("b", 2), event("b", 3)]
    body = {"events": [event_doc(e) for e in older], "faults": []}
    for n, e in enumerate(older, start=1):
        st.events.insert_one(event_doc(e))
        now[0] += dt.timedelta(seconds=1)
        one = {"events": [body["events"][n - 1]], "faults": []}
        fields = {"records": bson.Binary(bson.encode(one, codec_options=CODEC))} if n == 1 else one  # then v1
        st._insert_numbered("b", {"at": now[0], "slot": slot_of(now[0]), **fields, "keys": [e.id]})
    part = FeedSource(lambda: store.connect(mongo.uri, mongo_db.name), []).build_part("feed", "feed", None)
    try:
        records, ticks = drain_source(part)
    finally:
        part.close()
    assert [(r.id, r.node, r.t) for r in records] == [
        (e.id, e.node, e.observed_at.timestamp()) for e in (event("a", 0), event("a", 1), *older)
    ]
    assert ticks[-1][1] == event("b", 3).observed_at.timestamp()  # the newest, found by decoding
