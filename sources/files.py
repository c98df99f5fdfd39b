"""Reading log files for replay: gzip, format sniffing, rotation groups and bounded chunks.

Files are read in large byte chunks that end on a line boundary, so the matcher can scan whole chunks
at once; a line longer than MAX_LINE is skipped (and reported) without ever being held in memory whole.
Journal export streams are read record by record instead, since their binary fields may hold newlines.
"""

from __future__ import annotations

import gzip
import os
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from faultline import bounds
from faultline.errors import InputError
from sources import formats

CHUNK = 4 << 20
MAX_LINE = 64 << 10
SNIFF = 64 << 10
BINARY_SNIFF = 4096  # bytes at the file's start looked at for NULs and unprintable bytes (binary data)
_ROTATION = re.compile(r"^(?P<base>.+?)(?:[.-](?P<n>\d{1,3}|\d{8}))?(?P<gz>\.gz)?$")


@dataclass(frozen=True)
class FileInfo:
    """One input file, sniffed: its format, its parse context and the node name for host-less lines."""

    index: int
    path: str
    fmt: str
    ctx: formats.Context
    default_node: str
    size: int
    notes: tuple[str, ...] = ()


@dataclass
class Chunk:
    """A run of whole lines (or of export records) from one file."""

    file: FileInfo
    first_line: int
    data: bytes = b""
    offset: int = 0  # stream offset of data[0] (uncompressed)
    records: list[tuple[int, formats.Parsed | None]] = field(default_factory=list)
    lines: int = 0
    bad_lines: int = 0
    diags: list[str] = field(default_factory=list)
    nbytes: int = 0


def is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def open_binary(path: str) -> IO[bytes]:
    if is_gzip(path):
        return gzip.GzipFile(path, "rb")  # type: ignore[return-value]  # a binary file object
    return open(path, "rb")


def expand_paths(paths: list[str]) -> list[str]:
    """Files as given; directories expanded to the regular, non-hidden files beneath them (sorted)."""
    out: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            out.extend(
                str(f)
                for f in sorted(path.rglob("*"))
                if f.is_file() and not any(part.startswith(".") for part in f.relative_to(path).parts)
            )
        else:
            out.append(p)
    return out


def rotation_groups(paths: list[str]) -> list[list[str]]:
    """Group rotated files of one log (`syslog`, `syslog.1`, `syslog.2.gz`) and order each group oldest
    first, so one reader sees a node's lines in time order. Groups keep the order of first appearance."""
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for p in paths:
        directory, name = os.path.split(p)
        m = _ROTATION.match(name)
        base, n = (m.group("base"), m.group("n")) if m else (name, None)
        # numbered rotations count up with age (.1 is newer than .2); dated ones count up with time.
        if n is None:
            rank = 10**9
        elif len(n) == 8:
            rank = int(n)
        else:
            rank = -int(n)
        groups.setdefault((directory, base), []).append((rank, p))
    return [[p for _, p in sorted(members)] for members in groups.values()]


def _default_node(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".gz", ".log", ".txt", ".json", ".export", ".dmesg", ".kmsg", ".syslog", ".journal"):
        name = name.removesuffix(suffix)
    return name or "unknown"


def sniff(
    index: int,
    path: str,
    *,
    year: int | None = None,
    boot_time: float | None = None,
    force_format: str | None = None,
    syslog_trusted: bool = True,
) -> FileInfo:
    """Open `path`, detect its format and build its parse context. Raises InputError if unusable.

    `syslog_trusted`: read syslog lines' `kernel` tags as the kernel's (see `sources.formats`). Replay's
    default, unlike the agent's: it reads files an operator chose and acts on nothing."""
    try:
        st = os.stat(path)
    except FileNotFoundError as exc:
        raise InputError(f"{path}: no such file") from exc
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from exc
    if not os.path.isfile(path):
        raise InputError(f"{path}: not a regular file")
    try:
        with open_binary(path) as fh:
            head = fh.read(SNIFF)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from exc
    mtime = datetime.fromtimestamp(st.st_mtime, tz=UTC)
    guess = formats.YearGuess(year, 1, fixed=True) if year else formats.YearGuess(mtime.year, mtime.month)
    ctx = formats.Context(guess, syslog_trusted=syslog_trusted)
    notes: list[str] = []
    if not head:
        return FileInfo(index, path, "empty", ctx, _default_node(path), st.st_size, ("file is empty",))
    start = head[:BINARY_SNIFF]
    if b"\x00" in start and not head.startswith(b"__CURSOR="):
        printable = sum(1 for b in start if 32 <= b < 127 or b in (9, 10, 13))
        if printable < 0.7 * len(start):
            raise InputError(f"{path}: binary data, not a text log (no known log format)")
    sample = head.decode("utf-8", "replace").splitlines()[:-1] or head.decode("utf-8", "replace").splitlines()
    fmt = force_format or formats.detect(sample, ctx)
    if fmt is None:
        first = next((ln for ln in sample if ln.strip()), "")
        raise InputError(
            f"{path}: not a log faultline reads: none of its first {formats.DETECT_LINES} lines starts the "
            "way a kernel log does (syslog RFC 3164 or 5424, rsyslog's ISO stamp, journalctl -o json or "
            "export, dmesg with a time, /dev/kmsg), so no line has a time; dmesg -t output has none: "
            f"write it without -t (first line: {bounds.quote(first)})"
        )
    if fmt in ("dmesg", "kmsg"):
        base = boot_time
        if base is None:
            uptime = _last_uptime(path)
            if uptime is not None:
                base = st.st_mtime - uptime
                notes.append(
                    f"times are seconds since boot; boot taken as file mtime minus the last stamp "
                    f"({datetime.fromtimestamp(base, tz=UTC).isoformat()}); pass --boot-time to set it"
                )
        ctx = formats.Context(guess, base, syslog_trusted=syslog_trusted)
    return FileInfo(index, path, fmt, ctx, _default_node(path), st.st_size, tuple(notes))


