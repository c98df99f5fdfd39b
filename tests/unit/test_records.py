"""Issue 14's pieces one by one: the origin each format reports, joining a record's lines, record
patterns and origins in the compiler, tolerant PCI addresses and XID 74's register decoding, and the
journal reader handing on the lines that may continue a record."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from patterns import compiler, loader, templates
from sources import formats, journal, records, scan
from sources.files import Chunk, FileInfo

CTX = formats.Context(formats.YearGuess(2026, 12, fixed=True), boot_base=1_000_000.0)
TRUSTED = formats.Context(CTX.year, CTX.boot_base, syslog_trusted=True)  # a kern.log only the kernel writes
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
KMSG_RECORD = {"_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0"}  # journald's fields for a kernel record


@pytest.mark.parametrize(
    ("fmt", "line", "kernel"),
    [
        ("rfc3164", f"Dec  1 10:00:00 h kernel: {XID}", True),
        ("rfc3164", f"Dec  1 10:00:00 h logger: {XID}", False),
        ("rfc3164", f"Dec  1 10:00:00 h python3[7]: {XID}", False),
        ("rfc3164", f"<4>Dec  1 10:00:00 h kernel: {XID}", True),
        ("rfc3164", f"<13>Dec  1 10:00:00 h kernel: {XID}", False),  # `logger -t kernel`: user facility
        ("rfc3164", "Dec  1 10:00:00 h [ 1.0] no tag at all", False),
        ("iso", f"2026-12-01T10:00:00.000001+00:00 h kernel: {XID}", True),
        ("iso", f"2026-12-01T10:00:00.000001+00:00 h app: {XID}", False),
        ("rfc5424", f"<6>1 2026-12-01T10:00:00Z h kernel - - - {XID}", True),
        ("rfc5424", f"<14>1 2026-12-01T10:00:00Z h kernel - - - {XID}", False),
        ("rfc5424", f"<6>1 2026-12-01T10:00:00Z h logger 12 - - {XID}", False),
        ("json", json.dumps({"__REALTIME_TIMESTAMP": "1", "MESSAGE": XID, **KMSG_RECORD}), True),
        # written to /dev/kmsg by user space: journald's kernel transport, facility user
        (
            "json",
            json.dumps({"__REALTIME_TIMESTAMP": "1", "MESSAGE": XID, **KMSG_RECORD, "SYSLOG_FACILITY": "1"}),
            False,
        ),
        ("json", json.dumps({"__REALTIME_TIMESTAMP": "1", "MESSAGE": XID, "_TRANSPORT": "kernel"}), False),
        (
            "json",
            json.dumps(
                {
                    "__REALTIME_TIMESTAMP": "1",
                    "MESSAGE": XID,
                    "_TRANSPORT": "syslog",
                    "SYSLOG_IDENTIFIER": "kernel",
                }
            ),
            False,
        ),
        (
            "json",
            json.dumps({"__REALTIME_TIMESTAMP": "1", "MESSAGE": XID, "SYSLOG_IDENTIFIER": "app"}),
            False,
        ),
        (
            "json",
            json.dumps({"__REALTIME_TIMESTAMP": "1", "MESSAGE": XID}),
            False,
        ),  # nobody says who wrote it
        ("kmsg", f"3,1,100,-;{XID}", True),
        ("kmsg", f"12,1,100,-;{XID}", False),
        ("dmesg", f"[  1.000000] {XID}", True),
    ],
)
def test_each_format_says_whether_the_kernel_wrote_the_line(fmt: str, line: str, kernel: bool) -> None:
    parsed = formats.PARSERS[fmt](line, TRUSTED)  # syslog tags believed here: what else the line says
    assert parsed is not None
    assert parsed.kernel is kernel


# `logger -t kernel -p kern.err 'NVRM: Xid ... 79'` by any local user, as rsyslog writes it in each format
FORGED = [
    ("rfc3164", f"<3>Dec  1 10:00:00 h kernel: {XID}"),
    ("rfc3164", f"Dec  1 10:00:00 h kernel: {XID}"),
    ("iso", f"2026-12-01T10:00:00.000001+00:00 h kernel: {XID}"),
    ("rfc5424", f"<3>1 2026-12-01T10:00:00Z h kernel - - - {XID}"),
]


@pytest.mark.redteam
@pytest.mark.parametrize(("fmt", "line"), FORGED)
def test_a_syslog_kernel_tag_is_not_believed_by_default(fmt: str, line: str) -> None:
    parsed = formats.parse_line(fmt, line, CTX)
    assert parsed is not None
    assert parsed == (fmt, parsed[1])
    assert parsed[1].kernel is False


@pytest.mark.parametrize(("fmt", "line"), FORGED)
def test_a_syslog_kernel_tag_is_believed_where_the_file_is_trusted(fmt: str, line: str) -> None:
    parsed = formats.PARSERS[fmt](line, TRUSTED)
    assert parsed is not None
    assert parsed.kernel is True


@pytest.mark.redteam
@pytest.mark.parametrize(("facility", "kernel"), [("0", True), ("1", False), ("3", False), (None, False)])
def test_a_journal_record_is_the_kernels_only_with_facility_kern(facility: str | None, kernel: bool) -> None:
    fields = {
        "__REALTIME_TIMESTAMP": "1",
        "MESSAGE": XID,
        "_TRANSPORT": "kernel",
        "SYSLOG_FACILITY": facility,
    }
    record = formats.journal_record({k: v for k, v in fields.items() if v is not None})
    assert record is not None
    assert record.kernel is kernel
    export = {k: v.encode() for k, v in fields.items() if v is not None}
    from_export = formats.parse_export_fields(export)
    assert from_export is not None
    assert from_export.kernel is kernel


@pytest.mark.parametrize(
    ("fmt", "line", "message"),
    [
        ("rfc3164", "Dec  1 10:00:00 h kernel: NVRM: a#012NVRM: b#011c", "NVRM: a b c"),
        ("kmsg", "3,1,100,-;NVRM: a\\x0aNVRM: b\\x0a   c", "NVRM: a b c"),
        ("rfc5424", "<6>1 2026-12-01T10:00:00Z h kernel - - - mlx5_core 0000:01:00.0: a#012b", "mlx5_core 0000:01:00.0: a b"),
    ],
)  # fmt: skip
def test_records_joined_by_their_writer_are_one_line(fmt: str, line: str, message: str) -> None:
    parsed = formats.PARSERS[fmt](line, TRUSTED)
    assert parsed is not None
    assert parsed.message == message


def test_a_journal_message_with_newlines_keeps_them_and_is_matched_joined() -> None:
    parsed = formats.journal_record({"__REALTIME_TIMESTAMP": "1", "MESSAGE": "NVRM: a\nNVRM: b\n"})
    assert parsed is not None and parsed.message == "NVRM: a\nNVRM: b\n"
    assert formats.one_line(parsed).message == "NVRM: a b"


def test_join_lines() -> None:
    assert (
        formats.join_lines(["NVRM: The GPU x", "  NVRM: has", "NVRM:  fallen"])
        == "NVRM: The GPU x has fallen"
    )
    assert formats.join_lines(["to 0x2", "   (Node Reboot Required)"]) == "to 0x2 (Node Reboot Required)"
    assert formats.join_lines(["only"]) == "only"


@pytest.mark.parametrize(
    ("value", "bus"),
    [("0000:3B:00", "0000:3b:00"), ("00000000:3b:00.0", "0000:3b:00"), ("3b:00.0", "0000:3b:00"),
     ("0:3b:00", "0000:3b:00"), ("0008:06:00", "0008:06:00"), ("10000:E1:00.1", "10000:e1:00")],
)  # fmt: skip
def test_every_pci_domain_width(value: str, bus: str) -> None:
    assert templates.pci_bus(value) == bus


@pytest.mark.parametrize(
    ("registers", "category"),
    [
        ("0x100000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "sympathetic"),  # register 1 bit 20
        ("0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "hardware"),  # register 1 bit 16
        ("0x100010, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "ecc"),  # bits 4 and 20: the more severe wins
        ("0x0, 0x0, 0x2000, 0x0, 0x0, 0x0, 0x0", "report"),  # register 3 bit 13: not expected
        ("0x0, 0x0, 0x0, 0x40000, 0x0, 0x0, 0x0", "fabric"),  # register 4 bit 18
        ("0x0, 0x0, 0x0, 0x0, 0x100000, 0x0, 0x0", "threshold"),  # register 5 bit 20
        ("0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "ignore"),
        ("0x0, 0x1, 0x0, 0x0, 0x0, 0x0, 0x0", "report"),  # register 2: the catalogue lists none
        ("0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "none"),
    ],
)
def test_xid74_registers(registers: str, category: str) -> None:
    assert templates.xid74_category(registers) == category


USER_PACK = """
pack: site
patterns:
  - id: two-line
    description: a message printed over two lines
    record: {start: ["WIDGET: start"], lines: 3, within: 1s}
    regex: 'WIDGET: start (?P<unit>\\d+) failed hard'
    code: WIDGET-FAILED
    entity: {type: WIDGET, id: "{unit}"}
    classify: [{set: {fatal: true, action: RESTART_BM, description: "widget {unit} failed"}}]
    examples:
      match:
        - line: "WIDGET: start 7 failed hard"
          expect: {code: WIDGET-FAILED, entity_id: "7", description: "widget 7 failed"}
      no_match: ["WIDGET: start 7 ok"]
  - id: user-space
    description: a line any program may write
    origin: any
    regex: 'backup finished: (?P<job>\\w+)'
    code: BACKUP-DONE
    examples:
      match: ["backup finished: nightly"]
      no_match: ["backup started: nightly"]
