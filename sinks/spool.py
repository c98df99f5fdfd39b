"""The agent's on-disk spool of store writes while MongoDB is unreachable: a directory of append-only
segment files, bounded in bytes, drained one segment at a time (`sinks.mongo.drain`).

    <dir>/spool-<n>.jsonl    one JSON record a line: {"event": ...} or {"revision": r, "fault": ...}
    <dir>/cursor.json        how far the drain got in the oldest segment (replaced atomically)

**Append is O(1)**: the records go to the end of the newest segment, which is then fsynced, once per
append (a batch of the dataflow): a write the sink took survives a crash of the node, not only of the
agent, as the dataflow's recovery will not send it again. A segment at `segment_bytes` or more is
closed and the next append starts the next one.

**Drained one segment at a time**, oldest first: a drain's memory is one segment's records, whatever
the spool holds (the old single file was read whole: 100k spooled events took the agent to 629 MiB, over
its 256 MiB limit). A drain closes a segment once it has written part of it, so the cursor counts into a
segment that no longer changes; a drain that fails at its first call changes nothing, and appends go on
into the same segment.

**Bounded in bytes** (`max_bytes`, the agent's `spool_max_bytes`). What is in stays until it is written:
nothing accepted is dropped later. What comes once the spool is full is refused and counted by kind
(`dropped`; the sink exports it as `faultline_spool_dropped_total{kind}` and logs it). Health events
(matches and health samples: history for people and the analyzer) go first: they are refused once the
spool holds EVENT_SHARE of its bound. Fault writes, what the workers act on and what the detector never
sends again, may use all of it, and are refused only then.

**Order**: segments in their order; in one segment its events, then its fault writes as `plan` orders
them (fatal faults' writes first, consecutive writes of one fault in one state as its newest). Each
fault's own writes stay in the order they were made.

An older agent's spool, one file `<dir>.jsonl` of the same records, is taken in once when the spool
opens: appended (within the bound) as segments, then removed. A crash in between appends it again on the
next start, which is harmless: every write is an idempotent upsert (events by id, faults by revision).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from faultline.models import Fault, HealthEvent

MAX_BYTES = 64 << 20  # the agent's default `spool_max_bytes`: a quarter of its 256 MiB memory limit
SEGMENT_BYTES = 4 << 20  # a segment is closed once it holds this much (what one drain step reads)
EVENT_SHARE = 0.75  # health events are refused once the spool holds this share of its bound
CURSOR = "cursor.json"
Kind = Literal["event", "fault"]
KINDS: tuple[Kind, ...] = ("event", "fault")


class Spool:
    """The segments of one spool directory. Not thread-safe: its one user (the sink's partition) holds a
    lock around every call; `depth` and `size` may be read without it."""

    def __init__(
        self, directory: Path, *, max_bytes: int = MAX_BYTES, segment_bytes: int = SEGMENT_BYTES
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.dropped: dict[Kind, int] = dict.fromkeys(KINDS, 0)  # refused since this spool opened
        directory.mkdir(parents=True, exist_ok=True)
        self.sizes: dict[int, int] = {}  # segment -> bytes
        self.lines: dict[int, int] = {}  # segment -> records
        for path in directory.glob("spool-*.jsonl"):
            n = int(path.stem.removeprefix("spool-"))
            self.sizes[n], self.lines[n] = _measure(path)
        self.size = sum(self.sizes.values())  # bytes on disk
        self.depth = sum(self.lines.values())  # records on disk
        # a fresh segment for this process: a crash may have left a torn line at the end of the last one
        self.current = max(self.sizes, default=0) + 1
        self.migrated = self._migrate(directory.with_name(directory.name + ".jsonl"))

    def __len__(self) -> int:
        return self.depth

    def path(self, n: int) -> Path:
        return self.directory / f"spool-{n}.jsonl"

    def append(
        self, writes: list[tuple[Fault, int]], events: list[HealthEvent] | None = None
    ) -> dict[Kind, int]:
        """Append the events, then the fault writes, as far as the bound lets each kind; what it refused,
        by kind (also added to `dropped`)."""
        records: list[tuple[Kind, dict[str, Any]]] = [
            ("event", {"event": e.model_dump(mode="json")}) for e in events or []
        ]
        records += [("fault", {"revision": rev, "fault": f.model_dump(mode="json")}) for f, rev in writes]
        return self._accept((kind, _line(record)) for kind, record in records)

    def _accept(self, lines: Iterator[tuple[Kind, bytes]]) -> dict[Kind, int]:
        refused: dict[Kind, int] = {}
        data = bytearray()
        kept = 0
        for kind, line in lines:
            limit = self.max_bytes if kind == "fault" else int(self.max_bytes * EVENT_SHARE)
            if self.size + len(data) + len(line) > limit:
                refused[kind] = refused.get(kind, 0) + 1
                self.dropped[kind] += 1
                continue
            data += line
            kept += 1
            if self.sizes.get(self.current, 0) + len(data) >= self.segment_bytes:  # this segment is full
                self._write(bytes(data), kept)
                data, kept = bytearray(), 0
        if data:
            self._write(bytes(data), kept)
        return refused

    def _write(self, data: bytes, records: int) -> None:
        if self.sizes.get(self.current, 0) >= self.segment_bytes:
            self.current += 1
        fd = os.open(self.path(self.current), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        self.sizes[self.current] = self.sizes.get(self.current, 0) + len(data)
        self.lines[self.current] = self.lines.get(self.current, 0) + records
        self.size += len(data)
        self.depth += records

    def segments(self) -> list[int]:
        """The segments to drain, oldest first."""
        return sorted(self.sizes)

    def read(self, n: int) -> tuple[list[HealthEvent], list[tuple[Fault, int]]]:
        """One segment's events and fault writes, in their order (a torn last line of a crash is skipped)."""
        events: list[HealthEvent] = []
        writes: list[tuple[Fault, int]] = []
        with self.path(n).open("rb") as fh:
            for raw in fh:
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                if "event" in record:
                    events.append(HealthEvent.model_validate(record["event"]))
                elif "fault" in record:
                    writes.append((Fault.model_validate(record["fault"]), int(record["revision"])))
        return events, writes

    def progress(self, n: int) -> tuple[bool, int]:
        """How far a drain got in segment `n`: its events written, and how many of its `plan`'s writes."""
        try:
            cursor = json.loads((self.directory / CURSOR).read_text())
        except (FileNotFoundError, ValueError):
            return False, 0
        if cursor.get("segment") != n:
            return False, 0
        return bool(cursor["events"]), int(cursor["faults"])

    def advance(self, n: int, events: bool, faults: int) -> None:
        """A drain wrote segment `n`'s events and `faults` of its plan's writes; appends go to a new one."""
        if n == self.current:
            self.current += 1
        tmp = self.directory / (CURSOR + ".tmp")
        tmp.write_text(json.dumps({"segment": n, "events": events, "faults": faults}))
        tmp.replace(self.directory / CURSOR)  # atomic: a crash leaves the old cursor or the new one

    def remove(self, n: int) -> None:
        """Segment `n` is written: gone, with its cursor."""
        if n == self.current:
            self.current += 1
        self.path(n).unlink(missing_ok=True)
        self.size -= self.sizes.pop(n, 0)
        self.depth -= self.lines.pop(n, 0)
        (self.directory / CURSOR).unlink(missing_ok=True)

    def pending(self) -> tuple[list[HealthEvent], list[tuple[Fault, int]]]:
        """What the spool holds, in memory (for tests and tools): the records as appended, and of a
        segment a drain is part-way through, what it has left to write in its order."""
        events: list[HealthEvent] = []
        writes: list[tuple[Fault, int]] = []
        for n in sorted(self.sizes):
            seg_events, seg_writes = self.read(n)
            events_done, faults_done = self.progress(n)
            events += [] if events_done else seg_events
            writes += plan(seg_writes)[faults_done:] if events_done or faults_done else seg_writes
        return events, writes

    def items(self) -> list[tuple[Fault, int]]:
        return self.pending()[1]

    def events(self) -> list[HealthEvent]:
        return self.pending()[0]

    def _migrate(self, legacy: Path) -> int:
        """Take in an older agent's single-file spool (see the module's doc); the records taken."""
        if not legacy.exists():
            return 0
        before = self.depth

        def lines() -> Iterator[tuple[Kind, bytes]]:
            with legacy.open("rb") as fh:
                for raw in fh:
                    try:
                        record = json.loads(raw)
                    except ValueError:
                        continue
                    if "event" in record or "fault" in record:
                        yield ("event" if "event" in record else "fault"), _line(record)

        self._accept(lines())
        legacy.unlink()
        legacy.with_suffix(".tmp").unlink(missing_ok=True)  # the old spool's half-written replacement
        return self.depth - before


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


def _measure(path: Path) -> tuple[int, int]:
    """A segment's bytes and records, read in blocks (a spool opened after a long outage)."""
    lines = 0
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            lines += block.count(b"\n")
    return path.stat().st_size, lines


def coalesced(writes: list[tuple[Fault, int]]) -> list[tuple[Fault, int]]:
    """The spooled fault writes that matter, in order: of consecutive writes of one fault in the same
    state only the newest (the store keeps the newest revision anyway; a count that rose fifty times in
    an outage is one write, not fifty, when the store is back and every agent catches up at once); a
    change of state is kept, as it makes or removes the fault's work items."""
    out: list[tuple[Fault, int]] = []
    last: dict[str, int] = {}  # fault id -> where its last kept write is in `out`
    for fault, revision in writes:
        i = last.get(fault.id)
        if i is not None and out[i][0].state == fault.state and out[i][1] <= revision:
            out[i] = (fault, revision)
        else:
            last[fault.id] = len(out)
            out.append((fault, revision))
    return out


def drain_order(writes: list[tuple[Fault, int]]) -> list[tuple[Fault, int]]:
    """The writes of fatal faults first, then the others; each fault's own writes in their order."""
    fatal = {fault.id for fault, _ in writes if fault.fatal}
    return [w for w in writes if w[0].id in fatal] + [w for w in writes if w[0].id not in fatal]


def plan(writes: list[tuple[Fault, int]]) -> list[tuple[Fault, int]]:
    """One segment's fault writes as a drain sends them."""
    return drain_order(coalesced(writes))
