"""Matching the agent's kernel-log entries (journal, syslog file, kmsg) batch by batch, with the record
assembly of `sources.records` across batches and the origin check of the packs (pure logic, no I/O)."""

from __future__ import annotations

import bisect
import itertools

from sources import formats
from sources.journal import Entry
from sources.records import Assembly, RecordMatcher
from sources.scan import Timed


class EntryMatcher:
    """Matches the agent's batches of kernel-log entries (journal, syslog file or kmsg) as one pack
    source, assembling records whose lines may span batches: a record still open at the end of a batch
    waits for the next one (and is matched as it stands meanwhile). `untrusted` counts kernel-looking
    lines from user space."""

    def __init__(self, compiled: RecordMatcher, kind: str, position: int) -> None:
        self.compiled = compiled
        self.kind = kind
        self.position = position
        self.pending: Assembly | None = None
        self.untrusted = 0

    def __call__(self, entries: list[Entry]) -> list[Timed]:
        out: list[Timed] = []
        start = 0
        if self.pending is not None:
            pending, self.pending = self.pending, None
            while start < len(entries) and pending.offer(_record(entries[start])):
                start += 1
            self._record(pending, out, start >= len(entries))
        if not entries:
            return out
        compiled, kind = self.compiled, self.kind
        # the literal prefilter runs once over the whole batch (messages joined by newlines; no literal
        # holds one); only the messages it points at are matched one by one
        encoded = [entry.record.message.encode("utf-8", "replace") for entry in entries]
        starts = list(itertools.accumulate((len(m) + 1 for m in encoded[:-1]), initial=0))
        chosen = sorted(
            {bisect.bisect_right(starts, s) - 1 for s, _ in compiled.candidate_lines(b"\n".join(encoded))}
        )
        for index in chosen:
            raw = entries[index].record
            rec = formats.one_line(raw)  # matched joined; reported as written
            hits, untrusted = compiled.match_line(kind, rec.message, rec.kernel)
            self.untrusted += untrusted
            out.extend(Timed(rec.ts, (self.position, 0), h, raw.message, rec.boot, kind) for h in hits)
            if compiled.record_start(rec.message):
                assembly = Assembly(rec, compiled)
                following = index + 1
                while following < len(entries) and assembly.offer(_record(entries[following])):
                    following += 1
                self._record(assembly, out, following >= len(entries))
        return out

    def _record(self, assembly: Assembly, out: list[Timed], at_end: bool) -> None:
        hits, untrusted = assembly.match(self.kind)
        if not (hits or untrusted) and at_end and assembly.open:
            self.pending = assembly  # its next lines may come in the next batch
            return
        first = assembly.first
        text, position = assembly.text, (self.position, 0)
        out.extend(Timed(first.ts, position, h, text, first.boot, self.kind) for h in hits)
        self.untrusted += untrusted


def _record(entry: Entry) -> formats.Parsed:
    return formats.one_line(entry.record)
