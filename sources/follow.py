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
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

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
        if len(head) < 3 or not head[1].isdigit():
            return None
        seq = int(head[1])
        if seq <= self.last_seq:
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
