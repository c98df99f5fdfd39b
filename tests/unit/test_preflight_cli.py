"""`faultline preflight`'s composition root (`cli.preflight.preflight`) when the checker itself breaks (the
GPU library will not load): exit 0 with a one-line warning in stderr and the termination log, or exit 1
with `fail_on_error`; never a traceback. The checks' own outcomes: tests/unit/test_preflight_run.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NoReturn

import pytest
import typer

from cli import preflight as command
from faultline import config
from sources.gpu import GpuBackend


def _no_library(cfg: config.PreflightConfig) -> GpuBackend:
    raise OSError("libnvidia-ml.so.1: cannot open shared object file")


def _exit(code: int) -> NoReturn:
    raise SystemExit(code)


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "_backend", _no_library)
    monkeypatch.setattr(os, "_exit", _exit)  # the failure path leaves without unwinding
    # no handler another test configured (its stream may be closed by now, and logging would report that
    # with a traceback of its own): the log lines go to this test's stderr
    monkeypatch.setattr(logging.root, "handlers", [])


@pytest.mark.usefixtures("broken")
@pytest.mark.parametrize(
    ("fail_on_error", "code", "start"), [(False, 0, "preflight warning: "), (True, 1, "preflight error: ")]
)
def test_a_checker_error_never_shows_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fail_on_error: bool, code: int, start: str
) -> None:
    log = tmp_path / "termination-log"
    cfg = config.PreflightConfig(
        node="n1", checks=("count",), termination_log=log, check_timeout=5.0, fail_on_error=fail_on_error
    )
    with pytest.raises((typer.Exit, SystemExit)) as ended:
        command.preflight(cfg)
    assert getattr(ended.value, "exit_code", getattr(ended.value, "code", None)) == code
    message = log.read_text(encoding="utf-8")
    assert message.startswith(start) and message.count("\n") == 1
    assert "(OSError: libnvidia-ml.so.1: cannot open shared object file)" in message
    err = capsys.readouterr().err
    assert "Traceback" not in err and message.strip() in " ".join(err.split())
