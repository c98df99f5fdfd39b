"""The global options of every command (`--log-format`, `--log-level`): logging is configured once, here.
Light on purpose (no settings models): `faultline replay` starts from it (`cli.main`)."""

from __future__ import annotations

from typing import Annotated

import typer

from faultline import logs

LogFormatOption = Annotated[
    logs.Format | None,
    typer.Option(
        "--log-format", envvar="FAULTLINE_LOG_FORMAT", show_default=False,
        help="Log lines as json (one object a line) or console (for people). Default: json unless stderr is "
        "a terminal.",
    ),
]  # fmt: skip
LogLevelOption = Annotated[
    logs.Level, typer.Option("--log-level", envvar="FAULTLINE_LOG_LEVEL", help="Least severe level logged.")
]


def log_options(log_format: LogFormatOption = None, log_level: LogLevelOption = "info") -> None:
    """faultline: GPU fault detection, quarantine and remediation for Kubernetes."""
    logs.configure(log_format, log_level)
