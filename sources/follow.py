"""Following kernel logs without the journal: a syslog file across rotations, and /dev/kmsg.

`SyslogFollower.poll()` returns the complete lines written since the last poll. It follows the path by
inode: when the file is rotated (a new inode) or truncated (shorter than our offset, or its first bytes
changed: copytruncate followed by new writes), it first reads what remains of the old one, then starts
the new one from the beginning. Its position `(inode, offset)` is its resume state.

`KmsgReader.poll()` returns the records of a kmsg device (or a file of kmsg records), skipping every
sequence number it has already returned for this boot, so a restart resumes with no duplicates.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from sources import formats
from sources.journal import Entry

MAX_READ = 1 << 20
HEAD_BYTES = 256


@dataclass
class SyslogFollower:
    path: Path
    inode: int = 0
    offset: int = 0
    _fh: IO[bytes] | None = None
    _partial: bytes = b""
    _head: bytes = b""  # the file's first bytes: if they change, it was truncated and rewritten

    def position(self) -> tuple[int, int]:
        return (self.inode, self.offset)

    def poll(self) -> list[str]:
        lines: list[str] = []
        try:
            st = self.path.stat()
        except FileNotFoundError:
            st = None
        if self._fh is not None and (st is None or st.st_ino != self.inode):
            lines += self._read()  # rotated away: finish the old file first
            self._close()
        elif self._fh is not None and st is not None and (st.st_size < self.offset or not self._same_head()):
            self._close()  # truncated in place (copytruncate): what was there is gone; start over
            self.offset = 0
        if self._fh is None and st is not None:
            self._fh = self.path.open("rb")
            if st.st_ino != self.inode:
                self.inode, self.offset = st.st_ino, 0
            self._fh.seek(self.offset)
        if self._fh is not None:
            lines += self._read()
        return lines

    def _same_head(self) -> bool:
        assert self._fh is not None
        return not self._head or os.pread(self._fh.fileno(), len(self._head), 0) == self._head

    def _read(self) -> list[str]:
        assert self._fh is not None
        data = self._fh.read(MAX_READ)
        if not data:
            return []
        if self.offset == 0:
            self._head = data[:HEAD_BYTES]
        self.offset += len(data)
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        return data[:cut].decode("utf-8", "replace").splitlines()

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh = None
        self._partial = b""
        self._head = b""

    def close(self) -> None:
        self._close()


@dataclass
class KmsgReader:
    """Reads kmsg records (`prio,seq,usec,flags;message`). `last_seq` is the resume state for `boot_id`."""

    path: Path = Path("/dev/kmsg")
    boot_id: str = ""
    last_seq: int = -1
    _fd: int | None = None

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)

    def poll(self, limit: int = 10_000) -> list[str]:
        if self._fd is None:
            self.open()
        assert self._fd is not None
        records: list[str] = []
        buffered = b""
        while len(records) < limit:
            try:
                chunk = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten before we read them: go on
                    continue
                raise
            if not chunk:
                break
            buffered += chunk
            *complete, buffered = buffered.split(b"\n")
            for raw in complete:
                record = self._accept(raw.decode("utf-8", "replace"))
                if record is not None:
                    records.append(record)
        return records

    def _accept(self, line: str) -> str | None:
        if not line or line.startswith(" "):  # continuation lines carry key=value context
            return None
        head = line.partition(";")[0].split(",")
        seq = formats.uint(head[1]) if len(head) >= 3 else None  # not '²', not 5000 digits
        if seq is None or seq <= self.last_seq:
            return None
        self.last_seq = seq
        return line

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def current_boot_id(proc: Path = Path("/proc")) -> str:
    try:
        return (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return ""


class _FollowPartition(StatefulSourcePartition[Entry, tuple[Any, ...]]):
    def __init__(self, source: LogFollowSource, resume: tuple[Any, ...] | None) -> None:
        self.source = source
        self.next_poll = dt.datetime.now(dt.UTC)
        if source.kind == "kmsg":
            boot_id = current_boot_id()
            last = resume[1] if resume and resume[0] == boot_id else -1  # a new boot starts over
            self.reader: SyslogFollower | KmsgReader = KmsgReader(source.path, boot_id=boot_id, last_seq=last)
        else:
            inode, offset = resume if resume else (0, 0)
            self.reader = SyslogFollower(source.path, inode=inode, offset=offset)

    def next_batch(self) -> list[Entry]:
        now = dt.datetime.now(dt.UTC)
        if now < self.next_poll:
            return []
        self.next_poll = now + dt.timedelta(seconds=self.source.interval)
        year = now.year
        trusted = self.source.syslog_trusted
        ctx = formats.Context(formats.YearGuess(year, now.month), _boot_epoch(), syslog_trusted=trusted)
        kmsg = self.source.kind == "kmsg"
        out = []
        for line in self.reader.poll():
            parsed = formats.parse_line("kmsg" if kmsg else "rfc3164", line, ctx)
            if parsed is not None:
                record = parsed[1]
                if not (kmsg or trusted) and record.kernel:  # a dmesg-looking line: it shows no writer
                    record = record._replace(kernel=False)
                out.append(Entry(f"{self.source.kind}:{self.snapshot()}", record))
        return out

    def next_awake(self) -> dt.datetime | None:
        return self.next_poll

    def snapshot(self) -> tuple[Any, ...]:
        if isinstance(self.reader, KmsgReader):
            return (self.reader.boot_id, self.reader.last_seq)
        return self.reader.position()

    def close(self) -> None:
        self.reader.close()


class LogFollowSource(FixedPartitionedSource[Entry, tuple[Any, ...]]):
    """Polls a syslog file (`kind="syslog"`) or a kmsg device (`kind="kmsg"`) every `interval` seconds.

    A syslog file's lines are never the kernel's unless `syslog_trusted` (the agent's setting): its tags are
    the writers' word, and any local user can write `logger -t kernel`."""

    def __init__(self, kind: str, path: Path, *, interval: float = 0.2, syslog_trusted: bool = False) -> None:
        if kind not in ("syslog", "kmsg"):
            raise ValueError(f"unknown log kind {kind!r} (syslog or kmsg)")
        self.kind = kind
        self.path = path
        self.interval = interval
        self.syslog_trusted = syslog_trusted

    def list_parts(self) -> list[str]:
        return [self.kind]

    def build_part(
        self, step_id: str, for_part: str, resume_state: tuple[Any, ...] | None
    ) -> _FollowPartition:
        return _FollowPartition(self, resume_state)


def _boot_epoch(proc: Path = Path("/proc")) -> float | None:
    """When this machine booted (epoch seconds), for kmsg times counted from boot."""
    try:
        uptime = float((proc / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime
