"""Following the systemd journal's kernel messages with `journalctl -o json --follow`.

First start (no cursor): the current boot from its beginning, so XIDs logged before the agent started are
not missed. Later starts: right after the last cursor the dataflow snapshotted, so nothing is read twice
and nothing is skipped. `journalctl` blocks, so a thread reads it and hands entries over a bounded queue.
"""

from __future__ import annotations

import datetime as dt
import json
import queue
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from sources import formats

IDLE_AWAKE_S = 0.05


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
    argv += ["--output-fields=MESSAGE,_HOSTNAME,_SOURCE_MONOTONIC_TIMESTAMP"]
    return [*argv, "_TRANSPORT=kernel"]


def parse(line: str) -> Entry | None:
    """One `journalctl -o json` line as (cursor, record); None for lines that are not entries."""
    try:
        fields = json.loads(line)
    except ValueError:
        return None
    if not isinstance(fields, dict) or not isinstance(fields.get("__CURSOR"), str):
        return None
    record = formats.journal_record(fields)
    return Entry(fields["__CURSOR"], record) if record is not None else None


class JournalFollower:
    """Runs journalctl and queues its entries; `stop()` ends it."""

    def __init__(self, argv: list[str], *, maxsize: int = 10_000) -> None:
        self.queue: queue.Queue[Entry] = queue.Queue(maxsize=maxsize)
        self.proc = subprocess.Popen(  # noqa: S603 - our own argv
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True
        )
        self.thread = threading.Thread(target=self._read, name="journal", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            entry = parse(line)
            if entry is not None:
                self.queue.put(entry)  # blocks when full: back-pressure onto journalctl

    def drain(self, limit: int = 1000) -> list[Entry]:
        out: list[Entry] = []
        while len(out) < limit:
            try:
                out.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class _Partition(StatefulSourcePartition[Entry, str | None]):
    def __init__(self, argv_for: JournalSource, resume: str | None) -> None:
        self.cursor = resume
        self.follower = JournalFollower(argv_for.argv(resume))

    def next_batch(self) -> list[Entry]:
        batch = self.follower.drain()
        if batch:
            self.cursor = batch[-1].cursor
        return batch

    def next_awake(self) -> dt.datetime | None:
        empty = self.follower.queue.empty()
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=IDLE_AWAKE_S) if empty else None

    def snapshot(self) -> str | None:
        return self.cursor  # resume right after the last entry emitted

    def close(self) -> None:
        self.follower.stop()


class JournalSource(FixedPartitionedSource[Entry, str | None]):
    def __init__(
        self, *, file: Path | None = None, directory: Path | None = None, journalctl: str = "journalctl"
    ):
        self.file = file
        self.directory = directory
        self.journalctl = journalctl

    def argv(self, after: str | None) -> list[str]:
        return command(file=self.file, directory=self.directory, after=after, journalctl=self.journalctl)

    def list_parts(self) -> list[str]:
        return ["journal"]

    def build_part(self, step_id: str, for_part: str, resume_state: str | None) -> _Partition:
        return _Partition(self, resume_state)