"""


@pytest.fixture
def site(write_pack: Callable[[str, str], Path]) -> compiler.CompiledPacks:
    return compiler.compile_packs(loader.load([write_pack("site.yaml", USER_PACK)], builtin=False))


def test_record_patterns_match_records_and_origins_filter(site: compiler.CompiledPacks) -> None:
    assert site.match("syslog", "WIDGET: start 7 failed hard") == ()  # a record pattern: records only
    hits, untrusted = site.match_line("syslog", "WIDGET: start 7 failed hard", records=True)
    assert [h.code for h in hits] == ["WIDGET-FAILED"] and not untrusted
    hits, untrusted = site.match_line("syslog", "WIDGET: start 7 failed hard", False, records=True)
    assert hits == () and untrusted
    hits, untrusted = site.match_line("syslog", "backup finished: nightly", False)  # origin any
    assert [h.code for h in hits] == ["BACKUP-DONE"] and not untrusted
    assert "WIDGET: start" in site.literals and site.record_lines == 3


def test_a_description_naming_a_missing_group_fails_at_load(write_pack: Callable[[str, str], Path]) -> None:
    bad = USER_PACK.replace('description: "widget {unit} failed"', 'description: "widget {nope} failed"')
    with pytest.raises(Exception, match="nope"):
        compiler.compile_packs(loader.load([write_pack("site.yaml", bad)], builtin=False))


def _scan(site: compiler.CompiledPacks, fmt: str, text: str) -> scan.ScanResult:
    info = FileInfo(0, f"x.{fmt}", fmt, TRUSTED, "n", len(text))
    return scan.scan(Chunk(info, 1, text.encode(), lines=text.count("\n")), site)


def test_scan_assembles_separate_lines_and_passes_over_other_writers(site: compiler.CompiledPacks) -> None:
    text = (
        "Dec  1 10:00:00 h kernel: WIDGET: start 7\n"
        "Dec  1 10:00:00 other kernel: WIDGET: unrelated\n"
        "Dec  1 10:00:00 h cron[9]: something\n"
        "Dec  1 10:00:00 h kernel: WIDGET: failed hard\n"
        "Dec  1 10:00:05 h kernel: WIDGET: start 8\n"
        "Dec  1 10:00:09 h kernel: WIDGET: failed hard\n"  # too late for its record
    )
    result = _scan(site, "rfc3164", text)
    assert [(t.hit.code, t.hit.entity_id, t.message) for t in result.by_node["h"]] == [
        ("WIDGET-FAILED", "7", "WIDGET: start 7 failed hard")
    ]


def test_scan_joins_dmesg_continuation_lines_even_from_a_candidate_continuation(
    site: compiler.CompiledPacks,
) -> None:
    text = "[    1.000000] WIDGET: start 9\n               WIDGET: failed hard\n[    2.000000] next\n"
    result = _scan(site, "dmesg", text)
    assert [(t.hit.entity_id, t.message) for t in result.by_node["n"]] == [
        ("9", "WIDGET: start 9 failed hard")
    ]
    assert result.stats.unparseable == 0


def test_assembly_stops_at_a_line_that_opens_a_record(site: compiler.CompiledPacks) -> None:
    first = formats.Parsed(1.0, "h", "WIDGET: start 1", None)
    assembly = records.Assembly(first, site)
    assert assembly.offer(formats.Parsed(1.0, "h", "WIDGET: start 2", None)) is False
    assert assembly.text == "WIDGET: start 1"


def test_the_journal_reader_hands_on_lines_that_may_continue_a_record(
    builtin: compiler.CompiledPacks,
) -> None:
    lines = [
        {"MESSAGE": "noise"},
        {"MESSAGE": "NVRM: The NVIDIA GPU 0000:b3:00.0"},
        {"MESSAGE": "NVRM: installed in this system has"},
        {"MESSAGE": "NVRM: fallen off the bus and is not responding to commands."},
        {"MESSAGE": "more noise"},
        {"MESSAGE": "more noise"},
        {"MESSAGE": "last"},
    ]
    chunk = b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)
    follower = journal.JournalFollower(["true"], prefilter=builtin)
    try:
        got = [json.loads(line)["MESSAGE"] for line in follower._lines(chunk)]
    finally:
        follower.stop()
    assert got[:3] == [m["MESSAGE"] for m in lines[1:4]]  # the start line and the lines after it
    assert got[-1] == "last" and "noise" not in got
