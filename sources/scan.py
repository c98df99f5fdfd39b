"""Turns one chunk of a log file into timed matches per node (pure logic, no I/O).

Only lines the matcher's prefilter finds in the raw bytes are split out, decoded and parsed; every
other line costs a share of one RE2 scan over the chunk and a newline count.  Lines with NUL bytes are
skipped, invalid UTF-8 is decoded with replacement characters, and both are counted and reported.

Multi-line records (see `sources.records`): a dmesg line's indented continuation lines are joined to it
(a candidate continuation line is traced back to its first line); a line that opens a record pattern's
record is assembled with the lines after it. A line that says it is not the kernel's concludes nothing
for kernel-origin patterns and is counted as untrusted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from faultline import bounds
from sources import formats, records
from sources.files import MAX_LINE, Chunk

MAX_DIAGS_PER_FILE = 5
MAX_CONTINUATION = 16  # indented dmesg lines one record may have
QUOTED_LINE = 120  # characters of a line that did not parse, quoted in its diagnostic


class Matcher(Protocol):
    """What the scan needs from the pattern engine: a byte prefilter, a message matcher and what
    record assembly needs."""

    record_lines: int
    record_within: float

    def candidate_lines(self, data: bytes) -> Iterator[tuple[int, int]]: ...

    def prefilter(self, message: str) -> bool: ...

    def record_start(self, message: str) -> bool: ...

    def match_line(
        self, source: str, message: str, kernel: bool = True, *, records: bool = False
    ) -> tuple[tuple[Any, ...], bool]: ...


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
    untrusted: int = 0  # kernel-looking lines that say they come from user space
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
    binary = _damaged(data, diags, stats)
    offset = chunk.offset
    warned_mixed = False
    consumed = 0  # end of the last dmesg record taken: candidates before it were part of it
    for start, end_of_line in matcher.candidate_lines(data):
        stats.candidates += 1
        ls, le = start, end_of_line
        if ls < consumed or ls in binary:
            continue
        if le - ls > MAX_LINE:
            stats.oversize += 1
            diags.add("oversize", ls, f"line longer than {MAX_LINE} bytes, skipped")
            continue
        if fmt == "dmesg" and data[ls : ls + 1] in (b" ", b"\t"):
            ls = _dmesg_head(data, ls)  # a continuation line: its record starts further up
            if ls < consumed:
                continue
            le = data.find(b"\n", ls)
        text = data[ls:le].decode("utf-8", "replace")
        parsed = formats.parse_line(fmt, text.rstrip("\r"), ctx)
        if parsed is None:
            stats.unparseable += 1
            diags.add("unparseable", ls, f"not a {fmt} line, skipped: {bounds.quote(text, QUOTED_LINE)}")
            continue
        line_fmt, written = parsed
        rec = formats.one_line(written)  # matched joined; reported as written
        if line_fmt != fmt:
            stats.mixed += 1
            if not warned_mixed:
                diags.add("mixed", ls, f"line is {line_fmt}, file was detected as {fmt}")
                warned_mixed = True
        end, message = le, written.message
        if line_fmt == "dmesg":
            more, end = _indented(data, le)
            if more:  # one record: matched and reported joined
                rec = rec._replace(message=formats.join_lines([rec.message, *more]))
                message = rec.message
            consumed = end
        source = formats.SOURCE_OF_FORMAT[line_fmt]
        hits, untrusted = matcher.match_line(source, rec.message, rec.kernel)
        node = node_override or rec.host or info.default_node
        order = (file_index, offset + ls)
        for hit in hits:
            _add(result, node, Timed(rec.ts, order, hit, message, rec.boot))
        if matcher.record_start(rec.message):
            assembly = _assemble(data, end + 1, rec, fmt, ctx, matcher)
            untrusted = _add_record(result, node, order, assembly, source) or untrusted
        stats.untrusted += untrusted


def _add_record(
    result: ScanResult, node: str, order: tuple[int, int], assembly: records.Assembly, source: str
) -> bool:
    """Matches an assembled record and adds its hits; whether it was an untrusted kernel-looking one."""
    hits, untrusted = assembly.match(source)
    first = assembly.first
    for hit in hits:
        _add(result, node, Timed(first.ts, order, hit, assembly.text, first.boot))
    return untrusted


def _damaged(data: bytes, diags: _Diags, stats: Stats) -> set[int]:
    """Counts and reports lines with NUL bytes (returned: they are skipped) and invalid UTF-8."""
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
    return binary


def _assemble(
    data: bytes, pos: int, first: formats.Parsed, fmt: str, ctx: formats.Context, matcher: Matcher
) -> records.Assembly:
    """The record `first` opens, from the lines at `pos` onwards (each parsed only when reached)."""
    assembly = records.Assembly(first, matcher)
    while assembly.open and pos < len(data):
        nl = data.find(b"\n", pos)
        nl = len(data) if nl < 0 else nl
        following = formats.parse_line(fmt, data[pos:nl].decode("utf-8", "replace").rstrip("\r"), ctx)
        assembly.offer(following[1] if following is not None else None)
        pos = nl + 1
    return assembly


def _dmesg_head(data: bytes, ls: int) -> int:
    """The start of the line that an indented dmesg line continues (or of the topmost indented line,
    which then fails to parse, when the record began before the chunk)."""
    for _ in range(MAX_CONTINUATION):
        if ls == 0:
            break
        prev = data.rfind(b"\n", 0, ls - 1) + 1
        ls = prev
        if data[prev : prev + 1] not in (b" ", b"\t"):
            break
    return ls


def _indented(data: bytes, le: int) -> tuple[list[str], int]:
    """The indented lines after the line ending at `le` (dmesg's continuation lines of one record), and
    the end of the last one."""
    lines: list[str] = []
    end = le
    while len(lines) < MAX_CONTINUATION and data[end + 1 : end + 2] in (b" ", b"\t"):
        nl = data.find(b"\n", end + 1)
        nl = len(data) if nl < 0 else nl
        lines.append(data[end + 1 : nl].decode("utf-8", "replace").strip())
        end = nl
    return lines, end


def _scan_records(chunk: Chunk, matcher: Matcher, node_override: str | None, result: ScanResult) -> None:
    info = chunk.file
    entries = chunk.records
    for index, (record_no, parsed) in enumerate(entries):
        if parsed is None:
            continue
        if not matcher.prefilter(parsed.message):
            continue
        rec = formats.one_line(parsed)  # matched joined; reported as written
        result.stats.candidates += 1
        hits, untrusted = matcher.match_line("journal", rec.message, rec.kernel)
        node = node_override or rec.host or info.default_node
        for hit in hits:
            _add(result, node, Timed(rec.ts, (info.index, record_no), hit, parsed.message, rec.boot))
        if matcher.record_start(rec.message):
            assembly = records.Assembly(rec, matcher)
            following = index + 1
            while following < len(entries) and assembly.offer(_one_line(entries[following][1])):
                following += 1
            untrusted = _add_record(result, node, (info.index, record_no), assembly, "journal") or untrusted
        result.stats.untrusted += untrusted


def _one_line(rec: formats.Parsed | None) -> formats.Parsed | None:
    return formats.one_line(rec) if rec is not None else None
