"""The agent's MongoDB sink while MongoDB is away: writes go to the on-disk spool, nothing is lost, and
once the server is back they are applied in order with nothing duplicated, with or without new writes."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pymongo
import pytest

from devtools import procs
from devtools.mongo import LocalMongo
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
from sinks.mongo import MongoSink, Spool

pytestmark = pytest.mark.integration
T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def fault(code: str, count: int) -> Fault:
    return Fault(
        id=fault_id("n1", "GPU", "0000:3b:00", code), node="n1", entity=Entity(type="GPU", id="0000:3b:00"),
        code=code, component=Component.GPU, count=count, first_seen=T0, last_seen=T0 + dt.timedelta(seconds=count),
        fatal=True, action=Action.COMPONENT_RESET, state=FaultState.OPEN,
    )  # fmt: skip


def update(*writes: tuple[Fault, int]) -> NodeUpdate:
    events = [
        HealthEvent(
            id=event_id("n1", "nvml", "GPU", "0000:3b:00", f.code, f.last_seen),
            node="n1",
            component=Component.GPU,
            check="xid",
            code=f.code,
            entities=(f.entity,),
            healthy=False,
            fatal=True,
            action=f.action,
            generated_at=T0,
            observed_at=f.last_seen,
        )
        for f, _ in writes
    ]
    return NodeUpdate("n1", [f for f, _ in writes], list(writes), events)


def test_outage_spools_then_drains_in_order(tmp_path: Path) -> None:
    server = LocalMongo(workdir=tmp_path / "ferretdb")
    server.start()
    spool_path = tmp_path / "state" / "mongo-spool.jsonl"
    sink = MongoSink(server.uri, "agent", spool=spool_path, timeout=1.0).build("mongo_out", 0, 1)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(server.uri)
    try:
        sink.write_batch([update((fault("XID-48", 1), 1))])
        port = server.port
        server.stop()  # MongoDB goes away

        sink.write_batch([update((fault("XID-48", 2), 2), (fault("XID-79", 1), 1))])
        sink.write_batch([update((fault("XID-48", 2), 2))])  # a replayed write is harmless
        sink.write_batch([update((fault("XID-48", 3), 3))])
        spool = Spool(spool_path)
        assert [(f.code, rev) for f, rev in spool.items()] == [
            ("XID-48", 2), ("XID-79", 1), ("XID-48", 2), ("XID-48", 3)
        ]  # fmt: skip

        server = LocalMongo(workdir=tmp_path / "ferretdb", port=port)  # back, with its data
        server.start()
        sink.write_batch([update((fault("XID-13", 1), 1))])
        assert not spool_path.exists()
        faults = client["agent"]["faults"]
        assert faults.count_documents({}) == 3
        assert faults.find_one({"code": "XID-48"})["count"] == 3  # the latest revision won, applied once
        assert {d["code"] for d in faults.find()} == {"XID-48", "XID-79", "XID-13"}
        # every event, the replayed one once: XID-48 at counts 1, 2, 3; XID-79; XID-13
        assert client["agent"]["health_events"].count_documents({}) == 5
    finally:
        sink.close()
        client.close()
        server.stop()


def test_spool_is_bounded_and_counts_what_it_drops(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.jsonl", max_items=3)
    spool.append([(fault(f"XID-{i}", 1), 1) for i in range(2)])
    spool.append([(fault(f"XID-{i}", 1), 1) for i in range(2, 5)])
    assert [f.code for f, _ in spool.items()] == ["XID-2", "XID-3", "XID-4"]
    assert (len(spool), spool.dropped) == (3, 2)


def test_the_spool_drains_once_the_store_is_back_with_no_further_batch(tmp_path: Path) -> None:
    """A node that stays quiet after an outage (found by the chaos suite's store-outage: its spooled
    events waited for the detector's resend, a minute later)."""
    server = LocalMongo(workdir=tmp_path / "ferretdb").start()
    port = server.port
    server.stop()  # away before the first write
    spool_path = tmp_path / "state" / "mongo-spool.jsonl"
    sink = MongoSink(server.uri, "agent", spool=spool_path, timeout=1.0, retry=0.2).build("mongo_out", 0, 1)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(server.uri)
    try:
        sink.write_batch([update((fault("XID-79", 1), 1))])
        assert [f.code for f, _ in Spool(spool_path).items()] == ["XID-79"]
        server = LocalMongo(workdir=tmp_path / "ferretdb", port=port).start()  # back; no batch follows
        procs.wait_for("the spool drained", lambda: not spool_path.exists(), 30)
        assert [d["code"] for d in client["agent"]["faults"].find()] == ["XID-79"]
        assert client["agent"]["health_events"].count_documents({}) == 1
    finally:
        sink.close()
        client.close()
        server.stop()


def test_the_sink_spools_after_2_s_unreachable_but_lets_a_reached_store_take_15_s(tmp_path: Path) -> None:
    """An unreachable store is given `timeout` before the writes go to the spool; a call to a store that
    was reached may take `call_timeout` (a loaded store finishes a write it has begun: one given up on
    and sent again is done twice)."""
    sink = MongoSink("mongodb://127.0.0.1:9/", "agent", spool=tmp_path / "spool.jsonl").build(
        "mongo_out", 0, 1
    )
    try:
        client = sink.store.db.client
        pool = client.options.pool_options
        assert (client.options.server_selection_timeout, pool.connect_timeout, pool.socket_timeout) == (
            2.0, 2.0, 15.0,
        )  # fmt: skip
        sink.write_batch([update((fault("XID-79", 1), 1))])  # nothing listens there: spooled
        assert [f.code for f, _ in Spool(tmp_path / "spool.jsonl").items()] == ["XID-79"]
    finally:
        sink.close()
