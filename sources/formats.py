"""Kernel-log line formats: detection and per-line parsing (pure functions, no I/O).

Every parser takes one decoded line and returns a `Parsed` record, or None when the line is not in
that format.  Time is the line's own time as float epoch seconds (UTC):

- `rfc3164`  `<13>Dec  1 10:00:00 host kernel: msg` (no year and no zone: the year comes from the
  caller's `YearGuess`, the zone is taken as UTC)
- `iso`      `2026-12-01T10:00:00.123456+00:00 host kernel: msg` (rsyslog's file format)
- `rfc5424`  `<13>1 2026-12-01T10:00:00.123Z host kernel - - - msg`
- `json`     `journalctl -o json` lines
- `export`   `journalctl -o export` records (parsed by `sources.files`, see `parse_export_fields`)
- `dmesg`    `[ 1108.858286] msg` (seconds since boot), `[Tue Dec  1 10:00:00 2026] msg` (`dmesg -T`),
  `2026-12-01T10:00:00,123456+00:00 msg` (`dmesg --time-format iso`); each optionally after the
  facility and level `dmesg --decode` prints (`kern  :warn  : `) or the raw priority `dmesg -r` prints
  (`<4>`), and before a printk caller id (`[  T896] `, `[    C3]`, kernels with CONFIG_PRINTK_CALLER)
- `kmsg`     `/dev/kmsg` records `6,1234,1108858286,-;msg` (microseconds since boot)

Origin (`Parsed.kernel`): whether the kernel wrote the line, as far as the line can prove it. A journal
record is the kernel's only when journald itself says so: `_TRANSPORT=kernel` (set by journald, not the
writer) and `SYSLOG_FACILITY=0` (user space writing to /dev/kmsg gets facility user, 1, whatever it asks
for). A kmsg record is the kernel's when its facility is kern (0). A syslog line's tag (`kernel:`), RFC 5424
app-name and priority are chosen by its writer (`logger -t kernel -p kern.err` forges both), so syslog
lines are never the kernel's unless `Context.syslog_trusted` says the file's tags can be trusted (a file
only the kernel's logger writes to); then a tag or app-name other than `kernel`, or a facility other than
kern, still makes a line user space's. Plain dmesg lines carry no origin and are the kernel's; `dmesg
--decode` and `dmesg -r` name the facility, and a line whose facility is not kern is user space's (as kmsg).

Records the writer split over lines inside one entry are joined here (`join_lines`): a journal MESSAGE
with newlines, rsyslog's `#012` escapes, kmsg's `\x0a` escapes. dmesg's indented continuation lines
are joined by the scanner (`sources.scan`), which sees the neighbouring lines.
"""

from __future__ import annotations

import calendar
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
SOURCE_OF_FORMAT = {
    "rfc3164": "syslog",
    "iso": "syslog",
    "rfc5424": "syslog",
    "json": "journal",
    "export": "journal",
    "dmesg": "kmsg",
    "kmsg": "kmsg",
}
LINE_FORMATS = ("rfc3164", "iso", "rfc5424", "json", "dmesg", "kmsg")


class Parsed(NamedTuple):
    ts: float
    host: str | None
    message: str
    boot: float | None  # boot time, when the line says how long the node has been up
    kernel: bool = True  # False: the line names another origin than the kernel (see the module doc)


MAX_PREFIX = 64  # a driver prefix (`NVRM: `, `mlx5_core 0000:5e:00.0: `) is at most this long
DETECT_LINES = 64  # non-empty lines at a file's start whose formats vote on the file's format
EXPORT_LINES = 8  # of them, the first lines that are all FIELD=value in a journal export


def driver_prefix(message: str) -> str:
    """The text up to and including the first `: ` (`NVRM: `), which continuation lines repeat; ''
    when there is none within MAX_PREFIX characters."""
    i = message.find(": ", 0, MAX_PREFIX)
    return message[: i + 2] if i > 0 else ""


