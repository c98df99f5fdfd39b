"""Fuzzing the NVSentinel-compatible ingest's mapping (`sources.nvsentinel.validate` and `plan`) with
batches of mostly valid events, each field now and then near-valid or any text (the server's answer to
arbitrary bytes is fuzzed in test_nvsentinel.py).

A batch is accepted whole or refused with InvalidEventError naming the first bad field; what is accepted
becomes ingest records that the `ingest` pack classifies as exactly the fault the record says (code,
entity, fatal, action, component), one per code, and a healthy report resolves what its check opened."""

from __future__ import annotations

import datetime as dt
import random
import re
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import event as count
from hypothesis import given
from hypothesis import strategies as st

from faultline.api import nvsentinel_pb2 as pb
from patterns.compiler import CompiledPacks
from sources import ingest, nvsentinel
from tests.unit.fuzzing import NASTY, fuzz

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
NODE = "gpu-node-01"
UUID = "GPU-5c2b1a7e-0d1f-4c3e-9a77-1b2c3d4e5f60"
FIELD = re.compile(
    r"version|events(\[\d+\]\.(version|nodeName|agent|checkName|componentClass|recommendedAction"
    r"|processingStrategy|quarantineOverrides(\.force)?|drainOverrides\.(force|skip)|errorCode(\[\d+\])?"
    r"|entitiesImpacted(\[\d+\]\.(entityType|entityValue))?|message|metadata(\[.*\])?|id"
    r"|customRecommendedAction|generatedTimestamp))?",
    re.DOTALL,
)

# (valid, near-valid but refused) values of each field
AGENTS = (("syslog-health-monitor", "gpu-health-monitor", "a", "x" * 128), ("", "a b", "x" * 129, "\u00e9"))
CHECKS = (("SysLogsXIDError", "SysLogsSXIDError", "GpuMemWatch", "a:b/c"), ("", "a b", "-x", "x" * 129))
CLASSES = (("GPU", "gpu", "NVSWITCH", "NIC", "node"), ("", "TOASTER", "CPU"))
CODES = (
    ("79", "48", "DCGM_FR_VOLATILE_DBE_DETECTED", "x.y-1", "9" * 60),
    ("", "-1", "a b", "x" * 65, "\u00b2"),
)
TYPES = (("PCI", "GPU", "GPU_UUID", "NVSWITCH", "nvlink"), ("", "1GPU", "G-P", "X" * 33))
VALUES = (("0000:9a:00", "00000000:9B:00.0", "1", UUID, "mlx5_0"), ("", "a b", "x" * 129, "\u00e9"))
META_KEYS = (("JOURNAL_MESSAGE", "run", "_k"), ("a.b", "$x", "", "x" * 65))
ACTIONS = (tuple(nvsentinel.ACTIONS), (1, 3, 100, 2**31 - 1))
STRATEGIES = (tuple(nvsentinel.STRATEGIES), (4, 99))
OFFSETS = ((-5, 0, -3600, 299, -7 * 86400 + 60), (302, -7 * 86400 - 60, 10**12))


def rtext(rng: random.Random, size: int) -> str:
    return "".join(
        chr(rng.choice((rng.randrange(32, 127), rng.randrange(0xD800), rng.randrange(0xE000, 0x110000))))
        for _ in range(rng.randrange(size + 1))
    )


def pick(rng: random.Random, values: tuple[tuple[Any, ...], tuple[Any, ...]], size: int = 8) -> Any:
    """Mostly valid, sometimes near-valid, now and then any text (`size` 0: never text)."""
    r = rng.random()
    if r < 0.97 or size == 0:
        return rng.choice(values[0] if r < 0.97 else values[1])
    return rng.choice(values[1]) if r < 0.985 else rtext(rng, size)


