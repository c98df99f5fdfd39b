"""Line parsers and format detection: tables of real-looking lines, and hypothesis for robustness."""

from __future__ import annotations

import calendar
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sources import formats

CTX = formats.Context(formats.YearGuess(2026, 12, fixed=True), boot_base=1_000_000.0)
T = calendar.timegm((2026, 12, 1, 10, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("fmt", "line", "ts", "host", "message", "boot"),
    [
        ("rfc3164", "Dec  1 10:00:00 gpu-1 kernel: NVRM: Xid x", T, "gpu-1", "NVRM: Xid x", None),
        ("rfc3164", "<4>Dec  1 10:00:00 gpu-1 kernel: [ 100.5] NVRM: x", T, "gpu-1", "NVRM: x", T - 100.5),
        ("rfc3164", "Dec 01 10:00:00 gpu-1 systemd[1]: Started x.", T, "gpu-1", "Started x.", None),
        ("iso", "2026-12-01T10:00:00.250000+00:00 gpu-2 kernel: msg", T + 0.25, "gpu-2", "msg", None),
        ("iso", "2026-12-01T11:00:00+01:00 gpu-2 kernel: msg", T, "gpu-2", "msg", None),
        (
            "rfc5424",
            "<4>1 2026-12-01T10:00:00.000Z gpu-3 kernel - - - msg here",
            T,
            "gpu-3",
            "msg here",
            None,
        ),
        ("rfc5424", '<4>1 2026-12-01T10:00:00Z gpu-3 app 12 ID [a b="]x"][c] msg', T, "gpu-3", "msg", None),
        ("rfc5424", "1 2026-12-01T10:00:00Z - kernel - - - \ufeffmsg", T, None, "msg", None),
        ("dmesg", "[  100.500000] NVRM: x", 1_000_100.5, None, "NVRM: x", 1_000_000.0),
        ("dmesg", "[Tue Dec  1 10:00:00 2026] NVRM: x", T, None, "NVRM: x", None),
        ("dmesg", "2026-12-01T10:00:00,500000+00:00 NVRM: x", T + 0.5, None, "NVRM: x", None),
        ("kmsg", "6,1234,100500000,-;NVRM: x", 1_000_100.5, None, "NVRM: x", 1_000_000.0),
        ("kmsg", "6,1234,100500000,-,caller=T896;NVRM: x", 1_000_100.5, None, "NVRM: x", 1_000_000.0),
        # dmesg --decode, -r, printk caller ids, each with every stamp dmesg prints
        ("dmesg", "kern  :warn  : [  100.500000] NVRM: x", 1_000_100.5, None, "NVRM: x", 1_000_000.0),
        ("dmesg", "kern  :err   : [Tue Dec  1 10:00:00 2026] NVRM: x", T, None, "NVRM: x", None),
        ("dmesg", "kern  :info  : 2026-12-01T10:00:00,500000+00:00 NVRM: x", T + 0.5, None, "NVRM: x", None),
        ("dmesg", "<4>[  100.500000] NVRM: x", 1_000_100.5, None, "NVRM: x", 1_000_000.0),
        ("dmesg", "[  100.500000][  T896] NVRM: x", 1_000_100.5, None, "NVRM: x", 1_000_000.0),
        ("dmesg", "[  100.500000] [    C3] NVRM: x", 1_000_100.5, None, "NVRM: x", 1_000_000.0),
        ("dmesg", "<3>[  100.500000][ T1234] NVRM: x", 1_000_100.5, None, "NVRM: x", 1_000_000.0),
        ("dmesg", "kern  :err   : [Tue Dec  1 10:00:00 2026] [  T896] NVRM: x", T, None, "NVRM: x", None),
        (
            "rfc3164",
            "Dec  1 10:00:00 gpu-1 kernel: [ 100.5][  T896] NVRM: x",
            T,
            "gpu-1",
            "NVRM: x",
            T - 100.5,
        ),
    ],
)
def test_line_parsers(
    fmt: str, line: str, ts: float, host: str | None, message: str, boot: float | None
) -> None:
    parsed = formats.PARSERS[fmt](line, CTX)
    assert parsed is not None
    assert parsed.ts == pytest.approx(ts)
    assert (parsed.host, parsed.message) == (host, message)
    assert parsed.boot == (pytest.approx(boot) if boot is not None else None)


@pytest.mark.parametrize(
    ("line", "kernel"),
    [
        ("kern  :err   : [  100.500000] NVRM: x", True),
        ("user  :notice: [  100.500000] NVRM: x", False),
        ("daemon:info  : [  100.500000] NVRM: x", False),
        ("syslog:info  : [  100.500000] NVRM: x", False),
        ("local7:err   : [  100.500000] NVRM: x", False),
        ("<3>[  100.500000] NVRM: x", True),
        ("<14>[  100.500000] NVRM: x", False),
        ("[  100.500000] NVRM: x", True),
    ],
)
def test_dmesg_decode_and_raw_name_the_writer(line: str, kernel: bool) -> None:
    """`dmesg --decode` and `dmesg -r` print each record's facility: only kern is the kernel's."""
    parsed = formats.parse_dmesg(line, CTX)
    assert parsed is not None
    assert (parsed.kernel, parsed.message) == (kernel, "NVRM: x")


def test_last_uptime_reads_decoded_and_raw_dmesg() -> None:
    assert formats.last_uptime(["kern  :warn  : [ 1108.858286] a", "<3>[ 2000.500000][  T1] b"]) == 2000.5


def test_journal_json_line() -> None:
    line = json.dumps(
        {
            "__REALTIME_TIMESTAMP": str(int(T * 1e6)),
            "_SOURCE_MONOTONIC_TIMESTAMP": "5000000",
            "_HOSTNAME": "gpu-4",
            "MESSAGE": [78, 86, 82, 77, 58, 32, 255],  # bytes: not valid UTF-8
        }
    )
    parsed = formats.parse_json(line, CTX)
    assert parsed is not None
    assert (parsed.ts, parsed.host, parsed.boot) == (T, "gpu-4", T - 5)
    assert parsed.message.startswith("NVRM: ")


@pytest.mark.parametrize(
    ("fmt", "line"),
    [
        ("rfc3164", "Foo  1 10:00:00 host kernel: x"),
        ("rfc3164", "Dec 41 10:00:00 host kernel: x"),
        ("rfc3164", "Dec  1 25:00:00 host kernel: x"),
        ("iso", "2026-12-01T10:00:00,5+00:00 NVRM: x"),  # a comma: that is dmesg, not rsyslog
        ("iso", "2026-13-01T10:00:00+00:00 host x"),
        ("rfc5424", "<4>2 2026-12-01T10:00:00Z h a - - - m"),
        ("json", '{"MESSAGE": "no timestamp"}'),
        ("json", "{not json"),
        ("dmesg", "[abc] x"),
        ("dmesg", "kern  :warn  : no stamp"),
        ("dmesg", "<4>no stamp"),
        ("dmesg", "<abc>[  1.0] x"),
        ("kmsg", "6,x,100;msg"),
    ],
)
def test_lines_not_in_the_format(fmt: str, line: str) -> None:
    assert formats.PARSERS[fmt](line, CTX) is None


@pytest.mark.parametrize(
    ("lines", "fmt"),
    [
        (["Dec  1 10:00:00 h kernel: a", "Dec  1 10:00:01 h kernel: b"], "rfc3164"),
        (["2026-12-01T10:00:00.1+00:00 h kernel: a"], "iso"),
        (["<4>1 2026-12-01T10:00:00Z h kernel - - - a"], "rfc5424"),
        (['{"__REALTIME_TIMESTAMP": "1", "MESSAGE": "x"}'], "json"),
        (["__CURSOR=s=1", "__REALTIME_TIMESTAMP=1", "MESSAGE=x"], "export"),
        (["[    1.000000] Linux version 6.8"], "dmesg"),
        (["kern  :notice: [    1.000000] Linux version 6.8"], "dmesg"),
        (["kern  :notice: [Tue Dec  1 10:00:00 2026] Linux version 6.8"], "dmesg"),
        (["<5>[    1.000000] Linux version 6.8"], "dmesg"),
        (["[    1.000000][    T0] Linux version 6.8"], "dmesg"),
        (["6,1,1000,-;Linux version 6.8"], "kmsg"),
        (["", "hello world", "nothing here"], None),
        ([], None),
    ],
)
def test_detect(lines: list[str], fmt: str | None) -> None:
    assert formats.detect(lines, CTX) == fmt


@pytest.mark.parametrize(
    ("ref", "month", "year"),
    [((2026, 1), 12, 2025), ((2026, 1), 1, 2026), ((2026, 12), 12, 2026), ((2026, 6), 3, 2026)],
)
def test_year_guess_steps_back_over_new_year(ref: tuple[int, int], month: int, year: int) -> None:
    assert formats.YearGuess(*ref).year_for(month) == year
    assert formats.YearGuess(2020, 1, fixed=True).year_for(month) == 2020


def test_mixed_line_falls_back_to_another_format() -> None:
    result = formats.parse_line("rfc3164", "2026-12-01T10:00:00.1+00:00 h kernel: a", CTX)
    assert result is not None and result[0] == "iso"
    assert formats.parse_line("rfc3164", "complete garbage", CTX) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parsers_never_raise_on_arbitrary_text(line: str) -> None:
    for parse in formats.PARSERS.values():
        parse(line, CTX)
    formats.parse_line("rfc3164", line, CTX)
    formats.detect([line], CTX)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(
        ["Dec  1 10:00:00 ", "<13>1 2026-12-01T10:00:00Z ", "[  1.0] ", "6,1,2,-;", "{", "2026-12-01T"]
    ),
    st.text(max_size=120),
)
def test_parsers_never_raise_on_lines_with_plausible_heads(head: str, tail: str) -> None:
    for parse in formats.PARSERS.values():
        parse(head + tail, CTX)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=20), st.one_of(st.text(), st.integers(), st.lists(st.integers()))))
def test_journal_parser_never_raises_on_arbitrary_fields(fields: dict[str, object]) -> None:
    formats.journal_record(fields)
    formats.parse_json(json.dumps(fields), CTX)