def one_line(rec: Parsed) -> Parsed:
    """The record with a multi-line message (a journal entry holding newlines) joined for matching."""
    if "\n" not in rec.message:
        return rec
    return rec._replace(message=join_lines(rec.message.rstrip("\n").split("\n")))


def join_lines(lines: list[str]) -> str:
    """One kernel record from its lines: continuation lines lose leading blanks and the first line's
    driver prefix, and are joined with single spaces (`NVRM: a` + `NVRM: b` -> `NVRM: a b`)."""
    first = lines[0].rstrip()
    prefix = driver_prefix(first)
    parts = [first]
    for raw in lines[1:]:
        line = raw.strip()
        if prefix and line.startswith(prefix):
            line = line[len(prefix) :].lstrip()
        if line:
            parts.append(line)
    return " ".join(parts)


@dataclass(frozen=True)
class YearGuess:
    """RFC 3164 lines carry no year: use `year`, or the reference (file mtime) year, stepping back one
    year for months after the reference month (a December line read in January)."""

    ref_year: int
    ref_month: int
    fixed: bool = False

    def year_for(self, month: int) -> int:
        if self.fixed:
            return self.ref_year
        return self.ref_year - 1 if month > self.ref_month else self.ref_year


@dataclass(frozen=True)
class Context:
    year: YearGuess
    boot_base: float | None = None  # epoch of the boot, for relative dmesg/kmsg times
    syslog_trusted: bool = False  # a syslog line's `kernel` tag can be believed (see the module doc)


_ISO_CACHE: dict[str, float] = {}
_3164_CACHE: dict[tuple[int, str], float] = {}
# ASCII digits only (a Unicode \d also matches digits int() refuses, such as '²'), and no more than a
# float holds: a line is untrusted text, and one exception in a parser would stop the agent's dataflow
_UPTIME = re.compile(r"^\[\s*(\d{1,12})\.(\d{1,9})\](?= |\[)", re.ASCII)
_DMESG_T = re.compile(
    r"^\[(?:[A-Z][a-z]{2}) ([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\] ", re.ASCII
)
_ISO_DMESG = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)[,.](\d+)([+-]\d\d:?\d\d|Z) ", re.ASCII)
# `dmesg --decode`: the facility and level names util-linux prints, each padded (`kern  :warn  : `)
_DECODE = re.compile(
    r"^(kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|res0|res1|res2|res3|"
    r"local[0-7]) *:(emerg|alert|crit|err|warn|notice|info|debug) *: ",
    re.ASCII,
)
_RAW_PRI = re.compile(r"^<(\d{1,3})>", re.ASCII)  # `dmesg -r`: the record's priority, facility * 8 + level
_CALLER = re.compile(r"^\[ *[TC]\d{1,10}\] ?", re.ASCII)  # printk caller id: thread (T) or CPU (C)
_MAX_FRACTION = 9  # digits of a fraction of a second that count (nanoseconds); later ones are dropped


def uint(text: str, digits: int = 20) -> int | None:
    """`text` as an unsigned integer of at most `digits` ASCII digits (20: any u64), else None."""
    if 0 < len(text) <= digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def _cache_put(cache: dict[Any, float], key: Any, value: float) -> float:
    if len(cache) > 65536:
        cache.clear()
    cache[key] = value
    return value


def iso_epoch(text: str) -> float | None:
    """`2026-12-01T10:00:00.5+02:00` -> epoch seconds; None if it is not an ISO 8601 timestamp."""
    base, frac, zone = text[:19], "", "+00:00"
    rest = text[19:]
    if rest[:1] in (".", ","):
        end = 1
        while end < len(rest) and "0" <= rest[end] <= "9":
            end += 1
        frac, rest = rest[1:end][:_MAX_FRACTION], rest[end:]
    if rest and rest != "Z":
        zone = rest
    key = base + zone
    whole = _ISO_CACHE.get(key)
    if whole is None:
        try:
            dt = datetime.fromisoformat(base + zone)
        except ValueError:
            return None
        if dt.tzinfo is None:
            return None
        whole = _cache_put(_ISO_CACHE, key, dt.timestamp())
    return whole + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _split_tag(rest: str) -> tuple[str | None, str]:
    """`kernel: [ 12.5] msg` -> (`kernel`, `[ 12.5] msg`): the syslog tag and the message after it."""
    i = rest.find(": ")
    if i < 0 or " " in rest[:i].rstrip(":"):
        return None, rest
    return rest[:i], rest[i + 2 :]


