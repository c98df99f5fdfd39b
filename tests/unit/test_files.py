"""Reading inputs: chunking on line boundaries, over-long lines, gzip, rotation groups, bad files,
journal export records; and scanning a chunk into timed matches with bad lines counted."""

from __future__ import annotations

import gzip
import io
import os
import struct
from pathlib import Path

import pytest

from faultline.errors import InputError
from patterns.compiler import CompiledPacks
from sources import files, formats, scan

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."


def info(fmt: str = "rfc3164", path: str = "/x/gpu-9.log") -> files.FileInfo:
    ctx = formats.Context(formats.YearGuess(2026, 12, fixed=True), syslog_trusted=True)  # replay's default
    return files.FileInfo(0, path, fmt, ctx, "gpu-9", 0)


def line(i: int, text: str = "systemd[1]: Started x.") -> bytes:
    return f"Dec  1 10:00:{i % 60:02d} gpu-1 {text}\n".encode()


@pytest.mark.parametrize("chunk", [7, 64, 100, 4096])
@pytest.mark.parametrize("trailing_newline", [True, False])
def test_chunks_hold_whole_lines_and_count_them(chunk: int, trailing_newline: bool) -> None:
    data = b"".join(line(i) for i in range(50))
    if not trailing_newline:
        data = data[:-1]
    chunks = list(files.TextChunker(info(), io.BytesIO(data), chunk=chunk, max_line=1000))
    assert b"".join(c.data for c in chunks) == data
    assert sum(c.lines for c in chunks) == 50
    assert all(c.data.endswith(b"\n") for c in chunks[:-1] if c.data)
    for c in chunks:  # offsets and first line numbers agree with the data
        assert data[c.offset : c.offset + len(c.data)] == c.data
        assert c.first_line == data[: c.offset].count(b"\n") + 1


@pytest.mark.parametrize("chunk", [1000, 1 << 20])
def test_over_long_line_is_skipped_counted_and_named(chunk: int) -> None:
    huge = b"Dec  1 10:00:00 gpu-1 kernel: " + b"A" * (1 << 20) + b"\n"  # a 1 MiB line
    data = line(1) + huge + line(2, "kernel: " + XID) + line(3)
    chunks = list(files.TextChunker(info(), io.BytesIO(data), chunk=chunk, max_line=64 << 10))
    assert sum(c.lines for c in chunks) == 4
    assert sum(c.bad_lines for c in chunks) == 1
    diags = [d for c in chunks for d in c.diags]
    assert diags == [f"/x/gpu-9.log:2: line longer than {64 << 10} bytes, skipped"]
    kept = b"".join(c.data for c in chunks)
    assert kept == line(1) + line(2, "kernel: " + XID) + line(3)


def test_sniff_reports_unusable_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        files.sniff(0, str(tmp_path / "missing.log"))
    with pytest.raises(InputError, match="not a regular file"):
        files.sniff(0, str(tmp_path))
    binary = tmp_path / "core.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(InputError, match=r"core\.bin: binary data"):
        files.sniff(0, str(binary))
    prose = tmp_path / "notes.txt"
    prose.write_text("just some prose\nwithout timestamps\n")
    with pytest.raises(
        InputError,
        match=r"notes\.txt: not a log faultline reads: .* so no line has a time; .*\(first line: 'just some prose'\)",
    ):
        files.sniff(0, str(prose))
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert files.sniff(0, str(empty)).notes == ("file is empty",)


def test_unreadable_file_is_reported() -> None:
    # A regular file whose read fails (EIO) even for root, unlike permission bits.
    with pytest.raises(InputError, match=r"/proc/self/mem: cannot read"):
        files.sniff(0, "/proc/self/mem")


def test_gzip_is_read_transparently(tmp_path: Path) -> None:
    path = tmp_path / "syslog.2.gz"
    path.write_bytes(gzip.compress(line(1) + line(2)))
    sniffed = files.sniff(0, str(path), year=2026)
    assert sniffed.fmt == "rfc3164"
    with files.open_binary(str(path)) as fh:
        assert b"".join(c.data for c in files.chunks(sniffed, fh)) == line(1) + line(2)


