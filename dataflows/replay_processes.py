"""`faultline replay --processes N`: the per-line work (prefilter, parse, match) in N processes, the
detection once, in this one.

    files ── byte ranges (jobs) ── N scanning processes ── hits per node, in job order ── a detector per node

The one-process replay (`dataflows.replay`) is a Bytewax dataflow whose workers are threads: the per-line
work holds the GIL, so more workers do not make it faster. Here a file of one-line-per-record text
(RFC 3164, RFC 5424, ISO-stamped, journal JSON) larger than JOB_BYTES is cut into ranges of whole lines,
each scanned by a forked process that holds the compiled packs already (nothing is compiled again); a
compressed file, a journal export or a dmesg file (whose records may span lines) is one job. The hits
(a few per cent of the lines) come back in job order, and each node's detector sees them as the
one-process replay would: chunk after chunk in file order, each chunk in time order. A multi-line record
(a register dump) cut by a range boundary is matched as its lines, as one cut by a 4 MiB chunk boundary
is in one process.

A diagnostic names its line as counted from its job's first line; the lines of the jobs before it, which
come back first, give the file's line number. The kinds of diagnostic that are capped (unparseable or
mixed lines) are capped per chunk, here as in one process, so a file cut in ranges may say a few more of
them; and as each chunk is put in time order on its own, lines far out of time order across a range
boundary reach the detectors in another order than in one process. A read error ends its file's replay
with the one-process replay's diagnostic, what was read before it kept.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, cast

from dataflows.replay import ReplayResult, sort_key
from faultline.models import Fault
from patterns.compiler import CompiledPacks
from patterns.detectors import NodeDetector
from sources import files, scan
from sources.replay import READ_ERRORS, ProgressFn, read_error

JOB_BYTES = 32 << 20  # the largest range of a file: a job's start costs nothing beside its work
JOB_MIN_BYTES = 4 << 20  # the smallest (one chunk): a file is cut in about four ranges per process
READ_BYTES = 1 << 20  # the most read at once while looking for the end of a line
SPLITTABLE = frozenset({"rfc3164", "rfc5424", "iso", "json"})  # one record a line: any line starts one

_STATE: dict[str, Any] = {}  # the compiled packs, for the forked scanning processes


@dataclass(frozen=True)
class Job:
    info: files.FileInfo
    start: int  # the byte offset of its first line
    end: int | None  # past its last line (None: to the end of the file)
    first: bool  # the file's first job (its line numbers are the file's)


Packed = tuple[float, int, int, int, int, float | None]  # ts, order (2), hit index, message index, boot


@dataclass
class JobResult:
    """A job's hits, packed for the trip back: each distinct hit and message once per job (a flood
    repeats both thousands of times), every hit a tuple of numbers; by node, per chunk, in order."""

    by_chunk: list[dict[str, list[Packed]]] = field(default_factory=list)
    hits: list[Any] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    stats: scan.Stats = field(default_factory=scan.Stats)
    diags: list[str] = field(default_factory=list)
    lines: int = 0
    nbytes: int = 0
    timeouts: int = 0  # regex matches that ran out of time (counted where they ran)
    failed: bool = False  # a read error ended it: the rest of its file is skipped, as in one process

    def pack(
        self, by_node: dict[str, list[scan.Timed]], hits: dict[Any, int], messages: dict[str, int]
    ) -> None:
        packed: dict[str, list[Packed]] = {}
        for node, batch in by_node.items():
            out = packed[node] = []
            for t in batch:
                h = hits.get(t.hit)
                if h is None:
                    h = hits[t.hit] = len(self.hits)
                    self.hits.append(t.hit)
                m = messages.get(t.message)
                if m is None:
                    m = messages[t.message] = len(self.messages)
                    self.messages.append(t.message)
                out.append((t.ts, t.order[0], t.order[1], h, m, t.boot))
        self.by_chunk.append(packed)


class _Range:
    """A binary file object that reads `fh` from where it is for at most `limit` bytes (None: to EOF)."""

    def __init__(self, fh: IO[bytes], limit: int | None) -> None:
        self.fh = fh
        self.left = limit

    def read(self, size: int = -1) -> bytes:
        if self.left is None:
            return self.fh.read(size)
        if self.left <= 0:
            return b""
        data = self.fh.read(self.left if size < 0 else min(size, self.left))
        self.left -= len(data)
        return data


def plan(groups: list[list[files.FileInfo]], processes: int) -> list[Job]:
    """The jobs, in the order the detectors must see their hits: group after group, file after file,
    range after range. A range ends where a line begins."""
    jobs = []
    for group in groups:
        for info in group:
            cuts = _cuts(info, max(JOB_MIN_BYTES, min(JOB_BYTES, info.size // (4 * processes))))
            for i, start in enumerate(cuts):
                end = cuts[i + 1] if i + 1 < len(cuts) else None
                jobs.append(Job(info, start, end, i == 0))
    return jobs


def _cuts(info: files.FileInfo, job_bytes: int) -> list[int]:
    """Where the file's ranges begin: [0] alone for a file that is one job (records that may span lines,
    small, compressed, or gone or unreadable since it was sniffed: its job says so)."""
    cuts = [0]
    try:
        if info.fmt not in SPLITTABLE or info.size <= 2 * job_bytes or files.is_gzip(info.path):
            return cuts
        with open(info.path, "rb") as fh:
            for at in range(job_bytes, info.size, job_bytes):
                fh.seek(at - 1)  # to the end of the line holding byte at-1 (a line begins there)
                while (piece := fh.readline(READ_BYTES)) and not piece.endswith(b"\n"):
                    pass  # a long line, read a bounded piece at a time
                if fh.tell() > cuts[-1] and fh.tell() < info.size:
                    cuts.append(fh.tell())
    except OSError:
        return [0]
    return cuts


def _scan_job(job: Job) -> JobResult:
    """In a scanning process: the job's chunks scanned, their hits by node, chunk by chunk. A read error
    ends it with what it scanned before and the one-process replay's diagnostic (`failed`)."""
    out = JobResult()
    compiled = _STATE["compiled"]
    timeouts = compiled.timeouts
    try:
        _scan_into(job, out, compiled)
    except READ_ERRORS as exc:
        out.diags.extend(read_error(job.info, exc).diags)
        out.failed = True
    out.timeouts = compiled.timeouts - timeouts
    return out