def _syslog_message(message: str) -> str:
    """rsyslog escapes control characters as `#ooo`: a record's newlines arrive as `#012`."""
    if "#01" in message:
        message = message.replace("#011", " ")
        if "#012" in message:
            return join_lines(message.split("#012"))
    return message


def _after_stamp(rest: str) -> str:
    """The message after a stamp: `] msg`, `] [  T896] msg` or `][  T896] msg` (the printk caller id,
    CONFIG_PRINTK_CALLER: T for a thread, C for a CPU) -> `msg`."""
    if rest[:1] == " ":
        rest = rest[1:]
    if rest[:1] == "[":
        m = _CALLER.match(rest)
        if m:
            return rest[m.end() :]
    return rest


def _strip_uptime(message: str, ts: float) -> tuple[str, float | None]:
    if message.startswith("["):
        m = _UPTIME.match(message)
        if m:
            uptime = int(m.group(1)) + int(m.group(2)) / 10 ** len(m.group(2))
            return _after_stamp(message[m.end() :]), ts - uptime
    return message, None


def _strip_pri(line: str) -> tuple[str | None, bool]:
    """`<13>rest` -> (`rest`, whether the facility is kern); (None, False) when a `<` opens no priority."""
    if not line.startswith("<"):
        return line, True
    end = line.find(">", 1, 5)
    if end <= 0:
        return None, False
    pri = uint(line[1:end], 3)
    return line[end + 1 :], pri is not None and pri >> 3 == 0


def parse_rfc3164(line: str, ctx: Context) -> Parsed | None:
    stripped, kern_facility = _strip_pri(line)
    if stripped is None:
        return None
    line = stripped
    if len(line) < 17 or line[3] != " " or line[6] != " " or line[9] != ":" or line[15] != " ":
        return None
    month = MONTHS.get(line[:3])
    if month is None:
        return None
    year = ctx.year.year_for(month)
    stamp = line[:15]
    ts = _3164_CACHE.get((year, stamp))
    if ts is None:
        try:
            day, hms = int(line[4:6]), line[7:15]
            hh, mm, ss = int(hms[0:2]), int(hms[3:5]), int(hms[6:8])
            ts = float(calendar.timegm((year, month, day, hh, mm, ss, 0, 0, 0)))
        except ValueError:
            return None
        if not (1 <= day <= 31 and hh < 24 and mm < 60 and ss < 61):
            return None
        _cache_put(_3164_CACHE, (year, stamp), ts)
    host, _, rest = line[16:].partition(" ")
    if not host:
        return None
    tag, text = _split_tag(rest)
    message, boot = _strip_uptime(_syslog_message(text), ts)
    return Parsed(ts, host, message, boot, ctx.syslog_trusted and kern_facility and tag == "kernel")


def parse_iso(line: str, ctx: Context) -> Parsed | None:
    stamp, _, rest = line.partition(" ")
    # rsyslog writes a '.' before the fraction; `dmesg --time-format iso` writes a ',' (see parse_dmesg)
    if len(stamp) < 20 or stamp[4] != "-" or stamp[10] != "T" or stamp[19] == ",":
        return None
    ts = iso_epoch(stamp)
    if ts is None:
        return None
    host, _, rest = rest.partition(" ")
    if not host or not rest:
        return None
    tag, text = _split_tag(rest)
    message, boot = _strip_uptime(_syslog_message(text), ts)
    return Parsed(ts, host, message, boot, ctx.syslog_trusted and tag == "kernel")


