"""`faultline replay`: kernel logs through the pattern packs, and the consoles every command prints on.

This module imports no settings model (`faultline.config`) and builds no other command: `cli.main` runs
`faultline replay` from it alone, so a replay of a small file starts in a fraction of the time the whole
command line takes to build. `cli.app` registers the same function, so the options and help are one.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from faultline.errors import PackError

if TYPE_CHECKING:
    from patterns.compiler import CompiledPacks
    from sources.files import FileInfo


def say(line: str, *, stderr: bool = False) -> None:
    """One line of plain text (notes, warnings, errors, the summary): what the consoles of `cli.consoles`
    print for it with markup off, without importing rich."""
    stream = sys.stderr if stderr else sys.stdout
    stream.write(line + "\n")
    stream.flush()


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


def compile_packs(packs: list[Path], *, builtin: bool = True, check_examples: bool = True) -> CompiledPacks:
    from patterns import compiler, loader  # noqa: PLC0415 - keep `--help` fast

    return compiler.compile_packs(loader.load(packs, builtin=builtin), check_examples=check_examples)


def replay(
    paths: Annotated[
        list[str],
        typer.Argument(help="Log files or directories (syslog, journal JSON/export, dmesg; .gz ok)."),
    ],
    pack: Annotated[
        list[Path] | None,
        typer.Option("--pack", help="Extra pack directory (repeatable); overrides built-ins by id."),
    ] = None,
    output: Annotated[
        OutputFormat, typer.Option(help="table for people, jsonl for machines.")
    ] = OutputFormat.table,
    workers: Annotated[int, typer.Option(min=1, max=64, help="Bytewax worker threads.")] = 1,
    processes: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="Scan in this many processes (large files are cut into ranges of "
            "lines); detection stays in this one. Faster on several cores.",
        ),
    ] = 1,
    node: Annotated[
        str | None,
        typer.Option(help="Node name for every line (default: the line's host, else the file name)."),
    ] = None,
    year: Annotated[
        int | None,
        typer.Option(min=1970, max=9999, help="Year of RFC 3164 lines (default: from each file's mtime)."),
    ] = None,
    boot_time: Annotated[
        datetime | None,
        typer.Option(help="Boot time (UTC) for dmesg/kmsg lines stamped in seconds since boot."),
    ] = None,
    log_format: Annotated[
        LogFormat | None, typer.Option("--format", help="Skip detection: treat every file as this format.")
    ] = None,
    builtin: Annotated[bool, typer.Option(help="Load the built-in packs.")] = True,
    syslog_trusted: Annotated[
        bool,
        typer.Option(
            help="Take syslog lines tagged `kernel` as the kernel's (any local user can write such a line; "
            "the agent does not by default: --no-syslog-trusted shows what it would conclude)."
        ),
    ] = True,
    progress: Annotated[
        bool | None, typer.Option(help="Progress bar (default: when stdout is a terminal).")
    ] = None,
) -> None:
    """Replay log files through the pattern packs and print the faults found."""
    from dataflows import replay as replay_flow  # noqa: PLC0415
    from sinks import render  # noqa: PLC0415
    from sources import files  # noqa: PLC0415

    if processes > 1 and workers > 1:
        error("--workers (threads of the one-process dataflow) and --processes: give one of them")
        raise typer.Exit(2)
    try:
        compiled = compile_packs(pack or [], builtin=builtin)
    except PackError as exc:
        error(str(exc))
        raise typer.Exit(2) from exc
    if boot_time is not None and boot_time.tzinfo is None:
        boot_time = boot_time.replace(tzinfo=UTC)
    inputs = files.sniff_all(
        files.expand_paths(paths),
        year=year,
        boot_time=boot_time.timestamp() if boot_time else None,
        force_format=log_format.value if log_format else None,
        syslog_trusted=syslog_trusted,
    )
    for problem in inputs.errors:
        error(problem)
    for note in inputs.notes:
        say(f"note: {note}", stderr=True)
    if not inputs.files and inputs.errors:
        error("no readable input files")
        raise typer.Exit(1)
    show_progress = sys.stdout.isatty() if progress is None else progress
    warn = _warn_beside_bar if show_progress else (lambda d: say(f"warning: {d}", stderr=True))
    # the compiled packs and their tables live for the whole run: out of the cyclic collector's scans
    # (`cli.main` starts a replay with the collector off: the imports make no cycles worth its passes)
    gc.collect()
    gc.freeze()
    gc.enable()
    with _progress(inputs.files, enabled=show_progress) as advance:
        if processes > 1:
            from dataflows import replay_processes  # noqa: PLC0415

            result = replay_processes.run(
                inputs.groups(), compiled, processes=processes, node_override=node, progress=advance,
                on_diag=warn,
            )  # fmt: skip
        else:
            result = replay_flow.run(
                inputs.groups(),
                compiled,
                workers=workers,
                node_override=node,
                progress=advance,
                on_diag=warn,
            )
    if output is OutputFormat.jsonl:
        for line in render.jsonl_lines(result.faults):
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
    else:
        from cli.consoles import out  # noqa: PLC0415 - rich for the table only

        render.print_table(out, result.faults)
    line = render.summary(
        result.stats, result.faults, result.seconds,
        regex_timeouts=result.regex_timeouts, unreadable=len(inputs.errors),
    )  # fmt: skip
    say(line, stderr=output is OutputFormat.jsonl)  # beside the table, or out of the JSON lines' way


def error(message: str) -> None:
    say(f"error: {message}", stderr=True)


def _warn_beside_bar(diag: str) -> None:
    """A warning printed above the progress bar (rich's console: a plain line would cut through it)."""
    from cli.consoles import err  # noqa: PLC0415

    err.print(f"warning: {diag}", markup=False)


@contextlib.contextmanager
def _progress(infos: list[FileInfo], *, enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr (by bytes when the total is known) that the sources advance."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from cli.consoles import err  # noqa: PLC0415
    from sources import files  # noqa: PLC0415

    total = None if any(files.is_gzip(i.path) for i in infos) else sum(i.size for i in infos)
    bar = Progress(
        TextColumn("replay"),
        BarColumn(),
        TextColumn("{task.fields[lines]:,} lines"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    task = bar.add_task("replay", total=total, lines=0)
    lines = 0

    def advance(nbytes: int, nlines: int) -> None:
        nonlocal lines
        lines += nlines
        bar.update(task, advance=nbytes, lines=lines)

    with bar:
        yield advance


def standalone() -> typer.Typer:
    """A command line of `replay` alone, with the global options: what `cli.main` runs for it."""
    from cli.log_options import log_options  # noqa: PLC0415

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True)
    app.command("replay")(replay)
    app.callback()(log_options)
    return app
