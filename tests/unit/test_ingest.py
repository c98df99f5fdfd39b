"""gRPC ingest without the network: each validation rule names its field, accepted batches are lines the
`ingest` pack classifies, and the spool hands events over in order across generations."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from faultline.api import health_pb2
from patterns import compiler, loader
from patterns.detectors import NodeDetector
from sources import ingest, ingest_client

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def event(**overrides: Any) -> health_pb2.HealthEvent:
    fields: dict[str, Any] = {
        "node": "gpu-node-01", "agent": "burn-in", "check": "memtest", "component": "GPU",
        "code": "GPU-MEMTEST-FAILED", "fatal": True, "action": "COMPONENT_RESET", "message": "12 bad pages",
        "entities": [health_pb2.Entity(type="GPU", id="0000:3b:00")], "metadata": {"run": "7"},
    }  # fmt: skip
    fields.update(overrides)
    e = health_pb2.HealthEvent(**{k: v for k, v in fields.items() if k != "generated_at"})
    e.generated_at.FromDatetime(fields.get("generated_at", NOW - dt.timedelta(seconds=5)))
    return e


def test_a_valid_batch_becomes_records() -> None:
    (record,) = ingest.validate(health_pb2.HealthEventBatch(events=[event()]), "gpu-node-01", NOW)
    assert record["entities"] == [{"type": "GPU", "id": "0000:3b:00"}]
    assert record["ts"] == (NOW - dt.timedelta(seconds=5)).timestamp()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"node": "gpu-node-02"}, "events[1].node"),
        ({"agent": ""}, "events[1].agent"),
        ({"check": "mem test"}, "events[1].check"),
        ({"component": "TOASTER"}, "events[1].component"),
        ({"code": "gpu memtest"}, "events[1].code"),
        ({"code": "X" * 65}, "events[1].code"),
        ({"code": "X" * 64}, "events[1].code"),  # a taint value holds 63 at most
        ({"code": "GPU-MEMTEST-"}, "events[1].code"),  # and ends with a letter or digit
        ({"action": "REBOOT"}, "events[1].action"),
        ({"entities": [health_pb2.Entity(type="GPU", id="")]}, "events[1].entities[0].id"),
        ({"entities": [health_pb2.Entity(type="gpu", id="1")]}, "events[1].entities[0].type"),
        ({"entities": [health_pb2.Entity(type="GPU", id=str(i)) for i in range(17)]}, "events[1].entities"),
        ({"message": "x" * 4097}, "events[1].message"),
        ({"metadata": {"a.b": "1"}}, "events[1].metadata['a.b']"),
        ({"metadata": {"k": "v" * 1025}}, "events[1].metadata['k']"),
        ({"metadata": {f"k{i}": "v" for i in range(33)}}, "events[1].metadata"),
        ({"generated_at": NOW + dt.timedelta(minutes=6)}, "events[1].generated_at"),
        ({"generated_at": NOW - dt.timedelta(days=8)}, "events[1].generated_at"),
    ],
)
def test_each_rule_names_the_field(overrides: dict[str, Any], field: str) -> None:
    batch = health_pb2.HealthEventBatch(events=[event(), event(**overrides)])
    with pytest.raises(ingest.InvalidEventError) as info:
        ingest.validate(batch, "gpu-node-01", NOW)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_bad_input_is_quoted_back_cut_short() -> None:
    far = health_pb2.HealthEventBatch(events=[event(node="n" * 500)])
    with pytest.raises(ingest.InvalidEventError, match=r"^events\[0\]\.node: 'n{80}' is not this agent's"):
        ingest.validate(far, "gpu-node-01", NOW)
    dotted = health_pb2.HealthEventBatch(events=[event(metadata={"k." + "x" * 500: "v"})])
    with pytest.raises(ingest.InvalidEventError) as info:
        ingest.validate(dotted, "gpu-node-01", NOW)
    assert info.value.field == f"events[0].metadata[{'k.' + 'x' * 62!r}]"


def test_the_client_cuts_a_message_to_what_the_agent_accepts() -> None:
    assert ingest_client.MAX_MESSAGE == ingest.MAX_MESSAGE  # the client does not import the agent's module


def test_missing_time_and_batch_size() -> None:
    bare = event()
    bare.ClearField("generated_at")
    with pytest.raises(ingest.InvalidEventError, match=r"^events\[0\]\.generated_at: required"):
        ingest.validate(health_pb2.HealthEventBatch(events=[bare]), "gpu-node-01", NOW)
    for count in (0, 1001):
        with pytest.raises(ingest.InvalidEventError, match=r"^events: a batch holds 1 to 1000"):
            ingest.validate(health_pb2.HealthEventBatch(events=[event()] * count), "gpu-node-01", NOW)


def test_lines_classify_through_the_ingest_pack_and_healthy_resolves_the_same_code() -> None:
    compiled = compiler.compile_packs(loader.load([]))
    detector = NodeDetector("gpu-node-01", compiled)
    two = [health_pb2.Entity(type="GPU", id="0000:3b:00"), health_pb2.Entity(type="GPU", id="0000:5d:00")]
    stream = [
        event(entities=two),
        event(code="GPU-BURN-SLOW", fatal=False, action="NONE", entities=[]),
        event(healthy=True, fatal=False, action="NONE", message="multi\nline  text"),
    ]
    records = ingest.validate(health_pb2.HealthEventBatch(events=stream), "gpu-node-01", NOW)
    for i, record in enumerate(records):
        for line in ingest.lines(record):
            assert "\n" not in line
            for hit in compiled.match("grpc", line):
                detector.observe(100.0 + i, hit, line)
    got = {(f.entity.type, f.entity.id, f.code, f.fatal, f.action.value, f.state.value)
           for f in detector.snapshot_faults()}  # fmt: skip
    assert got == {
        ("GPU", "0000:3b:00", "GPU-MEMTEST-FAILED", True, "COMPONENT_RESET", "resolved"),
        ("GPU", "0000:5d:00", "GPU-MEMTEST-FAILED", True, "COMPONENT_RESET", "open"),
        ("NODE", "", "GPU-BURN-SLOW", False, "NONE", "open"),
    }


def test_spool_hands_over_in_order_across_generations(tmp_path: Path) -> None:
    spool = ingest.IngestSpool(tmp_path, rollover_bytes=200)
    records = [{"n": i, "pad": "x" * 50} for i in range(12)]
    read: list[int] = []
    position = (0, 0)
    for i in range(0, 12, 3):
        spool.append(records[i : i + 3])
        generation, offset = position
        while True:
            new_generation, offset, out = spool.read(generation, offset)
            read += [r["n"] for _, r in out]
            if new_generation == generation:
                break
            generation = new_generation
        position = (generation, offset)
    assert read == list(range(12))
    assert spool.generation >= 2
    assert min(spool.generations()) >= spool.generation - 2  # old generations are deleted


def test_spool_refuses_past_its_bound(tmp_path: Path) -> None:
    spool = ingest.IngestSpool(tmp_path, max_bytes=100)
    spool.append([{"n": 1}])
    with pytest.raises(ingest.SpoolFullError):
        spool.append([{"pad": "x" * 100}])
    assert [r["n"] for _, r in spool.read(0, 0)[2]] == [1]  # what was accepted stays
