"""Fuzzing the kernel-log line parsers (`sources.formats`): every parser, on mutated corpus lines and on
arbitrary text, returns None or a record with sane values (finite times, a host without blanks, a str
message) and never raises; lines written in a format from generated parts parse back to those parts.

A line is untrusted input: any local user can write one to syslog (`logger`), and one exception in a
parser stops the agent's whole dataflow."""

from __future__ import annotations

import calendar
import datetime as dt
import json
import math

from hypothesis import example, given
from hypothesis import strategies as st

from sources import follow, formats, journal
from tests.unit.fuzzing import NASTY, any_text, corpus_lines, example_messages, fuzz, near

CTX = formats.Context(formats.YearGuess(2026, 12, fixed=True), boot_base=1_000_000.0)
GUESS = formats.Context(formats.YearGuess(2026, 1))  # no boot time, year guessed


def heads() -> tuple[str, ...]:
    """The log heads of every format, each followed by a pack example message."""
    return (
        "Dec  1 10:00:00 gpu-1 kernel: ", "<4>Dec  1 10:00:00 gpu-1 kernel: [  100.5] ",
        "2026-12-01T10:00:00.250000+00:00 gpu-2 kernel: ", "<4>1 2026-12-01T10:00:00.000Z gpu-3 kernel - - - ",
        '<4>1 2026-12-01T10:00:00Z gpu-3 app 12 ID [a b="]x"][c] ', "[  100.500000] ",
        "[Tue Dec  1 10:00:00 2026] ", "2026-12-01T10:00:00,500000+00:00 ", "6,1234,100500000,-;",
    )  # fmt: skip


def seeds() -> tuple[str, ...]:
    messages = example_messages()
    return corpus_lines() + tuple(h + messages[i % len(messages)] for i, h in enumerate(heads() * 8))


def check(parsed: formats.Parsed | None) -> None:
    """A record's values are usable downstream: finite float times, a host without blanks, str text."""
    if parsed is None:
        return
    assert isinstance(parsed.ts, float) and math.isfinite(parsed.ts), parsed
    assert parsed.boot is None or (isinstance(parsed.boot, float) and math.isfinite(parsed.boot)), parsed
    assert parsed.host is None or (isinstance(parsed.host, str) and parsed.host and " " not in parsed.host)
    assert isinstance(parsed.message, str)
    assert isinstance(parsed.kernel, bool)
    formats.one_line(parsed)


def every_parser(line: str) -> None:
    for ctx in (CTX, GUESS):
        for parse in formats.PARSERS.values():
            check(parse(line, ctx))
        for fmt in (*formats.LINE_FORMATS, "export", "nonsense"):
            result = formats.parse_line(fmt, line, ctx)
            if result is not None:
                assert result[0] in formats.LINE_FORMATS
                check(result[1])
        assert formats.detect([line, line], ctx) in (None, "export", *formats.LINE_FORMATS)
    uptime = formats.last_uptime([line])
    assert uptime is None or math.isfinite(uptime)
    assert isinstance(formats.join_lines(line.split("\n")), str)


# Found by this fuzzing: numbers the parsers read with int() after str.isdigit() or a Unicode \d, which
# also holds digits int() refuses ('²') and runs too long for int() (over 4300 digits) or for a float.
CRASHED = (
    "2026-12-01T10:00:00.\u00b2+00:00 host kernel: x",  # iso fraction: int('²')
    "2026-12-01T10:00:00." + "1" * 5000 + "+00:00 host kernel: x",  # iso fraction: 5000 digits
    "[ " + "1" * 5000 + ".5] x",  # dmesg uptime: int() refuses 5000 digits
    "[ " + "1" * 400 + ".5] x",  # dmesg uptime: no float holds it
    "Dec  1 10:00:00 h tag: [ " + "9" * 400 + ".5] from user space",  # syslog message with an uptime
    "6,1,\u00b2,-;x",  # kmsg time: int('²')
    "6,1," + "9" * 400 + ",-;x",  # kmsg time: no float holds it
    "\u00b2,1,1,-;x",  # kmsg priority: int('²')
    "<\u00b2>Dec  1 10:00:00 h kernel: x",  # syslog priority: int('²')
    '{"__REALTIME_TIMESTAMP": "\u00b2", "MESSAGE": "x"}',  # journal time: int('²')
    '{"__REALTIME_TIMESTAMP": "' + "9" * 400 + '", "MESSAGE": "x"}',  # journal time: float overflow
    '{"__REALTIME_TIMESTAMP": "1", "_SOURCE_MONOTONIC_TIMESTAMP": "\u00b2", "MESSAGE": "x"}',
    '{"MESSAGE": ' + "[" * 3000,  # json.loads: RecursionError, not a ValueError
    "<4>1 2026-12-01T10:00:00Z  kernel - - - x",  # two blanks: the host '' (now None, as '-')
)


