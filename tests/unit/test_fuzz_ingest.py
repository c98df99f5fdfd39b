"""Fuzzing the gRPC health ingest: the validation of a `HealthEventBatch` (`sources.ingest.validate`), the
lines accepted events become for the `ingest` pack, the spool, and a real in-process server on a Unix
socket (`sources.ingest_server.serve`) fed encoded batches and arbitrary bytes.

A monitor is an outside program: whatever it sends is accepted whole or refused whole with
INVALID_ARGUMENT naming the first bad field (`events[2].entities[0].id: ...`). What is accepted
survives the spool unchanged and is classified by the ingest pack as exactly the fault it reported."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import event as count
from hypothesis import example, given
from hypothesis import strategies as st

from faultline.api import health_pb2, health_pb2_grpc
from faultline.models import Action
from patterns.compiler import CompiledPacks
from sources import ingest, ingest_server
from tests.unit.fuzzing import NASTY, fuzz

NODE = "gpu-node-01"
NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
FIELD = re.compile(
    r"events(\[\d+\]\.(node|agent|check|component|code|action|message|generated_at|entities(\[\d+\]\.(type|id))?"
    r"|metadata(\[.*\])?))?",
    re.DOTALL,
)

# (valid, near-valid but refused) values of each field
NAMES = (
    ("burn-in", "memtest", "a", "x" * 128, "acme/gpu:1", "A.b_c-1"),
    ("x" * 129, "a b", "", "-x", "\u00e9"),
)
CODES = (("GPU-MEMTEST-FAILED", "X", "X" * 64, "A.B_C-1", "0"), ("X" * 65, "gpu", "", "-A", "A B"))
COMPONENTS = (("GPU", "NVSWITCH", "NIC", "NODE"), ("gpu", "TOASTER", ""))
ACTIONS = (("", *Action.__members__), ("REBOOT", "none"))
MESSAGES = (("", "12 bad pages", "x" * 4096, *NASTY), ("x" * 4097,))
ENTITY_TYPES = (("GPU", "NIC", "NVSWITCH", "NODE", "A_B", "X" * 32), ("gpu", "", "X" * 33, "G1"))
ENTITY_IDS = (("0000:3b:00", "mlx5_0", "a/b", "x" * 128, "-"), ("x" * 129, "", "a b", "\u00e9"))
META_KEYS = (("run", "_k", "k-1", "x" * 64), ("a.b", "$x", "", "x" * 65))
META_VALUES = (("7", "", "v" * 1024), ("v" * 1025,))
OFFSETS = ((-5, 0, -3600, 299, -7 * 86400 + 60), (302, -7 * 86400 - 60, 10**12, -(10**12)))


def rtext(rng: random.Random, size: int) -> str:
    """Any text protobuf takes (no lone surrogates): ASCII, the Basic Multilingual Plane and beyond."""
    chars = []
    for _ in range(rng.randrange(size + 1)):
        c = rng.choice((rng.randrange(32, 127), rng.randrange(0xD800), rng.randrange(0xE000, 0x110000)))
        chars.append(chr(c))
    return "".join(chars)


def pick(rng: random.Random, values: tuple[tuple[Any, ...], tuple[Any, ...]], size: int = 8) -> Any:
    """Mostly a valid value, sometimes a near-valid one that is refused, now and then any text: about
    half the events are valid, and each refused one is refused for one or two fields."""
    r = rng.random()
    if r < 0.94 or size == 0:
        return rng.choice(values[0] if r < 0.94 else values[1])
    return rng.choice(values[1]) if r < 0.97 else rtext(rng, size)


def event(seed: int) -> health_pb2.HealthEvent:
    """One event from a seed: many choices from a seeded generator instead of many hypothesis draws
    (which cost milliseconds per event)."""
    rng = random.Random(seed)
    e = health_pb2.HealthEvent(
        node=pick(rng, ((NODE,), ("gpu-node-02", "", "\u00e9" * 100))), agent=pick(rng, NAMES),
        check=pick(rng, NAMES), component=pick(rng, COMPONENTS), code=pick(rng, CODES),
        healthy=rng.random() < 0.3, fatal=rng.random() < 0.5, action=pick(rng, ACTIONS),
        message=pick(rng, MESSAGES, 40) if rng.random() < 0.9 else rtext(rng, 60),
    )  # fmt: skip
    count = pick(rng, ((0, 1, 1, 2, 3, 16), (17,)), 0)
    entities = [
        health_pb2.Entity(type=pick(rng, ENTITY_TYPES), id=pick(rng, ENTITY_IDS))
        for _ in range(min(count, 3))
    ]
    e.entities.extend(entities if count <= 3 else entities * (count // 3) + entities[: count % 3])
    for _ in range(pick(rng, ((0, 0, 1, 3, 32), (33,)), 0)):
        e.metadata[pick(rng, META_KEYS, 5)] = pick(rng, META_VALUES, 5)
    kind = rng.randrange(40)
    if kind == 0:  # out of the range of a Timestamp
        seconds = rng.choice((-(2**62), 2**62, 253402300800))
        e.generated_at.CopyFrom(Timestamp(seconds=seconds, nanos=rng.choice((0, -1, 10**9))))
    elif kind > 1:  # (1: no time at all)
        seconds = int(NOW.timestamp()) + pick(rng, OFFSETS, 0) + rng.randrange(-3, 4)
        e.generated_at.CopyFrom(Timestamp(seconds=seconds, nanos=rng.choice((0, 5, 999_999_999))))
    return e


events = st.integers(0, 2**64).map(event)
batches = st.lists(events, min_size=0, max_size=3).map(lambda es: health_pb2.HealthEventBatch(events=es))


def validated(
    batch: health_pb2.HealthEventBatch, now: dt.datetime = NOW
) -> list[dict[str, Any]] | ingest.InvalidEventError:
    try:
        return ingest.validate(batch, NODE, now)
    except ingest.InvalidEventError as exc:
        return exc


def check_refusal(exc: ingest.InvalidEventError, batch: health_pb2.HealthEventBatch) -> None:
    assert FIELD.fullmatch(exc.field), exc.field
    assert str(exc).startswith(f"{exc.field}: ") and len(str(exc)) > len(exc.field) + 2
    if m := re.match(r"events\[(\d+)\]", exc.field):  # the first bad event: the ones before it pass
        first = int(m.group(1))
        assert first < len(batch.events)
        if first:
            assert not isinstance(
                validated(health_pb2.HealthEventBatch(events=batch.events[:first])), ingest.InvalidEventError
            )


def check_classified(builtin: CompiledPacks, record: dict[str, Any]) -> None:
    """An accepted event's lines are the fault it reported, once per entity (the node when none)."""
    lines = ingest.lines(record)
    entities = record["entities"] or [{"type": "NODE", "id": ""}]
    assert len(lines) == len(entities)
    for line, entity in zip(lines, entities, strict=True):
        assert "\n" not in line and "\r" not in line
        hits = builtin.match("grpc", line)
        assert len(hits) == 1, (line, hits)
        hit = hits[0]
        assert (hit.code, hit.entity_type, hit.entity_id) == (record["code"], entity["type"], entity["id"]), (
            line
        )
        if record["healthy"]:
            assert hit.kind == "clear", line
        else:
            assert hit.kind == "fault", line
            assert (hit.fatal, hit.action, hit.component) == (
                record["fatal"],
                record["action"],
                record["component"],
            )


