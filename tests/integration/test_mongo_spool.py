"""The agent's MongoDB sink while MongoDB is away: writes go to the on-disk spool, nothing is lost, and
once the server is back they are applied in order with nothing duplicated, with or without new writes."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
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
from sinks.mongo import MongoSink
from sinks.spool import Spool

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
    spool_path = tmp_path / "state" / "mongo-spool"
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
        assert len(Spool(spool_path)) == 0 and not list(spool_path.glob("spool-*"))
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


def test_the_spool_drains_once_the_store_is_back_with_no_further_batch(tmp_path: Path) -> None:
    """A node that stays quiet after an outage (found by the chaos suite's store-outage: its spooled
    events waited for the detector's resend, a minute later)."""
    server = LocalMongo(workdir=tmp_path / "ferretdb").start()
    port = server.port
    server.stop()  # away before the first write
    spool_path = tmp_path / "state" / "mongo-spool"
    sink = MongoSink(server.uri, "agent", spool=spool_path, timeout=1.0, retry=0.2).build("mongo_out", 0, 1)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(server.uri)
    try:
        sink.write_batch([update((fault("XID-79", 1), 1))])
        assert [f.code for f, _ in Spool(spool_path).items()] == ["XID-79"]
        server = LocalMongo(workdir=tmp_path / "ferretdb", port=port).start()  # back; no batch follows
        procs.wait_for("the spool drained", lambda: not list(spool_path.glob("spool-*")), 30)
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
    sink = MongoSink("mongodb://127.0.0.1:9/", "agent", spool=tmp_path / "spool").build("mongo_out", 0, 1)
    try:
        client = sink.store.db.client
        pool = client.options.pool_options
        assert (client.options.server_selection_timeout, pool.connect_timeout, pool.socket_timeout) == (
            2.0, 2.0, 15.0,
        )  # fmt: skip
        sink.write_batch([update((fault("XID-79", 1), 1))])  # nothing listens there: spooled
        assert [f.code for f, _ in Spool(tmp_path / "spool").items()] == ["XID-79"]
    finally:
        sink.close()


# -- a long outage: the spool fills past its bound, then drains within the agent's memory --------------------
LIMIT_MIB = 256  # the agent's memory limit in the chart (agent.resources.limits.memory)
OUTAGE_EVENTS = 180_000  # matches during the outage, one event each; every 2nd also changes a fault
OUTAGE_FAULTS = 50  # distinct faults whose counts rise (their writes coalesce in a drain)
FILL_BATCH = 4000  # updates per batch of the dataflow


def _outage_update(i: int) -> NodeUpdate:
    """The i-th match of the outage: its event (a kernel line's worth of message), and every 2nd time a
    write of fault i/2 % OUTAGE_FAULTS, its count rising, with revision i."""
    at = T0 + dt.timedelta(milliseconds=i)
    event = HealthEvent(
        id=f"outage-{i}", node="n1", component=Component.GPU, check="xid", code="XID-13",
        entities=(Entity(type="GPU", id="0000:3b:00"),), healthy=False, fatal=False, action=Action.NONE,
        message=f"NVRM: Xid (PCI:0000:3b:00): 13, pid={i}, name=python3, Graphics Exception: ESR 0x{i:08x}",
        generated_at=at, observed_at=at,
    )  # fmt: skip
    writes = []
    if i % 2 == 0:
        code = f"XID-{1000 + i // 2 % OUTAGE_FAULTS}"
        f = fault(code, i // 2 // OUTAGE_FAULTS + 1).model_copy(
            update={"fatal": False, "action": Action.NONE}
        )
        writes = [(f, i)]
    return NodeUpdate("n1", [f for f, _ in writes], writes, [event])


def fill(spool_dir: str, max_bytes: int) -> None:
    """In a process of its own: the sink's batches during an outage (nothing listens at the address)."""
    from faultline import metrics  # noqa: PLC0415

    sink = MongoSink("mongodb://127.0.0.1:9/", "agent", spool=Path(spool_dir), timeout=0.2,
                     spool_max_bytes=max_bytes).build("mongo_out", 0, 1)  # fmt: skip
    try:
        for start in range(0, OUTAGE_EVENTS, FILL_BATCH):
            sink.write_batch([_outage_update(i) for i in range(start, start + FILL_BATCH)])
    finally:
        sink.close()
    dropped = {k: metrics.REGISTRY.get_sample_value("faultline_spool_dropped_total", {"kind": k}) for k in
               ("event", "fault")}  # fmt: skip
    print(
        json.dumps({"dropped": dropped, "bytes": metrics.REGISTRY.get_sample_value("faultline_spool_bytes")})
    )


def peak_rss_kib() -> int:
    """This process's peak RSS since it started (VmHWM). Not getrusage's ru_maxrss: a child started
    through vfork and exec inherits its parent's peak there (the suite's pytest process, 258 MiB after a
    thousand tests, was once read as the drain's own peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/self/status")


def drain_after(uri: str, database: str, spool_dir: str, calls_path: str) -> None:
    """In a process of its own: the agent once the store is back, its first batch draining the spool;
    each store call it makes is logged to `calls_path` (kept on disk, not in this process's memory);
    prints its peak RSS before and after the drain."""
    from faultline import store  # noqa: PLC0415

    st = store.connect(uri, database, timeout=2.0, call_timeout=15.0)
    calls = Path(calls_path).open("w")  # noqa: SIM115 - closed below, after the last call
    record_events, write_fault = st.record_events, st.write_fault

    def logged_events(events: Any) -> int:
        events = list(events)
        calls.write("".join(f"event {e.id}\n" for e in events))
        return record_events(events)

    def logged_fault(f: Fault, revision: int) -> bool:
        calls.write(f"fault {f.code} {revision}\n")
        return write_fault(f, revision)

    st.record_events, st.write_fault = logged_events, logged_fault  # type: ignore[method-assign,assignment]
    sink = MongoSink(uri, database, spool=Path(spool_dir), shared=st).build("mongo_out", 0, 1)
    before = peak_rss_kib()
    started = time.monotonic()
    try:
        sink.write_batch([_outage_update(OUTAGE_EVENTS)])  # the spool first, then this batch
    finally:
        sink.close()
        calls.close()
        st.close()
    peak = peak_rss_kib()
    print(json.dumps({"before_kib": before, "peak_kib": peak, "seconds": time.monotonic() - started}))


def _run(call: str) -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", f"from tests.integration import test_mongo_spool as t; t.{call}"],
        cwd=root, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.redteam
@pytest.mark.timeout(300)  # about a minute: 180k events spooled, then 64 MiB into FerretDB
def test_a_long_outage_fills_the_spool_to_its_bound_and_drains_within_the_memory_limit(
    mongo: LocalMongo, mongo_db: Any, tmp_path: Path
) -> None:
    """180k events (and 90k fault writes) during an outage, against the default 64 MiB bound: health
    events are refused from 3/4 of it, fault writes only once it is full, every refusal counted. Once the
    store is back, the drain's process stays under the agent's 256 MiB limit (peak RSS, the interpreter
    and its imports included), and everything accepted reaches the store, in order."""
    spool_dir = tmp_path / "mongo-spool"
    filled = _run(f"fill({str(spool_dir)!r}, {64 << 20})")
    dropped_events, dropped_faults = int(filled["dropped"]["event"]), int(filled["dropped"]["fault"])
    assert dropped_events > 0 and dropped_faults > 0  # past its bound, for both kinds
    assert 0.75 * (64 << 20) - (1 << 20) < filled["bytes"] <= 64 << 20
    accepted_events = OUTAGE_EVENTS - dropped_events
    accepted_faults = len(range(0, OUTAGE_EVENTS, 2)) - dropped_faults
    spooled = sum(p.stat().st_size for p in spool_dir.glob("spool-*.jsonl"))
    assert spooled == filled["bytes"]

    calls = tmp_path / "calls.txt"
    drained = _run(f"drain_after({mongo.uri!r}, {mongo_db.name!r}, {str(spool_dir)!r}, {str(calls)!r})")
    print(f"spool {spooled / 2**20:.1f} MiB; drain RSS {drained['before_kib'] / 1024:.0f} MiB before, "
          f"{drained['peak_kib'] / 1024:.0f} MiB peak, {drained['seconds']:.1f} s")  # fmt: skip
    assert drained["peak_kib"] < LIMIT_MIB * 1024
    assert not list(spool_dir.glob("spool-*"))

    # everything accepted reached the store: the first events of the outage and the batch after it
    stored = {d["_id"] for d in mongo_db["health_events"].find({}, {"_id": 1})}
    assert stored == {f"outage-{i}" for i in [*range(accepted_events), OUTAGE_EVENTS]}
    # in order: the drain's calls, events as they came (each once); each fault's writes in rising order
    sent = [line.split() for line in calls.read_text().splitlines()]
    assert [c[1] for c in sent if c[0] == "event"] == [
        f"outage-{i}" for i in [*range(accepted_events), OUTAGE_EVENTS]
    ]
    revisions: dict[str, list[int]] = {}
    for c in sent:
        if c[0] == "fault":
            revisions.setdefault(c[1], []).append(int(c[2]))
    assert all(r == sorted(r) for r in revisions.values())
    # and each fault as its last accepted write left it
    last = {}
    for i in [*range(0, accepted_faults * 2, 2), OUTAGE_EVENTS]:  # and the batch after the outage
        update = _outage_update(i)
        last[update.changed[0][0].code] = update.changed[0]
    for doc in mongo_db["faults"].find({"code": {"$in": list(last)}}):
        assert (doc["count"], doc["revision"]) == (last[doc["code"]][0].count, last[doc["code"]][1])
    assert mongo_db["faults"].count_documents({}) == len(last)