def test_relative_dmesg_times_are_anchored_to_the_file_mtime(tmp_path: Path) -> None:
    path = tmp_path / "gpu-5.dmesg"
    path.write_text("[    0.000000] Linux version 6.8\n[  100.000000] NVRM: x\n")
    os.utime(path, (2_000_000_000, 2_000_000_000))
    sniffed = files.sniff(0, str(path))
    assert sniffed.ctx.boot_base == 2_000_000_000 - 100
    assert sniffed.default_node == "gpu-5"
    assert files.sniff(0, str(path), boot_time=5.0).ctx.boot_base == 5.0


def test_replay_believes_syslog_kernel_tags_unless_told_not_to(tmp_path: Path) -> None:
    path = tmp_path / "syslog"
    path.write_text(
        "Dec  1 10:00:00 gpu-9 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, fell off.\n"
    )
    assert files.sniff(0, str(path), year=2026).ctx.syslog_trusted
    assert not files.sniff(0, str(path), year=2026, syslog_trusted=False).ctx.syslog_trusted
    assert not files.sniff_all([str(path)], year=2026, syslog_trusted=False).files[0].ctx.syslog_trusted


def test_rotation_groups_read_oldest_first() -> None:
    paths = ["a/syslog", "a/syslog.1", "a/syslog.2.gz", "b/syslog.1", "a/kern.log", "a/kern.log-20261201"]
    assert files.rotation_groups(paths) == [
        ["a/syslog.2.gz", "a/syslog.1", "a/syslog"],
        ["b/syslog.1"],
        ["a/kern.log-20261201", "a/kern.log"],
    ]


def test_expand_paths_walks_directories_and_skips_hidden(tmp_path: Path) -> None:
    (tmp_path / "d" / ".git").mkdir(parents=True)
    (tmp_path / "d" / "x.log").write_text("x")
    (tmp_path / "d" / ".hidden").write_text("x")
    (tmp_path / "d" / ".git" / "config").write_text("x")
    assert files.expand_paths([str(tmp_path / "d")]) == [str(tmp_path / "d" / "x.log")]


def export_record(fields: dict[str, bytes]) -> bytes:
    out = b""
    for key, value in fields.items():
        if b"\n" in value:
            out += key.encode() + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
        else:
            out += key.encode() + b"=" + value + b"\n"
    return out + b"\n"


def test_export_records_with_binary_fields_and_a_truncated_end() -> None:
    data = (
        export_record({"__REALTIME_TIMESTAMP": b"1000000", "_HOSTNAME": b"h", "MESSAGE": XID.encode()})
        + export_record({"__REALTIME_TIMESTAMP": b"2000000", "MESSAGE": b"two\nlines"})
        + export_record({"_HOSTNAME": b"h"})  # no MESSAGE
        + b"__REALTIME_TIMESTAMP=3\nMESSAGE\n\x05\x00"  # binary field cut off
    )
    chunks = list(files.ExportReader(info("export"), io.BytesIO(data)))
    records = [r for c in chunks for r in c.records]
    assert [n for n, _ in records] == [1, 2, 3, 4]
    assert records[0][1] is not None and records[0][1].message == XID and records[0][1].ts == 1.0
    assert records[1][1] is not None and records[1][1].message == "two\nlines"
    assert records[2][1] is None and records[3][1] is None
    diags = [d for c in chunks for d in c.diags]
    assert diags == [
        "/x/gpu-9.log: record 3: no MESSAGE or timestamp",
        "/x/gpu-9.log: record 4: truncated binary field at end of file",
    ]


def scan_bytes(builtin: CompiledPacks, data: bytes, fmt: str = "rfc3164") -> scan.ScanResult:
    chunk = files.Chunk(info(fmt), 1, data=data, lines=data.count(b"\n"))
    return scan.scan(chunk, builtin)