@fuzz(2000)
@given(near(seeds()))
@example(CRASHED[0])
@example(CRASHED[1])
@example(CRASHED[2])
@example(CRASHED[3])
@example(CRASHED[4])
@example(CRASHED[5])
@example(CRASHED[6])
@example(CRASHED[7])
@example(CRASHED[8])
@example(CRASHED[9])
@example(CRASHED[10])
@example(CRASHED[11])
@example(CRASHED[12])
@example(CRASHED[13])
def test_parsers_on_mutated_log_lines(line: str) -> None:
    every_parser(line)


@fuzz(2000)
@given(st.one_of(any_text, st.lists(st.sampled_from(NASTY), max_size=8).map("".join)))
def test_parsers_on_arbitrary_text(line: str) -> None:
    every_parser(line)


@fuzz(500)
@given(st.lists(near(seeds(), max_edits=2), max_size=12))
def test_detect_and_last_uptime_on_mutated_samples(lines: list[str]) -> None:
    for ctx in (CTX, GUESS):
        assert formats.detect(lines, ctx) in (None, "export", *formats.LINE_FORMATS)
    uptime = formats.last_uptime(lines)
    assert uptime is None or math.isfinite(uptime)


# -- journal fields ------------------------------------------------------------------------------------

digits = st.one_of(
    st.integers(0, 2**64).map(str),
    st.sampled_from(NASTY),
    st.text(alphabet="0123456789\u00b2\u0663", max_size=30),
)
values = st.one_of(
    digits, any_text, st.integers(), st.floats(), st.booleans(), st.none(),
    st.lists(st.integers(-(2**70), 2**70), max_size=20), st.lists(st.one_of(st.text(max_size=3), st.none()), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)  # fmt: skip
keys = st.sampled_from(
    ("MESSAGE", "__REALTIME_TIMESTAMP", "_SOURCE_MONOTONIC_TIMESTAMP", "__MONOTONIC_TIMESTAMP", "_HOSTNAME",
     "_TRANSPORT", "SYSLOG_IDENTIFIER", "SYSLOG_FACILITY", "__CURSOR")
)  # fmt: skip


@fuzz(800)
@given(st.dictionaries(st.one_of(keys, st.text(max_size=8)), values, max_size=8))
@example({"__REALTIME_TIMESTAMP": "9" * 400, "MESSAGE": "x"})
@example({"__REALTIME_TIMESTAMP": "1", "__MONOTONIC_TIMESTAMP": "\u00b2", "MESSAGE": "x"})
@example({"__REALTIME_TIMESTAMP": "1", "_HOSTNAME": "", "MESSAGE": "x"})  # the host '' (now None)
@example({"__REALTIME_TIMESTAMP": "1", "_HOSTNAME": "a b", "MESSAGE": "x"})
def test_journal_fields(fields: dict[str, object]) -> None:
    check(formats.journal_record(fields))
    check(formats.parse_json(json.dumps(fields), CTX))
    raw = {
        k: (v if isinstance(v, str) else json.dumps(v)).encode("utf-8", "surrogatepass")
        for k, v in fields.items()
    }
    check(formats.parse_export_fields(raw))


@fuzz(1000)
@given(st.text(alphabet='{}[]":,0123456789\\ud8MESAG_', max_size=200), st.integers(0, 3000))
def test_json_lines_of_any_shape_and_depth(text: str, depth: int) -> None:
    """JSON-looking lines, nested deeper than json.loads recurses: None, never RecursionError."""
    for line in ("{" + text, '{"MESSAGE": ' + "[" * depth + text, '{"a":"\\ud800' + text):
        check(formats.parse_json(line, CTX))


# -- round trips: a line written in a format parses back to what it was written from -------------------

stamps = st.datetimes(dt.datetime(1971, 1, 1), dt.datetime(2099, 12, 31)).map(
    lambda d: d.replace(microsecond=0)
)
hosts = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,40}", fullmatch=True)
# a message the formats carry unchanged: no leading '[' (an uptime), no rsyslog or kmsg escapes
messages = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 :.,()=_/<>;'-]{0,100}", fullmatch=True).filter(
    lambda m: "#01" not in m
)