def _last_uptime(path: str) -> float | None:
    with open_binary(path) as fh:
        if is_gzip(path):
            tail = b""
            try:
                while block := fh.read(CHUNK):
                    tail = (tail + block)[-SNIFF:]
            except (OSError, EOFError, zlib.error):
                pass  # damaged further on: the last stamp before the damage (the chunker reports it)
        else:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - SNIFF))
            tail = fh.read()
    return formats.last_uptime(tail.decode("utf-8", "replace").splitlines()[1:] or [""])


@dataclass
class Inputs:
    """The outcome of sniffing every input: usable files, and one message per unusable one."""

    files: list[FileInfo] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def groups(self) -> list[list[FileInfo]]:
        by_path = {i.path: i for i in self.files}
        return [[by_path[p] for p in g] for g in rotation_groups([i.path for i in self.files])]


def sniff_all(
    paths: list[str],
    *,
    year: int | None = None,
    boot_time: float | None = None,
    force_format: str | None = None,
    syslog_trusted: bool = True,
) -> Inputs:
    inputs = Inputs()
    for index, path in enumerate(paths):
        try:
            info = sniff(
                index, path, year=year, boot_time=boot_time, force_format=force_format,
                syslog_trusted=syslog_trusted,
            )  # fmt: skip
        except InputError as exc:
            inputs.errors.append(str(exc))
            continue
        inputs.notes.extend(f"{info.path}: {note}" for note in info.notes)
        if info.fmt != "empty":
            inputs.files.append(info)
    return inputs


class TextChunker:
    """Splits a byte stream into chunks of whole lines, skipping over-long lines as it goes."""

    def __init__(self, info: FileInfo, fh: IO[bytes], *, chunk: int = CHUNK, max_line: int = MAX_LINE):
        self.info = info
        self.fh = fh
        self.chunk = chunk
        self.max_line = max_line
        self.line_no = 1  # number of the next line to emit
        self.pos = 0  # stream offset of the first byte of `carry`
        self.carry = b""
        self.skipping = False  # inside an over-long line, discarding to its end
        self.done = False
        self.error: str | None = None

    def __iter__(self) -> Iterator[Chunk]:
        return self

    def __next__(self) -> Chunk:
        if self.done:
            raise StopIteration
        out = Chunk(self.info, self.line_no)
        while True:
            block = self._read()
            out.nbytes += len(block)
            if not block:
                self.done = True
                out.offset = self.pos
                if self.error is not None:
                    out.diags.append(self.error)
                if self.skipping:
                    self._oversize(out)
                elif self.carry:
                    out.data, out.offset, self.carry = self.carry, self.pos, b""
                self._count(out)
                return out
            if self.skipping:
                nl = block.find(b"\n")
                if nl < 0:
                    self.pos += len(block)
                    continue
                self._oversize(out)
                self.pos += nl + 1
                block = block[nl + 1 :]
                self.skipping = False
                out.first_line = self.line_no
            nl = block.rfind(b"\n")
            if nl < 0:
                self.carry += block
                if len(self.carry) > self.max_line:
                    self.pos += len(self.carry)
                    self.carry, self.skipping = b"", True
                continue
            # one copy: the carried partial line joined with this block's whole lines
            out.data = b"".join((self.carry, memoryview(block)[: nl + 1])) if self.carry else block[: nl + 1]
            out.offset = self.pos
            self.pos += len(out.data)
            self.carry = block[nl + 1 :]
            if len(self.carry) > self.max_line:
                self.pos += len(self.carry)
                self.carry, self.skipping = b"", True
            self._count(out)
            return out

    def _read(self) -> bytes:
        """The next block; on a damaged stream, what could be read before the damage, then EOF."""
        if self.error is not None:
            return b""
        if not isinstance(self.fh, gzip.GzipFile):
            return self.fh.read(self.chunk)
        # gzip loses a whole read() to a truncated or corrupt stream: read it in steps instead.
        parts: list[bytes] = []
        got = 0
        try:
            while got < self.chunk:
                part = self.fh.read1(self.chunk - got)
                if not part:
                    break
                parts.append(part)
                got += len(part)
        except (OSError, EOFError, zlib.error) as exc:
            at = self.pos + len(self.carry) + got
            self.error = f"{self.info.path}: damaged after {at} bytes, rest skipped: {exc}"
        return b"".join(parts)

    def _oversize(self, out: Chunk) -> None:
        out.bad_lines += 1
        out.diags.append(f"{self.info.path}:{self.line_no}: line longer than {self.max_line} bytes, skipped")
        self.line_no += 1
        out.lines += 1

    def _count(self, out: Chunk) -> None:
        n = out.data.count(b"\n")
        if out.data and not out.data.endswith(b"\n"):
            n += 1
        out.lines += n
        self.line_no += n


