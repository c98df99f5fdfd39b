"""Turns one chunk of a log file into timed matches per node (pure logic, no I/O).

Only lines the matcher's prefilter finds in the raw bytes are split out, decoded and parsed; every
other line costs a share of one RE2 scan over the chunk and a newline count.  Lines with NUL bytes are
skipped, invalid UTF-8 is decoded with replacement characters, and both are counted and reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from sources import formats
from sources.files import MAX_LINE, Chunk

MAX_DIAGS_PER_FILE = 5


class Matcher(Protocol):
    """What the scan needs from the pattern engine: a byte prefilter and a message matcher."""

    def candidate_lines(self, data: bytes) -> Iterator[tuple[int, int]]: ...

    def prefilter(self, message: str) -> bool: ...

    def match(self, source: str, message: str) -> tuple[Any, ...]: ...


class Timed(NamedTuple):
    """One hit at one time. `order` (file index, byte offset or record number) breaks ties
    deterministically."""

    ts: float
    order: tuple[int, int]
    hit: Any
    message: str
    boot: float | None
    source: str = ""  # the pack source it came from (live inputs set it; replay does not need it)


@dataclass
class Stats:
    lines: int = 0
    candidates: int = 0
    unparseable: int = 0
    binary: int = 0
    invalid_utf8: int = 0
    oversize: int = 0
    mixed: int = 0
    bytes: int = 0
    files: int = 0

    def add(self, other: Stats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def skipped(self) -> int:
        return self.unparseable + self.binary + self.oversize


@dataclass
class ScanResult:
    by_node: dict[str, list[Timed]] = field(default_factory=dict)
    stats: Stats = field(default_factory=Stats)
    diags: list[str] = field(default_factory=list)


class _Diags:
    """Caps diagnostics per file and kind so a garbage file cannot flood the terminal; the line number of
    a byte offset is only worked out for the diagnostics that are kept."""

    def __init__(self, out: list[str], path: str, line_of: Callable[[int], int]) -> None:
        self.out = out
        self.path = path
        self.line_of = line_of
        self.counts: dict[str, int] = {}

    def add(self, kind: str, offset: int, text: str) -> None:
        n = self.counts.get(kind, 0) + 1
        self.counts[kind] = n
        if n <= MAX_DIAGS_PER_FILE:
            self.out.append(f"{self.path}:{self.line_of(offset)}: {text}")


def _line_starts_with(data: bytes, needle: bytes) -> set[int]:
    starts: set[int] = set()
    pos = data.find(needle)
    while pos >= 0:
        ls = data.rfind(b"\n", 0, pos) + 1
        starts.add(ls)
        le = data.find(b"\n", pos)
        if le < 0:
            break
        pos = data.find(needle, le)
    return starts


def _invalid_utf8_lines(data: bytes) -> list[int]:
    bad: list[int] = []
    pos = 0
    for line in data.split(b"\n"):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(pos)
        pos += len(line) + 1
    return bad


def scan(chunk: Chunk, matcher: Matcher, node_override: str | None = None) -> ScanResult:
    result = ScanResult()
    stats = result.stats
    stats.lines = chunk.lines
    stats.oversize = chunk.bad_lines if chunk.file.fmt != "export" else 0
    stats.unparseable = chunk.bad_lines if chunk.file.fmt == "export" else 0
    stats.bytes = chunk.nbytes
    result.diags.extend(chunk.diags)
    if chunk.file.fmt == "export":
        _scan_records(chunk, matcher, node_override, result)
    elif chunk.data:
        _scan_text(chunk, matcher, node_override, result)
    return result


def _add(result: ScanResult, node: str, timed: Timed) -> None:
    bucket = result.by_node.get(node)
    if bucket is None:
        result.by_node[node] = [timed]
    else:
        bucket.append(timed)


def _scan_text(chunk: Chunk, matcher: Matcher, node_override: str | None, result: ScanResult) -> None:
    data, info, stats = chunk.data, chunk.file, result.stats
    diags = _Diags(result.diags, info.path, lambda offset: chunk.first_line + data.count(b"\n", 0, offset))
    fmt, ctx, file_index = info.fmt, info.ctx, info.index

    binary = _line_starts_with(data, b"\x00") if b"\x00" in data else set()
    for ls in sorted(binary):
        diags.add("binary", ls, "binary data (NUL bytes), line skipped")
    stats.binary += len(binary)
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            bad = _invalid_utf8_lines(data)
            stats.invalid_utf8 += len(bad)
            for ls in bad:
                diags.add("utf8", ls, "invalid UTF-8, decoded with replacement characters")
    offset = chunk.offset
    warned_mixed = False
    for ls, le in matcher.candidate_lines(data):
        stats.candidates += 1
        if ls in binary:
            continue
        if le - ls > MAX_LINE:
            stats.oversize += 1
            diags.add("oversize", ls, f"line longer than {MAX_LINE} bytes, skipped")
            continue
        text = data[ls:le].decode("utf-8", "replace")
        parsed = formats.parse_line(fmt, text.rstrip("\r"), ctx)
        if parsed is None:
            stats.unparseable += 1
            diags.add("unparseable", ls, f"not a {fmt} line, skipped: {text[:120]!r}")
            continue
        line_fmt, rec = parsed
        if line_fmt != fmt:
            stats.mixed += 1
            if not warned_mixed:
                diags.add("mixed", ls, f"line is {line_fmt}, file was detected as {fmt}")
                warned_mixed = True
        hits = matcher.match(formats.SOURCE_OF_FORMAT[line_fmt], rec.message)
        if hits:
            node = node_override or rec.host or info.default_node
            bucket = result.by_node.get(node)
            if bucket is None:
                bucket = result.by_node[node] = []
            order = (file_index, offset + ls)
            for hit in hits:
                bucket.append(Timed(rec.ts, order, hit, rec.message, rec.boot))


def _scan_records(chunk: Chunk, matcher: Matcher, node_override: str | None, result: ScanResult) -> None:
    info = chunk.file
    for record_no, rec in chunk.records:
        if rec is None:
            continue
        if not matcher.prefilter(rec.message):
            continue
        result.stats.candidates += 1
        hits = matcher.match("journal", rec.message)
        if hits:
            node = node_override or rec.host or info.default_node
            for hit in hits:
                _add(result, node, Timed(rec.ts, (info.index, record_no), hit, rec.message, rec.boot))