@fuzz(1000)
@given(stamps, st.integers(0, 999_999), hosts, messages)
def test_written_lines_parse_back(when: dt.datetime, micros: int, host: str, message: str) -> None:
    epoch = float(calendar.timegm(when.timetuple()))
    year = formats.Context(formats.YearGuess(when.year, 12, fixed=True), epoch - 5000.0, syslog_trusted=True)
    iso = when.strftime("%Y-%m-%dT%H:%M:%S")
    frac = micros / 1e6
    up = 5000 + micros // 1000  # seconds since boot, for dmesg and kmsg
    journal = {"__REALTIME_TIMESTAMP": str(int(epoch) * 10**6 + micros), "_HOSTNAME": host}
    written = {
        "rfc3164": (f"<6>{when:%b} {when.day:2d} {when:%H:%M:%S} {host} kernel: {message}", epoch, host),
        "iso": (f"{iso}.{micros:06d}+00:00 {host} kernel: {message}", epoch + frac, host),
        "rfc5424": (f"<6>1 {iso}.{micros:06d}Z {host} kernel - - - {message}", epoch + frac, host),
        "json": (
            json.dumps({**journal, "_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0", "MESSAGE": message}),
            epoch + frac,
            host,
        ),
        "dmesg": (f"[{up:5d}.{micros:06d}] {message}", epoch - 5000 + up + frac, None),
        "kmsg": (f"6,7,{up * 10**6 + micros},-;{message}", epoch - 5000 + up + frac, None),
    }
    for fmt, (line, ts, want_host) in written.items():
        parsed = formats.PARSERS[fmt](line, year)
        assert parsed is not None, (fmt, line)
        assert (parsed.host, parsed.message, parsed.kernel) == (want_host, message, True), (fmt, line)
        assert math.isclose(parsed.ts, ts, abs_tol=1e-5), (fmt, line, parsed.ts, ts)
        assert formats.parse_line(fmt, line, year) == (fmt, parsed)


# -- the live readers: journalctl's JSON lines and /dev/kmsg records ----------------------------------


@fuzz(1000)
@given(
    st.one_of(near(tuple(ln for ln in corpus_lines() if ln.startswith("{"))), any_text, st.integers(0, 3000))
)
@example('{"__CURSOR": "c", "MESSAGE": ' + "[" * 3000)  # RecursionError, not a ValueError
def test_journalctl_lines_are_entries_or_none(line: str | int) -> None:
    if isinstance(line, int):
        line = '{"__CURSOR": "c", "a": ' + "[" * line
    for raw in (line, line.encode("utf-8", "surrogatepass")):
        entry = journal.parse(raw)
        if entry is not None:
            assert isinstance(entry.cursor, str)
            check(entry.record)


@fuzz(600)
@given(
    st.lists(
        near(tuple(ln for ln in corpus_lines() if ln[:1].isdigit() and ";" in ln)) | any_text, max_size=8
    )
)
@example(["6,\u00b2,100,-;x"])  # int('²') after str.isdigit()
@example(["6," + "9" * 5000 + ",100,-;x"])
def test_kmsg_records_are_taken_once_in_sequence(records: list[str]) -> None:
    reader = follow.KmsgReader()
    taken = []
    for record in records:
        before = reader.last_seq
        accepted = reader._accept(record)  # the record filter of the reader's poll
        if accepted is not None:
            assert accepted == record and reader.last_seq > before
            taken.append(reader.last_seq)
    assert taken == sorted(set(taken))