class ExportReader:
    """Reads `journalctl -o export` records (text fields `KEY=value`, binary fields `KEY\\n<u64 len>data`)."""

    def __init__(self, info: FileInfo, fh: IO[bytes], *, batch: int = 4096):
        self.info = info
        self.fh = fh
        self.batch = batch
        self.record_no = 1
        self.done = False

    def __iter__(self) -> Iterator[Chunk]:
        return self

    def __next__(self) -> Chunk:
        if self.done:
            raise StopIteration
        out = Chunk(self.info, self.record_no)
        for _ in range(self.batch):
            record, nbytes, error = self._record()
            out.nbytes += nbytes
            if record is None and error is None:
                self.done = True
                break
            out.lines += 1
            if error is not None:
                out.bad_lines += 1
                out.diags.append(f"{self.info.path}: record {self.record_no}: {error}")
                out.records.append((self.record_no, None))
                if error.startswith("truncated"):
                    self.done = True
                    self.record_no += 1
                    break
            else:
                assert record is not None
                parsed = formats.parse_export_fields(record)
                if parsed is None:
                    out.bad_lines += 1
                    out.diags.append(f"{self.info.path}: record {self.record_no}: no MESSAGE or timestamp")
                out.records.append((self.record_no, parsed))
            self.record_no += 1
        return out

    def _record(self) -> tuple[dict[str, bytes] | None, int, str | None]:
        record: dict[str, bytes] = {}
        nbytes = 0
        while True:
            line = self.fh.readline(MAX_LINE + 1)
            nbytes += len(line)
            if not line:
                return (record or None), nbytes, ("truncated record at end of file" if record else None)
            if line == b"\n":
                if record:
                    return record, nbytes, None
                continue
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                rest = self.fh.readline()
                while rest and not rest.endswith(b"\n"):
                    nbytes += len(rest)
                    rest = self.fh.readline()
                return {}, nbytes + len(rest), f"field longer than {MAX_LINE} bytes"
            line = line.rstrip(b"\n")
            key, eq, value = line.partition(b"=")
            if eq:
                record[key.decode("ascii", "replace")] = value
                continue
            size_raw = self.fh.read(8)
            nbytes += len(size_raw)
            if len(size_raw) < 8:
                return None, nbytes, "truncated binary field at end of file"
            (size,) = struct.unpack("<Q", size_raw)
            if size > MAX_LINE:
                if not self._skip(size + 1):
                    return None, nbytes, f"truncated binary field at end of file (it says {size} bytes)"
                nbytes += size + 1
                continue
            data = self.fh.read(size)
            self.fh.read(1)
            nbytes += size + 1
            record[key.decode("ascii", "replace")] = data

    def _skip(self, size: int) -> bool:
        """Skip an over-long binary field (without reading it where the file can seek); False when the
        stream ends first. The size is the file's word: up to 2**64, past any seek offset."""
        if self.fh.seekable() and not isinstance(self.fh, gzip.GzipFile):
            here = self.fh.tell()
            end = self.fh.seek(0, os.SEEK_END)
            self.fh.seek(min(here + size, end))
            return here + size <= end
        while size > 0:
            part = self.fh.read(min(size, CHUNK))
            if not part:
                return False
            size -= len(part)
        return True


def chunks(info: FileInfo, fh: IO[bytes]) -> Iterator[Chunk]:
    if info.fmt == "export":
        return ExportReader(info, fh)
    return TextChunker(info, fh)
