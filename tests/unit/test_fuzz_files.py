"""Fuzzing what replay and the file inputs read: chunking (`sources.files.TextChunker`), journal export
records (`ExportReader`), sniffing files (`sniff`), scanning chunks against the built-in packs
(`sources.scan`) and record assembly (`sources.records`), on mutated corpus files and arbitrary bytes.

Chunking keeps every byte and counts every line whatever the chunk and line limits; a scan gives hits
with finite times and never raises; a file that cannot be used is an InputError naming it."""

from __future__ import annotations

import gzip
import io
import math
import random
import struct
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from faultline.errors import InputError
from patterns import loader
from patterns.compiler import CompiledPacks
from sources import files, formats, records, scan
from tests.unit.fuzzing import CORPUS, NASTY, corpus_lines, fuzz, near

CTX = formats.Context(formats.YearGuess(2026, 12, fixed=True), boot_base=1_000_000.0)


def info(fmt: str) -> files.FileInfo:
    return files.FileInfo(0, "/x/gpu-9.log", fmt, CTX, "gpu-9", 0)


@cache
def corpus_files() -> tuple[tuple[str, bytes], ...]:
    """(format, content) of every corpus file, the format as sniffing detects it."""
    out = []
    for path in sorted(CORPUS.iterdir()):
        data = path.read_bytes()
        sample = data.decode("utf-8", "replace").splitlines()
        fmt = formats.detect(sample, CTX)
        assert fmt is not None, path
        out.append((fmt, data))
    return tuple(out)


@st.composite
def mutated_file(draw: st.DrawFn) -> tuple[str, bytes]:
    """A corpus file with some of its lines mutated, dropped, repeated or joined, or arbitrary bytes."""
    fmt, data = draw(st.sampled_from(corpus_files()))
    if fmt == "export":
        return fmt, draw(mutated_bytes(data))
    lines = data.decode().split("\n")
    start = draw(st.integers(0, len(lines) - 1))
    lines = lines[start : start + draw(st.integers(1, 16))]  # a window of the file
    out: list[str] = []
    for ln in lines:
        op = draw(st.sampled_from(("keep", "keep", "keep", "mutate", "drop", "twice", "join")))
        if op == "mutate":
            out.append(draw(near((ln or "x",), max_edits=3)))
        elif op == "twice":
            out += [ln, ln]
        elif op == "join" and out:
            out[-1] += ln
        elif op != "drop":
            out.append(ln)
    return fmt, "\n".join(out).encode("utf-8", "surrogatepass")


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(data)))
        end = draw(st.integers(at, min(len(data), at + 64)))
        data = data[:at] + draw(st.binary(max_size=16)) + data[end:]
    return data


any_file = st.one_of(
    mutated_file(),
    st.tuples(st.sampled_from((*formats.LINE_FORMATS, "export")), st.binary(max_size=2000)),
    st.tuples(
        st.sampled_from(formats.LINE_FORMATS),
        st.lists(st.one_of(st.sampled_from(corpus_lines()), st.sampled_from(NASTY)), max_size=30).map(
            lambda parts: "\n".join(parts).encode("utf-8", "surrogatepass")
        ),
    ),
)