def event(seed: int) -> pb.HealthEvent:
    """One event from a seed (many cheap choices rather than many hypothesis draws)."""
    rng = random.Random(seed)
    e = pb.HealthEvent(
        version=pick(rng, ((0, 1), (2,)), 0), agent=pick(rng, AGENTS), checkName=pick(rng, CHECKS),
        componentClass=pick(rng, CLASSES), isFatal=rng.random() < 0.5, isHealthy=rng.random() < 0.25,
        message=pick(rng, (("", "GPU has fallen off the bus", *NASTY), ("x" * 4097,)), 40),
        recommendedAction=pick(rng, ACTIONS, 0), processingStrategy=pick(rng, STRATEGIES, 0),
        nodeName=pick(rng, ((NODE,), ("gpu-node-02", ""))), id=pick(rng, (("", "e-1"), ("x" * 129,))),
        customRecommendedAction=pick(rng, (("", "page me"), ("x" * 129,))),
    )  # fmt: skip
    e.errorCode.extend(pick(rng, CODES) for _ in range(pick(rng, ((0, 1, 1, 1, 2, 3, 16), (17,)), 0)))
    count_entities = pick(rng, ((0, 1, 2, 3, 16), (17,)), 0)
    e.entitiesImpacted.extend(
        pb.Entity(entityType=pick(rng, TYPES), entityValue=pick(rng, VALUES)) for _ in range(count_entities)
    )
    for _ in range(pick(rng, ((0, 1, 3, 32), (33,)), 0)):
        e.metadata[pick(rng, META_KEYS, 5)] = pick(rng, (("7", "", "v" * 1024), ("v" * 1025,)), 5)
    overrides = rng.randrange(20)
    e.quarantineOverrides.force, e.quarantineOverrides.skip = overrides == 0, overrides in (1, 2)
    e.drainOverrides.force, e.drainOverrides.skip = overrides == 3 and rng.random() < 0.2, False
    if rng.randrange(30):  # (else no time at all)
        seconds = int(NOW.timestamp()) + pick(rng, OFFSETS, 0)
        e.generatedTimestamp.CopyFrom(Timestamp(seconds=seconds, nanos=rng.choice((0, 999_999_999))))
    return e


batches = st.tuples(
    st.sampled_from((1, 1, 1, 1, 1, 1, 0, 0, 7)),
    st.lists(st.integers(0, 2**64).map(event), min_size=0, max_size=3),
).map(lambda v: pb.HealthEvents(version=v[0], events=v[1]))


def validated(batch: pb.HealthEvents) -> list[nvsentinel.Report] | ingest.InvalidEventError:
    try:
        return nvsentinel.validate(batch, NODE, NOW)
    except ingest.InvalidEventError as exc:
        return exc


@fuzz(1500)
@given(batches)
def test_batches_map_whole_to_the_faults_they_name_or_are_refused_by_field(
    builtin: CompiledPacks, batch: pb.HealthEvents
) -> None:
    result = validated(batch)
    if isinstance(result, ingest.InvalidEventError):
        assert FIELD.fullmatch(result.field), result.field
        assert str(result).startswith(f"{result.field}: ")
        if m := re.match(r"events\[(\d+)\]", result.field):  # the first bad event: the ones before pass
            first = int(m.group(1))
            assert first < len(batch.events)
            if first:
                assert not isinstance(
                    validated(pb.HealthEvents(version=1, events=batch.events[:first])), Exception
                )
        count("refused: " + re.sub(r"\[[^]]*\]", "", result.field))
        return
    count(f"accepted {len(result)} events")
    assert len(result) == len(batch.events)
    records, table = nvsentinel.plan(result, {}, max_keys=8, max_codes=4)
    assert len(table) <= 8 and all(len(codes) <= 4 for codes in table.values())
    for report in result:
        assert report.record["healthy"] or report.codes  # a failing check always names a fault
    for record in records:
        entities = record["entities"] or [{"type": "NODE", "id": ""}]
        for line, entity in zip(ingest.lines(record), entities, strict=True):
            (hit,) = builtin.match("grpc", line)
            assert (hit.code, hit.entity_type, hit.entity_id) == (
                record["code"],
                entity["type"],
                entity["id"],
            ), line
            if record["healthy"]:
                assert hit.kind == "clear", line
            else:
                assert (hit.kind, hit.fatal, hit.action, hit.component) == (
                    "fault", record["fatal"], record["action"], record["component"]
                ), line  # fmt: skip
    # a check that reported failing and then healthy with no code leaves nothing open
    healthy = [
        nvsentinel.Report(r.key, (), {**r.record, "healthy": True}) for r in result if not r.record["healthy"]
    ]
    _, after = nvsentinel.plan(healthy, table, max_keys=8, max_codes=4)
    assert not any(key in after for key in {r.key for r in healthy})
