"""gRPC health ingest (`faultline.v1.HealthIngest`, ARCHITECTURE §8): monitors outside faultline report
health events to the node agent.

    Report(batch) ── validate every event ──> IngestSpool (fsync) ──> IngestSource (dataflow, source `grpc`)
                    └─ INVALID_ARGUMENT naming the first bad field; nothing of the batch is kept

A batch is all or nothing: it is appended to the spool and flushed to disk before the call returns, so
an accepted event survives an agent crash. The dataflow follows the spool like a log, from the position
in its recovery snapshot, and renders each event (once per entity) as a `faultline-ingest ...` line for
the `ingest` pack. The spool is a series of generation files: once the reader has consumed a generation
larger than `rollover_bytes`, writing moves to the next one, and generations two behind the reader are
deleted. When unconsumed events exceed `max_bytes` the server answers RESOURCE_EXHAUSTED.

The server itself lives in `sources.ingest_server` (it alone imports grpc).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from faultline import bounds
from faultline.models import Action
from sources import formats, wake
from sources.journal import Entry

if TYPE_CHECKING:  # the messages' module is imported by the server (sources.ingest_server) only
    from faultline.api import health_pb2

MAX_EVENTS = 1000
MAX_ENTITIES = 16
MAX_MESSAGE = 4096
MAX_METADATA = 32
MAX_METADATA_VALUE = 1024
MAX_METADATA_KEY = 64  # characters of a metadata key (as _META_KEY says); a bad one is quoted cut to it
MAX_FUTURE = dt.timedelta(minutes=5)
MAX_AGE = dt.timedelta(days=7)
COMPONENTS = ("GPU", "NVSWITCH", "NIC", "NODE")
_CODE = re.compile(r"[A-Z0-9](?:[A-Z0-9_.-]{0,61}[A-Z0-9])?")  # upper case, a taint value (models.FAULT_CODE)
_CODE_RULE = "1-63 of A-Z 0-9 _ . - starting and ending with A-Z or 0-9 (a taint value)"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")  # agent, check: no spaces (they go in a line)
_ENTITY_TYPE = re.compile(r"[A-Z][A-Z_]{0,31}")
_ENTITY_ID = re.compile(r"[A-Za-z0-9_.:/-]{1,128}")
_META_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")  # no dots or $: MongoDB field names


class InvalidEventError(ValueError):
    """An event broke a rule; `field` is its path in the request, e.g. `events[2].entities[0].id`."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


def _require(ok: bool, field: str, reason: str) -> None:
    if not ok:
        raise InvalidEventError(field, reason)


def validate(batch: health_pb2.HealthEventBatch, node: str, now: dt.datetime) -> list[dict[str, Any]]:
    """Every event of the batch as a plain record, or InvalidEventError for the first bad field."""
    _require(0 < len(batch.events) <= MAX_EVENTS, "events", f"a batch holds 1 to {MAX_EVENTS} events")
    records = []
    for i, e in enumerate(batch.events):
        at = f"events[{i}]"
        _require(e.node == node, f"{at}.node", f"{bounds.quote(e.node)} is not this agent's node {node!r}")
        _require(bool(_NAME.fullmatch(e.agent)), f"{at}.agent", "1-128 of A-Z a-z 0-9 _ . : / - (no spaces)")
        _require(bool(_NAME.fullmatch(e.check)), f"{at}.check", "1-128 of A-Z a-z 0-9 _ . : / - (no spaces)")
        _require(e.component in COMPONENTS, f"{at}.component", f"one of {', '.join(COMPONENTS)}")
        _require(bool(_CODE.fullmatch(e.code)), f"{at}.code", _CODE_RULE)
        action = e.action or "NONE"
        _require(action in Action.__members__, f"{at}.action", f"one of {', '.join(Action.__members__)}")
        _require(len(e.entities) <= MAX_ENTITIES, f"{at}.entities", f"at most {MAX_ENTITIES}")
        entities = []
        for j, entity in enumerate(e.entities):
            _require(bool(_ENTITY_TYPE.fullmatch(entity.type)), f"{at}.entities[{j}].type", "1-32 of A-Z _")
            _require(bool(_ENTITY_ID.fullmatch(entity.id)), f"{at}.entities[{j}].id",
                     "1-128 of A-Z a-z 0-9 _ . : / -")  # fmt: skip
            entities.append({"type": entity.type, "id": entity.id})
        _require(len(e.message) <= MAX_MESSAGE, f"{at}.message", f"at most {MAX_MESSAGE} characters")
        _require(len(e.metadata) <= MAX_METADATA, f"{at}.metadata", f"at most {MAX_METADATA} entries")
        for key, value in e.metadata.items():
            _require(bool(_META_KEY.fullmatch(key)), f"{at}.metadata[{bounds.quote(key, MAX_METADATA_KEY)}]",
                     "keys are 1-64 of A-Z a-z 0-9 _ - (no dots or $)")  # fmt: skip
            _require(len(value) <= MAX_METADATA_VALUE, f"{at}.metadata[{key!r}]",
                     f"values are at most {MAX_METADATA_VALUE} characters")  # fmt: skip
        _require(e.HasField("generated_at"), f"{at}.generated_at", "required")
        try:
            when = e.generated_at.ToDatetime(tzinfo=dt.UTC)
        except (ValueError, OverflowError) as exc:
            raise InvalidEventError(f"{at}.generated_at", f"not a valid time ({exc})") from exc
        _require(when <= now + MAX_FUTURE, f"{at}.generated_at", f"{when.isoformat()} is in the future")
        _require(when >= now - MAX_AGE, f"{at}.generated_at", f"{when.isoformat()} is older than 7 days")
        records.append(
            {"node": e.node, "agent": e.agent, "check": e.check, "component": e.component, "code": e.code,
             "entities": entities, "healthy": e.healthy, "fatal": e.fatal, "action": action,
             "message": e.message, "metadata": dict(e.metadata), "ts": when.timestamp()}
        )  # fmt: skip
    return records


