"""Record assembly: a kernel record the driver wrote over several log lines, joined before matching.

Two kinds of multi-line record reach faultline:

- Marked as one record by the kernel or the writer: a journal MESSAGE with newlines, rsyslog's `#012`,
  kmsg's `\\x0a` (joined by `sources.formats` as it parses), dmesg's indented continuation lines
  (joined by `sources.scan`, which sees the neighbouring lines). Every pattern sees the joined record.
- One record printed as separate lines, each its own syslog line or journal entry (the NVIDIA driver's
  three-line "fallen off the bus" message on kernels that split a multi-line printk). Nothing marks
  where such a record ends, so only the patterns that declare `record:` see it: a line holding one of
  their start literals opens an `Assembly`, and the lines after it continue it while they come from the
  same node and origin, within the record's time, begin with the first line's driver prefix (`NVRM: `)
  and do not open a record themselves. Lines of other nodes or writers in between are passed over.

Only a line that opens a record (found by the byte prefilter, which holds the start literals) and the
few lines after it are ever parsed for this; other lines cost nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from sources import formats


class RecordMatcher(Protocol):
    """What assembly needs from the compiled packs (`patterns.compiler.CompiledPacks`)."""

    record_lines: int
    record_within: float

    def record_start(self, message: str) -> bool: ...

    def candidate_lines(self, data: bytes) -> Iterator[tuple[int, int]]: ...

    def match_line(
        self, source: str, message: str, kernel: bool = True, *, records: bool = False
    ) -> tuple[tuple[Any, ...], bool]: ...


class Assembly:
    """A record being assembled from its first line; `offer` the lines that follow, in order."""

    __slots__ = ("first", "lines", "looked", "matcher", "open", "prefix")

    def __init__(self, first: formats.Parsed, matcher: RecordMatcher) -> None:
        self.first = first
        self.matcher = matcher
        self.prefix = formats.driver_prefix(first.message)
        self.lines = [first.message]
        self.looked = 0
        self.open = bool(self.prefix)

    def offer(self, rec: formats.Parsed | None) -> bool:
        """Take the next line if it continues the record; False once the record is closed."""
        if not self.open:
            return False
        m, first = self.matcher, self.first
        self.looked += 1
        if rec is not None and (
            (rec.host, rec.kernel) != (first.host, first.kernel)
            or not (first.kernel or rec.message.startswith(self.prefix))
        ):
            # another node's line in a merged file, or another writer's (user-space writers are told
            # apart only by the record's prefix): look past it, a few times
            if self.looked < 2 * m.record_lines:
                return True
            self.open = False
            return False
        if (
            rec is None
            or abs(rec.ts - first.ts) > m.record_within
            or not rec.message.startswith(self.prefix)
            or m.record_start(rec.message)
        ):
            self.open = False
            return False
        self.lines.append(rec.message)
        if len(self.lines) >= m.record_lines:
            self.open = False
        return True

    @property
    def text(self) -> str:
        return formats.join_lines(self.lines)

    def match(self, source: str) -> tuple[tuple[Any, ...], bool]:
        return self.matcher.match_line(source, self.text, self.first.kernel, records=True)