@pytest.fixture(scope="module")
def spool() -> Iterator[ingest.IngestSpool]:
    with tempfile.TemporaryDirectory() as name:
        yield ingest.IngestSpool(Path(name), rollover_bytes=64 << 10)


# validate held up: no exception but InvalidEventError, always naming the first bad field.
@fuzz(2000)
@given(batches)
@example(health_pb2.HealthEventBatch())
def test_batches_are_accepted_whole_or_refused_naming_the_first_bad_field(
    builtin: CompiledPacks, spool: ingest.IngestSpool, batch: health_pb2.HealthEventBatch
) -> None:
    result = validated(batch)
    if isinstance(result, ingest.InvalidEventError):
        check_refusal(result, batch)
        count("refused: " + re.sub(r"\[[^]]*\]", "", result.field))  # the field without indexes
        return
    assert len(result) == len(batch.events) > 0
    count(f"accepted {len(result)} events")
    for record in result:
        assert math.isfinite(record["ts"]) and abs(record["ts"] - NOW.timestamp()) <= 7 * 86400 + 1
        check_classified(builtin, record)
    generation, offset = (
        spool.generation,
        spool.path(spool.generation).stat().st_size if spool.path(spool.generation).exists() else 0,
    )
    spool.append(result)
    got: list[dict[str, Any]] = []
    while True:  # read what was appended, across a rollover
        new_generation, offset, out = spool.read(generation, offset)
        got += [r for _, r in out]
        if new_generation == generation:
            break
        generation, offset = new_generation, 0
    assert got == json.loads(json.dumps(result))


