"""The `faultline` command line: the composition root of every command (ARCHITECTURE §9)."""

from __future__ import annotations

import sys
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from faultline.errors import FaultlineError, InputError, PackError

app = typer.Typer(
    help="faultline: GPU fault detection, quarantine and remediation for Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
patterns_app = typer.Typer(help="Check pattern packs.", no_args_is_help=True)
app.add_typer(patterns_app, name="patterns")

# Not a terminal (a pipe, CI): lay tables out wide instead of folding them into 80 columns.
out = Console(highlight=False, soft_wrap=False, emoji=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, emoji=False)


class OutputFormat(StrEnum):
    table = "table"
    jsonl = "jsonl"


class LogFormat(StrEnum):
    rfc3164 = "rfc3164"
    rfc5424 = "rfc5424"
    iso = "iso"
    json = "json"
    export = "export"
    dmesg = "dmesg"
    kmsg = "kmsg"


def _compile(packs: list[Path], *, builtin: bool = True, check_examples: bool = True):  # type: ignore[no-untyped-def]  # noqa: ANN202
    from patterns import compiler, loader  # noqa: PLC0415 - keep `--help` fast

    return compiler.compile_packs(loader.load(packs, builtin=builtin), check_examples=check_examples)


@app.command()
def replay(
    paths: Annotated[list[str], typer.Argument(help="Log files or directories (syslog, journal JSON/export, dmesg; .gz ok).")],
    pack: Annotated[list[Path] | None, typer.Option("--pack", help="Extra pack directory (repeatable); overrides built-ins by id.")] = None,
    output: Annotated[OutputFormat, typer.Option(help="table for people, jsonl for machines.")] = OutputFormat.table,
    workers: Annotated[int, typer.Option(min=1, max=64, help="Bytewax worker threads.")] = 1,
    node: Annotated[str | None, typer.Option(help="Node name for every line (default: the line's host, else the file name).")] = None,
    year: Annotated[int | None, typer.Option(min=1970, max=9999, help="Year of RFC 3164 lines (default: from each file's mtime).")] = None,
    boot_time: Annotated[datetime | None, typer.Option(help="Boot time (UTC) for dmesg/kmsg lines stamped in seconds since boot.")] = None,
    log_format: Annotated[LogFormat | None, typer.Option("--format", help="Skip detection: treat every file as this format.")] = None,
    builtin: Annotated[bool, typer.Option(help="Load the built-in packs.")] = True,
    progress: Annotated[bool | None, typer.Option(help="Progress bar (default: when stdout is a terminal).")] = None,
) -> None:
    """Replay log files through the pattern packs and print the faults found."""
    from dataflows import replay as replay_flow  # noqa: PLC0415
    from sinks import render  # noqa: PLC0415
    from sources import files  # noqa: PLC0415

    try:
        compiled = _compile(pack or [], builtin=builtin)
    except PackError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    boot_epoch = None
    if boot_time is not None:
        boot_epoch = (boot_time if boot_time.tzinfo else boot_time.replace(tzinfo=__import__("datetime").UTC)).timestamp()
    infos: list[files.FileInfo] = []
    failed = 0
    for index, path in enumerate(files.expand_paths(paths)):
        try:
            info = files.sniff(index, path, year=year, boot_time=boot_epoch,
                               force_format=log_format.value if log_format else None)  # fmt: skip
        except InputError as exc:
            err.print(f"[red]error:[/red] {exc}")
            failed += 1
            continue
        for note in info.notes:
            err.print(f"[yellow]note:[/yellow] {info.path}: {note}")
        if info.fmt != "empty":
            infos.append(info)
    if not infos and failed:
        err.print("[red]error:[/red] no readable input files")
        raise typer.Exit(1)
    by_path = {i.path: i for i in infos}
    groups = [[by_path[p] for p in g] for g in files.rotation_groups([i.path for i in infos])]
    show_progress = sys.stdout.isatty() if progress is None else progress
    bar: Progress | None = None
    callback = None
    if show_progress:
        total = sum(i.size for i in infos) if not any(files.is_gzip(i.path) for i in infos) else None
        bar = Progress(TextColumn("replay"), BarColumn(), TextColumn("{task.fields[lines]:,} lines"),
                       TimeElapsedColumn(), console=err, transient=True)  # fmt: skip
        task = bar.add_task("replay", total=total, lines=0)
        seen = [0]

        def callback(nbytes: int, nlines: int) -> None:
            seen[0] += nlines
            assert bar is not None
            bar.update(task, advance=nbytes, lines=seen[0])

        bar.start()
    try:
        result = replay_flow.run(
            groups, compiled, workers=workers, node_override=node, progress=callback,
            on_diag=lambda d: err.print(f"[yellow]warning:[/yellow] {d}", markup=True, highlight=False),
        )  # fmt: skip
    finally:
        if bar is not None:
            bar.stop()
    stats = result.stats
    if output is OutputFormat.jsonl:
        for line in render.jsonl_lines(result.faults):
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
        summary_console = err
    else:
        render.print_table(out, result.faults)
        summary_console = out
    rate = stats.lines / result.seconds if result.seconds > 0 else 0.0
    open_faults = sum(1 for f in result.faults if f.resolved_at is None)
    fatal = sum(1 for f in result.faults if f.fatal and f.resolved_at is None)
    summary_console.print(
        f"lines read {stats.lines:,} in {stats.files} file(s); skipped {stats.skipped:,} as unparseable "
        f"(not a log line {stats.unparseable:,}, binary {stats.binary:,}, too long {stats.oversize:,}); "
        f"invalid UTF-8 {stats.invalid_utf8:,}; faults {len(result.faults)} ({open_faults} open, {fatal} fatal); "
        f"{rate:,.0f} lines/s ({result.seconds:.2f} s)"
        + (f"; regex timeouts {result.regex_timeouts}" if result.regex_timeouts else "")
        + (f"; unreadable files {failed}" if failed else ""),
        markup=False, highlight=False,
    )  # fmt: skip


def _pack_command(dirs: list[Path], builtin: bool, *, run_examples: bool) -> None:
    from patterns import examples  # noqa: PLC0415

    try:
        compiled = _compile(dirs, builtin=builtin, check_examples=False)
    except PackError as exc:
        err.print(f"[red]FAIL[/red] {exc}")
        raise typer.Exit(1) from exc
    if run_examples:
        failures = examples.run(compiled)
        for failure in failures:
            out.print(f"FAIL {failure}", markup=False, highlight=False)
        if failures:
            out.print(f"{len(failures)} example failure(s)")
            raise typer.Exit(1)
        total = sum(len(p.spec.examples.match) + len(p.spec.examples.no_match) for p in compiled.patterns)
        out.print(f"ok: {total} examples of {len(compiled.patterns)} patterns in {len(compiled.packs.files)} files")
        return
    for p in compiled.patterns:
        previous = compiled.packs.patterns[p.id].overrides
        if previous:
            out.print(f"note: {p.file}: pattern {p.id!r} overrides the one in {previous}", markup=False)
    out.print(f"ok: {len(compiled.patterns)} patterns in {len(compiled.packs.files)} files")


@patterns_app.command("lint")
def patterns_lint(
    dirs: Annotated[list[Path] | None, typer.Argument(help="Pack directories or files (default: built-ins only).")] = None,
    builtin: Annotated[bool, typer.Option(help="Load the built-in packs too.")] = True,
) -> None:
    """Validate packs: schema, regexes (and catastrophic backtracking), templates and tables."""
    _pack_command(dirs or [], builtin, run_examples=False)


@patterns_app.command("test")
def patterns_test(
    dirs: Annotated[list[Path] | None, typer.Argument(help="Pack directories or files (default: built-ins only).")] = None,
    builtin: Annotated[bool, typer.Option(help="Load the built-in packs too.")] = True,
) -> None:
    """Run every pattern's positive and negative examples; report each failure with file and pattern id."""
    _pack_command(dirs or [], builtin, run_examples=True)


def main() -> None:
    try:
        app()
    except FaultlineError as exc:
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