def test_scan_finds_hits_per_node_with_time_and_order(builtin: CompiledPacks) -> None:
    data = line(0) + b"Dec  1 10:00:05 gpu-2 kernel: [ 5.5] " + XID.encode() + b"\n" + line(9)
    result = scan_bytes(builtin, data)
    assert list(result.by_node) == ["gpu-2"]
    (timed,) = result.by_node["gpu-2"]
    assert timed.hit.code == "XID-79"
    assert timed.message == XID
    assert timed.boot == pytest.approx(timed.ts - 5.5)
    assert timed.order == (0, len(line(0)))
    assert (result.stats.lines, result.stats.candidates, result.stats.skipped) == (3, 1, 0)


def test_scan_counts_and_names_bad_lines(builtin: CompiledPacks) -> None:
    data = (
        line(0)
        + b"Dec  1 10:00:01 gpu-1 kernel: NVRM: Xid \x00\x01\x02 binary\n"  # NUL bytes: skipped
        + b"Dec  1 10:00:02 gpu-1 kernel: "
        + XID.encode()
        + b" \xff\xfe\n"  # bad UTF-8: decoded, matched
        + b"NVRM: Xid (PCI:0000:3b:00): 79, no syslog header\n"  # a hit that is no log line
        + b"2026-12-01T10:00:04.0+00:00 gpu-1 kernel: "
        + XID.encode()
        + b"\n"  # another format
    )
    result = scan_bytes(builtin, data)
    stats = result.stats
    assert (stats.binary, stats.invalid_utf8, stats.unparseable, stats.mixed) == (1, 1, 1, 1)
    assert stats.skipped == 2
    assert [t.hit.code for t in result.by_node["gpu-1"]] == ["XID-79", "XID-79"]
    assert result.diags == [
        "/x/gpu-9.log:2: binary data (NUL bytes), line skipped",
        "/x/gpu-9.log:3: invalid UTF-8, decoded with replacement characters",
        "/x/gpu-9.log:4: not a rfc3164 line, skipped: 'NVRM: Xid (PCI:0000:3b:00): 79, no syslog header'",
        "/x/gpu-9.log:5: line is iso, file was detected as rfc3164",
    ]


def test_scan_caps_diagnostics_per_kind(builtin: CompiledPacks) -> None:
    data = b"".join(b"NVRM: Xid junk %d\n" % i for i in range(50))
    result = scan_bytes(builtin, data)
    assert result.stats.unparseable == 50
    assert len(result.diags) == scan.MAX_DIAGS_PER_FILE


def test_scan_uses_node_override_then_host_then_file_name(builtin: CompiledPacks) -> None:
    chunk = files.Chunk(info("dmesg"), 1, data=b"[ 1.0] " + XID.encode() + b"\n", lines=1)
    assert list(scan.scan(chunk, builtin).by_node) == ["gpu-9"]
    assert list(scan.scan(chunk, builtin, "forced").by_node) == ["forced"]


def test_truncated_gzip_keeps_what_was_readable_and_says_where_it_broke(tmp_path: Path) -> None:
    data = b"".join(line(i, f"kernel: {XID} #{i}") for i in range(20000))
    path = tmp_path / "syslog.1.gz"
    path.write_bytes(gzip.compress(data)[:-2000])
    sniffed = files.sniff(0, str(path), year=2026)
    with files.open_binary(str(path)) as fh:
        chunks = list(files.chunks(sniffed, fh))
    kept = b"".join(c.data for c in chunks)
    assert data.startswith(kept)
    assert 15000 < sum(c.lines for c in chunks) < 20000
    (diag,) = [d for c in chunks for d in c.diags]
    assert diag.startswith(f"{path}: damaged after ") and "rest skipped" in diag


def test_corrupt_gzip_header_is_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 64)
    with pytest.raises(InputError, match=r"broken\.gz: cannot read"):
        files.sniff(0, str(path))


def test_line_numbers_are_only_worked_out_for_kept_diagnostics() -> None:
    calls: list[int] = []
    out: list[str] = []
    diags = scan._Diags(out, "f.log", lambda offset: calls.append(offset) or offset // 10 + 1)
    for offset in range(0, 10_000, 10):
        diags.add("unparseable", offset, "skipped")
    assert len(out) == scan.MAX_DIAGS_PER_FILE
    assert len(calls) == scan.MAX_DIAGS_PER_FILE  # a garbage file costs no line counting per bad line
    assert out[0] == "f.log:1: skipped"