def parse_rfc5424(line: str, ctx: Context) -> Parsed | None:
    stripped, kern_facility = _strip_pri(line)
    if stripped is None:
        return None
    parts = stripped.split(" ", 6)
    if len(parts) < 7 or parts[0] != "1":
        return None
    ts = iso_epoch(parts[1])
    if ts is None:
        return None
    host = parts[2] if parts[2] not in ("-", "") else None
    rest = parts[6]
    if rest.startswith("-"):
        rest = rest[2:]
    elif rest.startswith("["):
        depth, i, quoted = 0, 0, False
        while i < len(rest):
            ch = rest[i]
            if ch == "\\" and quoted:
                i += 2
                continue
            if ch == '"':
                quoted = not quoted
            elif not quoted and ch == "[":
                depth += 1
            elif not quoted and ch == "]":
                depth -= 1
                if depth == 0 and (i + 1 >= len(rest) or rest[i + 1] != "["):
                    break
            i += 1
        rest = rest[i + 2 :]
    else:
        return None
    if rest.startswith("\ufeff"):
        rest = rest[1:]
    message, boot = _strip_uptime(_syslog_message(rest), ts)
    return Parsed(ts, host, message, boot, ctx.syslog_trusted and kern_facility and parts[3] == "kernel")


def _journal_message(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) for b in value):
        return bytes(b & 0xFF for b in value).decode("utf-8", "replace")
    return None


def journal_record(fields: dict[str, Any]) -> Parsed | None:
    """A journal entry (from `-o json` or `-o export`) as a Parsed line."""
    message = _journal_message(fields.get("MESSAGE"))
    stamp = fields.get("__REALTIME_TIMESTAMP")
    micros = uint(stamp) if isinstance(stamp, str) else None
    if message is None or micros is None:
        return None
    ts = micros / 1e6
    boot = None
    mono = fields.get("_SOURCE_MONOTONIC_TIMESTAMP") or fields.get("__MONOTONIC_TIMESTAMP")
    uptime = uint(mono) if isinstance(mono, str) else None
    if uptime is not None:
        boot = ts - uptime / 1e6
    host = fields.get("_HOSTNAME")
    if not isinstance(host, str) or not host or any(c.isspace() for c in host):
        host = None  # a journal file's own word: no host rather than '' or one with blanks
    # journald sets both itself (SYSLOG_IDENTIFIER is the writer's word, and not looked at): kmsg records
    # come with _TRANSPORT=kernel, and those user space wrote to /dev/kmsg with a facility other than kern
    kernel = fields.get("_TRANSPORT") == "kernel" and fields.get("SYSLOG_FACILITY") == "0"
    return Parsed(ts, host, message, boot, kernel)


def parse_json(line: str, ctx: Context) -> Parsed | None:
    if not line.startswith("{"):
        return None
    try:
        fields = json.loads(line)
    except (ValueError, RecursionError):  # nested deeper than the decoder recurses
        return None
    return journal_record(fields) if isinstance(fields, dict) else None


def _dmesg_origin(line: str) -> tuple[str, bool] | None:
    """The line after a `dmesg --decode` or `dmesg -r` prefix, and whether its facility is kern; the
    line itself (the kernel's) when it has neither; None for a `<` that opens no priority."""
    if line[:1] == "<":
        m = _RAW_PRI.match(line)
        if m is None:
            return None
        return line[m.end() :], int(m.group(1)) >> 3 == 0
    if line[:1] in "kumdalnucfrs":
        m = _DECODE.match(line)
        if m:
            return line[m.end() :], m.group(1) == "kern"
    return line, True


