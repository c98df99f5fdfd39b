"""Structured logs, configured once by the CLI (`configure`), never by a library module.

Every module logs through `logging.getLogger(__name__)` with a constant message and its values in `extra=`
fields from one vocabulary (`node`, `gpu`, `code`, `fault_key`, `worker`, `attempt`, `step_id`, `claim`,
`reason`, ...). Two renderings of the same records:

- `json`: one JSON object per line (`ts`, `level`, `logger`, `event`, then every extra field), the default
  when stderr is not a terminal (a pod: the log collector parses the fields);
- `console`: `HH:MM:SS LEVEL logger: event key=value ...` for a person at a terminal.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any, Literal, TextIO

Format = Literal["json", "console"]
Level = Literal["debug", "info", "warning", "error"]

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The `extra=` fields of a record."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


def _plain(value: Any) -> Any:
    """JSON-safe values: datetimes as ISO 8601, anything else unknown as its str()."""
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC), level, logger, event, the extra fields, exc (a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds")
        out: dict[str, Any] = {"ts": ts, "level": record.levelname.lower(), "logger": record.name,
                               "event": record.getMessage()}  # fmt: skip
        for key, value in fields(record).items():
            out.setdefault(key, _plain(value))  # an extra field never hides the four above
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    """`12:00:01 INFO workers.quarantine: cordoned node=n1 fault_key=...` (local time, for people)."""

    def format(self, record: logging.LogRecord) -> str:
        when = dt.datetime.fromtimestamp(record.created).strftime("%H:%M:%S")  # local time, for people
        extra = " ".join(f"{k}={_plain(v)}" for k, v in fields(record).items())
        line = f"{when} {record.levelname:<7} {record.name}: {record.getMessage()}"
        line = f"{line} {extra}" if extra else line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `configure` installs (so a second call replaces it instead of adding another)."""


def default_format(stream: TextIO) -> Format:
    return "console" if stream.isatty() else "json"


def configure(fmt: Format | None = None, level: Level = "info", stream: TextIO | None = None) -> None:
    """Send every logger's records at `level` or above to `stream` (stderr) in `fmt` (default: json unless
    the stream is a terminal). Called once per process by the CLI."""
    stream = sys.stderr if stream is None else stream
    fmt = fmt or default_format(stream)
    handler = _Handler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(capture=True)