def lines(record: dict[str, Any]) -> list[str]:
    """The `ingest` pack's lines for one accepted event: one per entity (the node when it names none)."""
    entities = record["entities"] or [{"type": "NODE", "id": ""}]
    text = " ".join(record["message"].split())  # one line, whatever the monitor sent
    return [
        f"faultline-ingest agent={record['agent']} check={record['check']} component={record['component']} "
        f"code={record['code']} entity={entity['type']}/{entity['id']} fatal={str(record['fatal']).lower()} "
        f"action={record['action']} healthy={str(record['healthy']).lower()}" + (f": {text}" if text else "")
        for entity in entities
    ]


class SpoolFullError(RuntimeError):
    pass


class IngestSpool:
    """Generation files `<dir>/ingest-<n>.jsonl` of accepted events; shared (thread-safe) by the gRPC
    server, which appends, and the dataflow source, which reads."""

    def __init__(self, directory: Path, *, max_bytes: int = 64 << 20, rollover_bytes: int = 4 << 20) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.rollover_bytes = rollover_bytes
        self.lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self.generation = max(self.generations(), default=0)
        self.unread = 0  # bytes appended and not yet read (this process)
        self.appends = 0  # batches appended by this process: a reader that saw them all need not look

    def path(self, generation: int) -> Path:
        return self.directory / f"ingest-{generation}.jsonl"

    def generations(self) -> list[int]:
        return sorted(int(p.stem.split("-")[1]) for p in self.directory.glob("ingest-*.jsonl"))

    def append(self, records: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        with self.lock:
            if self.unread + len(data) > self.max_bytes:
                raise SpoolFullError(f"{self.unread} bytes of accepted events wait to be processed")
            fd = os.open(self.path(self.generation), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)  # durable before the call returns
            finally:
                os.close(fd)
            self.unread += len(data)
            self.appends += 1
        wake.notify()

    def read(self, generation: int, offset: int) -> tuple[int, int, list[tuple[int, dict[str, Any]]]]:
        """Whole records after (generation, offset): the new position and (position, record) pairs. Moves
        the writer to a new generation once a large one is fully read."""
        with self.lock:
            if generation < self.generation and not self.path(generation).exists():
                generation, offset = self.generation, 0  # deleted: everything in it was consumed
            try:
                with self.path(generation).open("rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except FileNotFoundError:
                data = b""
            end = data.rfind(b"\n") + 1
            out = []
            position = offset
            for raw in data[:end].splitlines(keepends=True):
                position += len(raw)
                try:
                    out.append((position, json.loads(raw)))
                except ValueError:
                    continue  # cannot happen for what append wrote; a torn tail is not yet complete
            offset += end
            self.unread = max(0, self.unread - end)
            if generation < self.generation and end == len(data):
                return generation + 1, 0, out  # the next generation holds what came after
            if generation == self.generation and offset >= self.rollover_bytes and end == len(data):
                self.generation += 1
                for old in self.generations():
                    if old < generation - 1:
                        self.path(old).unlink(missing_ok=True)
            return generation, offset, out


IngestResume = tuple[int, int]


class _IngestPartition(StatefulSourcePartition[Entry, IngestResume]):
    notifies = True  # IngestSpool.append calls wake.notify(): no need to poll it

    def __init__(self, spool: IngestSpool, resume: IngestResume | None, interval: float) -> None:
        self.spool = spool
        self.interval = interval
        self.position: IngestResume = (
            resume if resume is not None else (min(spool.generations(), default=0), 0)
        )
        for old in spool.generations():
            if old < self.position[0] - 1:
                spool.path(old).unlink(missing_ok=True)
        self.next_poll = dt.datetime.now(dt.UTC)
        self.seen_appends = -1  # the first read looks: a restart finds what was spooled before it

    def next_batch(self) -> list[Entry]:
        now = dt.datetime.now(dt.UTC)
        appends = self.spool.appends  # read before the files: an append racing this read is seen next time
        if appends == self.seen_appends and now < self.next_poll:
            return []  # nothing appended since the last read (the spool's writer is in this process)
        self.next_poll = now + dt.timedelta(seconds=self.interval)
        self.seen_appends = appends
        generation, offset = self.position
        out = []
        while True:
            new_generation, offset, records = self.spool.read(generation, offset)
            for position, record in records:
                for line in lines(record):
                    parsed = formats.Parsed(float(record["ts"]), record["node"], line, None)
                    out.append(Entry(f"grpc:{generation}:{position}", parsed))
            if new_generation == generation:
                break
            generation = new_generation  # what came after is in the next generation
        self.position = (generation, offset)
        return out

    def next_awake(self) -> dt.datetime | None:
        return self.next_poll

    def snapshot(self) -> IngestResume:
        return self.position


class IngestSource(FixedPartitionedSource[Entry, IngestResume]):
    """The accepted events, in order, as `grpc` observations."""

    def __init__(self, spool: IngestSpool, *, interval: float = 1.0) -> None:
        self.spool = spool
        self.interval = interval

    def list_parts(self) -> list[str]:
        return ["grpc"]

    def build_part(self, step_id: str, for_part: str, resume_state: IngestResume | None) -> _IngestPartition:
        return _IngestPartition(self.spool, resume_state, self.interval)
