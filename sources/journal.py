"""Following the systemd journal's kernel messages with `journalctl -o json --follow`.

First start (no cursor): the current boot from its beginning, so XIDs logged before the agent started are
not missed. Later starts: right after the last cursor the dataflow snapshotted, so nothing is read twice
and nothing is skipped. `journalctl` blocks, so a thread reads it and hands entries over a bounded queue.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from sources import formats, wake

IDLE_AWAKE_S = 0.05
CHUNK_BYTES = 256 * 1024
_BINARY_MESSAGE = re.compile(rb'"MESSAGE"\s*:\s*\[')  # not UTF-8: journalctl gives the bytes as an array
COALESCE_S = 0.02  # at most 50 hand-overs a second; adds at most this to a kernel line's latency


class Prefilter(Protocol):
    """What the journal reader needs from the compiled packs."""

    literals: list[str]

    def candidate_lines(self, data: bytes) -> Iterator[tuple[int, int]]: ...


def _record_starts(prefilter: Prefilter) -> tuple[int, Callable[[bytes], bool] | None]:
    """How many lines after a record's start line may continue it, and the test for a start line
    (`patterns.compiler.CompiledPacks`; a prefilter without record patterns has neither)."""
    return getattr(prefilter, "record_lines", 1) - 1, getattr(prefilter, "record_start_bytes", None)


def json_safe(literals: list[str]) -> bool:
    """True when every literal appears unchanged inside journalctl's JSON strings: printable ASCII
    other than the quote and the backslash, which JSON escapes."""
    return all(0x20 <= ord(c) < 0x7F and c not in '"\\' for lit in literals for c in lit)


@dataclass(frozen=True)
class Entry:
    cursor: str
    record: formats.Parsed


def command(*, file: Path | None = None, directory: Path | None = None, after: str | None = None,
            journalctl: str = "journalctl") -> list[str]:  # fmt: skip
    argv = [journalctl, "-o", "json", "--follow", "--no-tail", "--quiet"]
    if file is not None:
        argv += ["--file", str(file)]
    elif directory is not None:
        argv += ["--directory", str(directory)]
    argv += ["--after-cursor", after] if after else ["--boot"]
    # only what journal_record reads (the cursor and timestamps always come): a third of the JSON to parse
    argv += ["--output-fields=MESSAGE,_HOSTNAME,_SOURCE_MONOTONIC_TIMESTAMP,_TRANSPORT,SYSLOG_FACILITY"]
    # kmsg's records; those user space wrote to /dev/kmsg (facility user) come too, to be counted untrusted
    return [*argv, "_TRANSPORT=kernel"]


def parse(line: str | bytes) -> Entry | None:
    """One `journalctl -o json` line as (cursor, record); None for lines that are not entries."""
    try:
        fields = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the decoder recurses
        return None
    if not isinstance(fields, dict) or not isinstance(fields.get("__CURSOR"), str):
        return None
    record = formats.journal_record(fields)
    return Entry(fields["__CURSOR"], record) if record is not None else None


class JournalFollower:
    """Runs journalctl and queues its entries, in chunks (one lock round per chunk, not per line);
    `stop()` ends it."""

    def __init__(self, argv: list[str], *, maxsize: int = 16, prefilter: Prefilter | None = None) -> None:
        self.prefilter = prefilter
        self.queue: queue.Queue[list[Entry]] = queue.Queue(maxsize=maxsize)  # chunks of <= CHUNK_BYTES
        self._held: list[Entry] = []  # taken from the queue, not yet handed out
        self.proc = subprocess.Popen(  # noqa: S603 - our own argv
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
        self.thread = threading.Thread(target=self._read, name="journal", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        tail = b""
        while True:
            try:
                data = os.read(fd, CHUNK_BYTES)  # what is there now, up to a chunk: no per-line wake-ups
            except OSError:  # closed by stop()
                return
            if not data:
                return
            data = tail + data
            cut = data.rfind(b"\n") + 1
            tail = data[cut:]
            entries = [e for line in self._lines(data[:cut]) if (e := parse(line)) is not None]
            if entries:
                self.queue.put(entries)  # blocks when full: back-pressure onto journalctl
                wake.notify()
            time.sleep(COALESCE_S)  # let a busy journal gather in the pipe: one hand-over per chunk

    def _lines(self, data: bytes) -> list[bytes]:
        """The lines worth parsing: all of them, or with a prefilter, those it points at and the lines
        that may continue a record one of them opens, the last (its cursor is the position to
        snapshot) and any chunk holding a binary MESSAGE (an array)."""
        if self.prefilter is None or _BINARY_MESSAGE.search(data):
            return data.splitlines()
        last = data.rfind(b"\n", 0, len(data) - 1) + 1
        more, opens_record = _record_starts(self.prefilter)
        picked: dict[int, int] = {}
        for start, end in self.prefilter.candidate_lines(data):
            if start >= last or start in picked:
                continue
            picked[start] = end
            if more > 0 and opens_record is not None and opens_record(data[start:end]):
                pos = end + 1
                for _ in range(more):
                    if pos >= last:
                        break
                    nl = data.find(b"\n", pos)
                    picked[pos] = nl
                    pos = nl + 1
        spans = sorted(picked.items())
        return [data[start:end] for start, end in spans] + [data[last:-1]] if data else []

    def empty(self) -> bool:
        return not self._held and self.queue.empty()

    def drain(self, limit: int = 1000) -> list[Entry]:
        out, self._held = self._held, []
        while len(out) < limit:
            try:
                out += self.queue.get_nowait()
            except queue.Empty:
                break
        out, self._held = out[:limit], out[limit:]
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.thread.join(1.0)  # it ends at the pipe's end (unless blocked on a full queue)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class _Partition(StatefulSourcePartition[Entry, str | None]):
    notifies = True  # its reader thread calls wake.notify(): no need to poll it

    def __init__(self, argv_for: JournalSource, resume: str | None) -> None:
        self.cursor = resume
        self.follower = JournalFollower(argv_for.argv(resume), prefilter=argv_for.prefilter)

    def next_batch(self) -> list[Entry]:
        batch = self.follower.drain()
        if batch:
            self.cursor = batch[-1].cursor
        return batch

    def next_awake(self) -> dt.datetime | None:
        empty = self.follower.empty()
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=IDLE_AWAKE_S) if empty else None

    def snapshot(self) -> str | None:
        return self.cursor  # resume right after the last entry emitted

    def close(self) -> None:
        self.follower.stop()


class JournalSource(FixedPartitionedSource[Entry, str | None]):
    """`prefilter` (the compiled packs): only lines holding one of its literals are parsed and handed
    on (and the last of each chunk, for its cursor); none: every entry is. It is used only when no
    literal holds a character JSON escapes, so that the literals appear verbatim in journalctl's lines."""

    def __init__(
        self, *, file: Path | None = None, directory: Path | None = None, journalctl: str = "journalctl",
        prefilter: Prefilter | None = None,
    ):  # fmt: skip
        self.file = file
        self.directory = directory
        self.journalctl = journalctl
        self.prefilter = prefilter if prefilter is not None and json_safe(prefilter.literals) else None

    def argv(self, after: str | None) -> list[str]:
        return command(file=self.file, directory=self.directory, after=after, journalctl=self.journalctl)

    def list_parts(self) -> list[str]:
        return ["journal"]

    def build_part(self, step_id: str, for_part: str, resume_state: str | None) -> _Partition:
        return _Partition(self, resume_state)