def _scan_into(job: Job, out: JobResult, compiled: CompiledPacks) -> None:
    node_override = _STATE["node_override"]
    with files.open_binary(job.info.path) as fh:
        if job.start:
            fh.seek(job.start)
        reader: Iterator[files.Chunk]
        if job.info.fmt == "export" or (job.start == 0 and job.end is None):
            reader = files.chunks(job.info, fh)
        else:
            limited = _Range(fh, None if job.end is None else job.end - job.start)
            chunker = files.TextChunker(job.info, cast("IO[bytes]", limited))  # it only reads
            chunker.pos = job.start
            reader = chunker
        hits: dict[Any, int] = {}
        messages: dict[str, int] = {}
        for chunk in reader:
            result = scan.scan(chunk, compiled, node_override)
            out.pack(result.by_node, hits, messages)
            out.stats.add(result.stats)
            out.diags.extend(result.diags)
            out.lines += chunk.lines
            out.nbytes += chunk.nbytes


def _renumber(diags: list[str], path: str, base: int) -> list[str]:
    """Diagnostics of a job whose lines were counted from 1: numbered as the file's lines."""
    if not base:
        return diags
    prefix = re.compile(re.escape(path) + r":(\d+):")
    return [prefix.sub(lambda m: f"{path}:{int(m.group(1)) + base}:", d, count=1) for d in diags]


def run(
    groups: list[list[files.FileInfo]],
    compiled: CompiledPacks,
    *,
    processes: int,
    node_override: str | None = None,
    progress: ProgressFn | None = None,
    on_diag: Callable[[str], None] | None = None,
) -> ReplayResult:
    """Replay with `processes` scanning processes (forked: they share the compiled packs); see the module."""
    result = ReplayResult()
    started = time.perf_counter()
    jobs = plan(groups, processes)
    detectors: dict[str, NodeDetector] = {}
    lines_before: dict[str, int] = {}  # by file: the lines of its jobs already back
    cut_short: set[str] = set()  # files a read error ended: their later jobs are not taken
    _STATE.update(compiled=compiled, node_override=node_override)
    context = mp.get_context("fork")
    try:
        with context.Pool(max(1, min(processes, len(jobs), os.cpu_count() or 1))) as pool:
            for job, done in zip(jobs, pool.imap(_scan_job, jobs), strict=True):
                path = job.info.path
                if path in cut_short:
                    continue
                if done.failed:
                    cut_short.add(path)
                base = 0 if job.first else lines_before.get(path, 0)
                lines_before[path] = base + done.lines
                result.stats.add(done.stats)
                result.regex_timeouts += done.timeouts
                diags = _renumber(done.diags, path, base)
                result.diags.extend(diags)
                if on_diag is not None:
                    for d in diags:
                        on_diag(d)
                hits, messages = done.hits, done.messages
                for by_node in done.by_chunk:
                    for node, batch in by_node.items():
                        detector = detectors.get(node)
                        if detector is None:
                            detector = detectors[node] = NodeDetector(node, compiled)
                        observe = detector.observe
                        batch.sort(key=lambda t: t[:3])  # time, then place in the file
                        for ts, _, _, h, m, boot in batch:
                            observe(ts, hits[h], messages[m], boot)
                if progress is not None:
                    progress(done.nbytes, done.lines)
    finally:
        _STATE.clear()
    faults: list[Fault] = []
    for detector in detectors.values():
        faults.extend(detector.snapshot_faults())
        for name in detector.counters.__dataclass_fields__:
            setattr(result.counters, name, getattr(result.counters, name) + getattr(detector.counters, name))
    result.faults = sorted(faults, key=sort_key)
    result.seconds = time.perf_counter() - started
    result.stats.files = sum(len(g) for g in groups)
    return result