def lines_in(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def check_scan(result: scan.ScanResult) -> None:
    for node, timed in result.by_node.items():
        assert isinstance(node, str) and node
        for t in timed:
            assert math.isfinite(t.ts) and (t.boot is None or math.isfinite(t.boot))
            assert isinstance(t.message, str) and t.hit.code
    stats = result.stats
    assert all(getattr(stats, name) >= 0 for name in stats.__dataclass_fields__)
    assert all(isinstance(d, str) and d.startswith("/x/gpu-9.log") for d in result.diags)


@fuzz(1500)
@given(any_file, st.integers(1, 5000), st.integers(1, 400))
def test_text_chunks_keep_every_byte_and_scan_without_error(
    builtin: CompiledPacks, fmt_data: tuple[str, bytes], chunk: int, max_line: int
) -> None:
    fmt, data = fmt_data
    if fmt == "export":
        fmt = "rfc3164"
    chunks = list(files.TextChunker(info(fmt), io.BytesIO(data), chunk=chunk, max_line=max_line))
    assert sum(c.lines for c in chunks) == lines_in(data)
    gaps, end = [], 0  # what no chunk holds: only whole lines longer than max_line, one per skip
    for c in chunks:
        assert data[c.offset : c.offset + len(c.data)] == c.data
        if c.data:
            gaps.append(data[end : c.offset])
            end = c.offset + len(c.data)
    gaps.append(data[end:])
    skipped = [ln for gap in gaps for ln in gap.removesuffix(b"\n").split(b"\n") if gap]
    assert all(len(ln) > max_line for ln in skipped)
    assert len(skipped) == sum(c.bad_lines for c in chunks)
    for c in chunks:
        check_scan(scan.scan(c, builtin))
        check_scan(scan.scan(c, builtin, node_override="forced"))


def export_field(key: bytes, value: bytes, binary: bool) -> bytes:
    if binary:
        return key + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
    return key + b"=" + value.replace(b"\n", b" ") + b"\n"


keys = st.sampled_from((b"MESSAGE", b"__REALTIME_TIMESTAMP", b"_HOSTNAME", b"_TRANSPORT", b"__CURSOR", b"X"))
export_records = st.lists(
    st.lists(
        st.tuples(keys, st.binary(max_size=40) | st.sampled_from([n.encode() for n in NASTY]), st.booleans())
    ),
    max_size=5,
).map(lambda recs: b"".join(b"".join(export_field(*f) for f in rec) + b"\n" for rec in recs))


@fuzz(1000)
@given(
    st.one_of(export_records, mutated_file().map(lambda f: f[1]), st.binary(max_size=600)), st.integers(0, 40)
)
@example(b"MESSAGE\n" + struct.pack("<Q", 2**63) + b"x\n\n", 0)  # a length past the end of the file
@example(b"MESSAGE\n\xff\xff", 0)  # a length cut short
def test_export_records_read_without_error(builtin: CompiledPacks, data: bytes, cut: int) -> None:
    for stream in (data, data[: max(0, len(data) - cut)]):
        chunks = list(files.ExportReader(info("export"), io.BytesIO(stream), batch=3))
        for c in chunks:
            assert c.lines == len(c.records) and c.bad_lines <= c.lines
            for _, parsed in c.records:
                assert parsed is None or math.isfinite(parsed.ts)
            check_scan(scan.scan(c, builtin))


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


def sniffed(path: Path, force: str | None) -> files.FileInfo | InputError:
    try:
        return files.sniff(0, str(path), force_format=force)
    except InputError as exc:
        return exc


# Found by this fuzzing: a gzip file whose head was readable but whose end was cut off raised EOFError
# out of sniff (reading the tail for the last dmesg/kmsg uptime), instead of being read up to the damage.
TRUNCATED_DMESG = gzip.compress(b"".join(b"[ %6d.000000] NVRM: line %d\n" % (i, i) for i in range(9000)))[
    :-20
]


@fuzz(400)
@given(
    st.one_of(mutated_file().map(lambda f: f[1]), st.binary(max_size=300)),
    st.booleans(),
    st.integers(0, 64),
    st.sampled_from((None, *formats.LINE_FORMATS)),
)
@example(TRUNCATED_DMESG, False, 0, None)
def test_sniffing_any_file_is_a_file_info_or_an_input_error(
    workdir: Path, data: bytes, compress: bool, cut: int, force: str | None
) -> None:
    path = workdir / ("node-1.log.gz" if compress else "node-1.log")
    content = gzip.compress(data, mtime=0) if compress else data
    path.write_bytes(content[: max(0, len(content) - cut)] if compress else content)
    found = sniffed(path, force)
    if isinstance(found, InputError):
        assert str(found).startswith(f"{path}: ")
        return
    assert found.fmt in (*formats.LINE_FORMATS, "export", "empty")
    assert found.ctx.boot_base is None or math.isfinite(found.ctx.boot_base)
    if found.fmt == "empty":
        return
    with files.open_binary(str(path)) as fh:
        for c in files.chunks(found, fh):
            assert all(d.startswith(str(path)) for d in c.diags)


# -- record assembly -----------------------------------------------------------------------------------


@cache
def record_starts() -> tuple[str, ...]:
    return tuple(
        sorted(
            {
                s
                for lp in loader.load().patterns.values()
                if lp.pattern.record
                for s in lp.pattern.record.start
            }
        )
    )


@st.composite
def record_lines(draw: st.DrawFn) -> tuple[formats.Parsed, list[formats.Parsed | None]]:
    """A line that opens a record, and lines after it that mostly look like its continuation (same node,
    origin, prefix and second) and sometimes do not (another node or writer, a late line, no line).
    The lines after it come from a seeded random generator: many cheap choices instead of many draws."""
    prefix = draw(st.sampled_from(("NVRM: ", "mlx5_core 0000:5e:00.0: ", "x: ")))
    host, kernel, ts = (
        draw(st.sampled_from((None, "gpu-1"))),
        draw(st.booleans()),
        draw(st.floats(-1e12, 1e12)),
    )
    start = prefix + draw(st.sampled_from(record_starts())) + draw(st.text(max_size=20))
    first = formats.Parsed(ts, host, start, None, kernel)
    rng = random.Random(draw(st.integers(0, 2**32)))
    texts = (*corpus_lines(), *record_starts(), *NASTY, "")
    rest: list[formats.Parsed | None] = []
    for _ in range(rng.randrange(21)):
        if rng.randrange(10) == 0:
            rest.append(None)
            continue
        rest.append(
            formats.Parsed(
                ts + rng.choice((0.0, 0.5, 3.0, -3.0, math.inf, math.nan)),
                rng.choice((host, host, host, "gpu-2")),
                rng.choice((prefix, prefix, prefix, "", "other: ")) + rng.choice(texts),
                None,
                rng.choice((kernel, kernel, kernel, not kernel)),
            )
        )
    return first, rest


@fuzz(2000)
@given(record_lines())
def test_record_assembly_stays_bounded(
    builtin: CompiledPacks, lines: tuple[formats.Parsed, list[formats.Parsed | None]]
) -> None:
    first, rest = lines
    assert builtin.record_start(first.message)
    assembly = records.Assembly(first, builtin)
    closed = False
    for rec in rest:
        took = assembly.offer(rec)
        assert not (closed and took), "an assembly that closed took another line"
        closed = closed or not took
        assert len(assembly.lines) <= builtin.record_lines
        assert assembly.looked <= 2 * builtin.record_lines + len(assembly.lines)
    assert assembly.lines[0] == first.message
    assert all(line.startswith(assembly.prefix) for line in assembly.lines)
    assert isinstance(assembly.text, str)
    event(f"assembled {len(assembly.lines)} lines")
    hits, _ = assembly.match("syslog")
    assert all(h.code for h in hits)