@fuzz(1000)
@given(st.binary(max_size=200))
@example(b"\x0a\x05hello")
def test_arbitrary_bytes_decode_to_a_batch_that_validates_or_are_refused(data: bytes) -> None:
    try:
        batch = health_pb2.HealthEventBatch.FromString(data)
    except DecodeError:
        return
    result = validated(batch)
    if isinstance(result, ingest.InvalidEventError):
        check_refusal(result, batch)


# -- a real server on a Unix socket --------------------------------------------------------------------


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[grpc.Channel, ingest.IngestSpool]]:
    with tempfile.TemporaryDirectory() as name:
        spool = ingest.IngestSpool(Path(name) / "spool")
        sock = Path(name) / "ingest.sock"
        server = ingest_server.serve(NODE, spool, socket=sock)
        try:
            with grpc.insecure_channel(f"unix:{sock}") as channel:
                yield channel, spool
        finally:
            server.stop(None).wait(10)


def garbled(data: bytes, cuts: list[tuple[int, bytes]] | tuple[()]) -> bytes:
    for where, piece in cuts:
        at = where % (len(data) + 1)
        data = data[:at] + piece + data[at + 1 :]
    return data


@fuzz(300)
@given(
    st.lists(events, min_size=1, max_size=2).map(lambda es: health_pb2.HealthEventBatch(events=es)),
    st.just(()) | st.lists(st.tuples(st.integers(0, 10**6), st.binary(max_size=3)), min_size=1, max_size=2),
    st.booleans(),
)
@example(health_pb2.HealthEventBatch(), [(0, b"\xff\xff\xff")], False)
def test_the_server_answers_every_request_with_ok_or_invalid_argument(
    served: tuple[grpc.Channel, ingest.IngestSpool], batch: health_pb2.HealthEventBatch,
    cuts: list[tuple[int, bytes]] | tuple[()], typed: bool,
) -> None:  # fmt: skip
    """Found by this fuzzing: a request that is not a HealthEventBatch was INTERNAL "Exception
    deserializing request!" (grpc's deserializer failed, with a traceback in the agent's log)."""
    channel, spool = served
    now = dt.datetime.now(dt.UTC)
    for e in batch.events:  # the events were made for NOW: move them to the server's time
        if e.HasField("generated_at") and abs(e.generated_at.seconds - NOW.timestamp()) < 10**11:
            e.generated_at.seconds += int(now.timestamp() - NOW.timestamp())
    data = garbled(batch.SerializeToString(), cuts)
    appends = spool.appends
    answer = report(channel, batch if typed and not cuts else data)
    if isinstance(answer, health_pb2.ReportResponse):
        assert answer.accepted == len(health_pb2.HealthEventBatch.FromString(data).events) > 0
        assert spool.appends == appends + 1
        count("accepted")
        return
    code, details = answer
    assert code == grpc.StatusCode.INVALID_ARGUMENT, answer
    assert spool.appends == appends  # nothing of a refused batch is kept
    try:
        decoded = health_pb2.HealthEventBatch.FromString(data)
    except DecodeError:
        assert details.startswith("request: not a HealthEventBatch ("), details
        count("refused: not a batch")
        return
    expected = validated(decoded, now)
    assert isinstance(expected, ingest.InvalidEventError), details
    assert details.split(":")[0] == expected.field, (details, expected)
    count("refused: a field")


def report(
    channel: grpc.Channel, request: health_pb2.HealthEventBatch | bytes
) -> health_pb2.ReportResponse | tuple[grpc.StatusCode, str]:
    """The server's reply to a batch (through the generated stub, as monitors call it) or to bytes (any
    bytes: through a method without serializers); a refusal as (code, details)."""
    try:
        if isinstance(request, bytes):
            raw = channel.unary_unary("/faultline.v1.HealthIngest/Report")
            return health_pb2.ReportResponse.FromString(raw(request, timeout=10))
        return health_pb2_grpc.HealthIngestStub(channel).Report(request, timeout=10)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