def parse_dmesg(line: str, ctx: Context) -> Parsed | None:
    origin = _dmesg_origin(line)
    if origin is None:
        return None
    line, kernel = origin
    if line.startswith("["):
        m = _UPTIME.match(line)
        if m:
            uptime = int(m.group(1)) + int(m.group(2)) / 10 ** len(m.group(2))
            base = ctx.boot_base if ctx.boot_base is not None else 0.0
            return Parsed(base + uptime, None, _after_stamp(line[m.end() :]), base, kernel)
        m = _DMESG_T.match(line)
        if m and m.group(1) in MONTHS:
            mon, day, hh, mi, ss, year = m.groups()
            try:
                ts = float(
                    calendar.timegm((int(year), MONTHS[mon], int(day), int(hh), int(mi), int(ss), 0, 0, 0))
                )
            except ValueError:
                return None
            return Parsed(ts, None, _after_stamp(line[m.end() :]), None, kernel)
        return None
    m = _ISO_DMESG.match(line)
    if m:
        stamp = iso_epoch(f"{m.group(1)}.{m.group(2)}{m.group(3)}")
        if stamp is not None:
            return Parsed(stamp, None, _after_stamp(line[m.end() :]), None, kernel)
    return None


def parse_kmsg(line: str, ctx: Context) -> Parsed | None:
    head, sep, message = line.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 4:
        return None
    prio, seq, micros = uint(fields[0]), uint(fields[1]), uint(fields[2])
    if prio is None or seq is None or micros is None:
        return None
    base = ctx.boot_base if ctx.boot_base is not None else 0.0
    if "\\x0a" in message:  # kmsg escapes a multi-line record's newlines
        message = join_lines(message.replace("\\x09", " ").split("\\x0a"))
    return Parsed(base + micros / 1e6, None, message, base, prio >> 3 == 0)


PARSERS = {
    "rfc3164": parse_rfc3164,
    "iso": parse_iso,
    "rfc5424": parse_rfc5424,
    "json": parse_json,
    "dmesg": parse_dmesg,
    "kmsg": parse_kmsg,
}


def parse_line(fmt: str, line: str, ctx: Context) -> tuple[str, Parsed] | None:
    """Parse `line` as `fmt`, falling back to the other line formats (mixed files).

    Returns (the format that parsed it, the record) or None when no format does.
    """
    parsed = PARSERS[fmt](line, ctx) if fmt in PARSERS else None
    if parsed is not None:
        return fmt, parsed
    for other in LINE_FORMATS:
        if other != fmt:
            parsed = PARSERS[other](line, ctx)
            if parsed is not None:
                return other, parsed
    return None


def detect(sample_lines: list[str], ctx: Context) -> str | None:
    """The format most of the sample's non-empty lines parse as (export detected by its fields)."""
    lines = [ln for ln in sample_lines if ln.strip()][:DETECT_LINES]
    if not lines:
        return None
    if lines[0].startswith("__CURSOR=") or (
        all("=" in ln for ln in lines[:EXPORT_LINES])
        and any(ln.startswith("__REALTIME_TIMESTAMP=") for ln in lines)
    ):
        return "export"
    votes = dict.fromkeys(LINE_FORMATS, 0)
    for ln in lines:
        for fmt in LINE_FORMATS:
            if PARSERS[fmt](ln, ctx) is not None:
                votes[fmt] += 1
                break
    best = max(votes, key=lambda f: votes[f])
    return best if votes[best] > 0 else None


def last_uptime(lines: list[str]) -> float | None:
    """The largest seconds-since-boot stamp among dmesg or kmsg lines (to anchor relative times)."""
    best = None
    for ln in lines:
        origin = _dmesg_origin(ln)
        m = _UPTIME.match(origin[0]) if origin else None
        if m:
            best = int(m.group(1)) + int(m.group(2)) / 10 ** len(m.group(2))
            continue
        head = ln.partition(";")[0].split(",")
        micros = uint(head[2]) if len(head) >= 4 else None
        if micros is not None:
            best = micros / 1e6
    return best


def parse_export_fields(record: dict[str, bytes]) -> Parsed | None:
    fields: dict[str, Any] = {}
    for key in (
        "MESSAGE",
        "__REALTIME_TIMESTAMP",
        "_SOURCE_MONOTONIC_TIMESTAMP",
        "__MONOTONIC_TIMESTAMP",
        "_HOSTNAME",
        "_TRANSPORT",
        "SYSLOG_FACILITY",
    ):
        if key in record:
            fields[key] = record[key].decode("utf-8", "replace")
    return journal_record(fields)
