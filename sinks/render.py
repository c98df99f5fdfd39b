"""Renders faults for people (a rich table) and for machines (one JSON object per line)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from faultline.models import Fault

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat().replace("+00:00", "Z") if dt is not None else None


def fault_record(fault: Fault) -> dict[str, Any]:
    return {
        "node": fault.node,
        "entity": {"type": fault.entity.type, "id": fault.entity.id},
        "code": fault.code,
        "fatal": fault.fatal,
        "action": fault.action.value,
        "count": fault.count,
        "first_seen": _iso(fault.first_seen),
        "last_seen": _iso(fault.last_seen),
        "state": fault.state.value,
        "resolved_at": _iso(fault.resolved_at),
        "component": fault.component.value,
        "description": fault.description,
        "message": fault.message,
        "pattern": fault.pattern,
        "id": fault.id,
    }


def jsonl_lines(faults: Iterable[Fault]) -> list[str]:
    return [json.dumps(fault_record(f), sort_keys=False, ensure_ascii=False) for f in faults]


def _short(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%S")


def fault_table(faults: list[Fault]) -> Table:
    from rich.table import Table  # noqa: PLC0415 - the JSON lines' replays start without rich

    table = Table(title=f"{len(faults)} fault(s)", title_justify="left", show_lines=False)
    for name, style in (
        ("node", "bold"),
        ("entity", ""),
        ("code", "bold"),
        ("fatal", ""),
        ("action", ""),
        ("count", ""),
        ("first seen (UTC)", ""),
        ("last seen (UTC)", ""),
        ("state", ""),
        ("description", ""),
    ):
        table.add_column(
            name,
            style=style or None,
            justify="right" if name == "count" else "left",
            no_wrap=name != "description",
        )
    for f in faults:
        table.add_row(
            f.node,
            f"{f.entity.type} {f.entity.id}".strip(),
            f.code,
            "[red]yes[/red]" if f.fatal else "no",
            f.action.value,
            str(f.count),
            _short(f.first_seen),
            _short(f.last_seen),
            f.state.value if f.resolved_at is None else f"resolved {_short(f.resolved_at)}",
            f.description,
        )
    return table


def summary(
    stats: Any, faults: list[Fault], seconds: float, *, regex_timeouts: int = 0, unreadable: int = 0
) -> str:
    """One line for people: what was read, what was skipped and why, what was found, how fast."""
    rate = stats.lines / seconds if seconds > 0 else 0.0
    open_faults = [f for f in faults if f.resolved_at is None]
    fatal = sum(1 for f in open_faults if f.fatal)
    parts = [
        f"lines read {stats.lines:,} in {stats.files} file(s)",
        f"skipped {stats.skipped:,} as unparseable (not a log line {stats.unparseable:,}, "
        f"binary {stats.binary:,}, too long {stats.oversize:,})",
        f"invalid UTF-8 {stats.invalid_utf8:,}",
        f"untrusted kernel-looking lines {getattr(stats, 'untrusted', 0):,} (not written by the kernel)",
        f"faults {len(faults)} ({len(open_faults)} open, {fatal} fatal)",
        f"{rate:,.0f} lines/s ({seconds:.2f} s)",
    ]
    if stats.mixed:
        parts.append(f"lines in another format than their file {stats.mixed:,}")
    if regex_timeouts:
        parts.append(f"regex timeouts {regex_timeouts}")
    if unreadable:
        parts.append(f"unreadable files {unreadable}")
    return "; ".join(parts)


def print_table(console: Console, faults: list[Fault]) -> None:
    if not faults:
        console.print("no faults found")
        return
    console.print(fault_table(faults))
