"""Structured logs: the formatters, `configure`, and the node-action helper's log line."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cli import app as cli_app
from faultline import logs
from workers import common

pytestmark = pytest.mark.usefixtures("restore_logging")


def _record(msg: str = "cordoned", **extra: object) -> logging.LogRecord:
    record = logging.getLogger("workers.quarantine").makeRecord(
        "workers.quarantine", logging.INFO, __file__, 1, msg, (), None, extra=extra
    )
    record.created = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC).timestamp()
    return record


def test_json_lines_carry_the_extra_fields() -> None:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    line = logs.JsonFormatter().format(
        _record(node="n1", gpu="0000:3b:00", code="XID-79", fault_key="n1/gpu/XID-79", worker="quarantine",
                attempt=2, step_id="mongo", claim="quarantine/k#3", at=at, keys=("a", "b"))
    )  # fmt: skip
    doc = json.loads(line)
    assert doc == {
        "ts": "2026-01-02T03:04:05.678+00:00", "level": "info", "logger": "workers.quarantine",
        "event": "cordoned", "node": "n1", "gpu": "0000:3b:00", "code": "XID-79", "fault_key": "n1/gpu/XID-79",
        "worker": "quarantine", "attempt": 2, "step_id": "mongo", "claim": "quarantine/k#3",
        "at": "2026-01-01T00:00:00+00:00", "keys": ["a", "b"],
    }  # fmt: skip


def test_json_lines_hold_the_traceback() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.getLogger("x").makeRecord("x", logging.ERROR, __file__, 1, "failed", (), None)
        record.exc_info = sys.exc_info()
    doc = json.loads(logs.JsonFormatter().format(record))
    assert doc["level"] == "error"
    assert "RuntimeError: boom" in doc["exc"]


def test_console_lines_are_for_people() -> None:
    line = logs.ConsoleFormatter().format(_record(node="n1", attempt=2))
    assert line.endswith("INFO    workers.quarantine: cordoned node=n1 attempt=2")


@pytest.mark.parametrize(("tty", "expected"), [(False, "json"), (True, "console")])
def test_default_format_follows_the_terminal(tty: bool, expected: str) -> None:
    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    assert logs.default_format(Stream()) == expected


def test_configure_once_replaces_its_handler_and_sets_the_level() -> None:
    first, second = io.StringIO(), io.StringIO()
    logs.configure("json", "info", stream=first)
    logs.configure("json", "warning", stream=second)
    log = logging.getLogger("workers.drainer")
    log.info("quiet", extra={"node": "n"})
    log.warning("evicted", extra={"node": "n2", "attempt": 1})
    assert first.getvalue() == ""
    [doc] = [json.loads(line) for line in second.getvalue().splitlines()]
    assert (doc["event"], doc["node"], doc["attempt"], doc["logger"]) == (
        "evicted",
        "n2",
        1,
        "workers.drainer",
    )


def test_post_event_logs_the_node_action(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="workers.common")

    class NoApi:  # posting fails: the action is logged all the same, and the failure too
        pass

    common.post_event(NoApi(), "n1", reason="Cordoned", note="XID-79 on GPU 0", action="Cordon",  # type: ignore[arg-type]
                      warning=False, worker="quarantine", owner="q-1")  # fmt: skip
    action = next(r for r in caplog.records if r.getMessage() == "node action")
    assert logs.fields(action) == {"node": "n1", "reason": "Cordoned", "action": "Cordon", "worker": "quarantine",
                                   "owner": "q-1", "note": "XID-79 on GPU 0"}  # fmt: skip
    assert action.name == "workers.common"
    failed = next(r for r in caplog.records if r.getMessage() == "could not post Event")
    assert failed.levelno == logging.WARNING
    assert logs.fields(failed)["node"] == "n1"


def test_log_options_are_global_to_every_command() -> None:
    result = CliRunner().invoke(cli_app.app, ["--log-format", "console", "--log-level", "debug", "config", "show",
                                              "status"], env={"MONGODB_URI": "mongodb://x"})  # fmt: skip
    assert result.exit_code == 0, result.output
    root = logging.getLogger()
    assert len([h for h in root.handlers if isinstance(h.formatter, logs.ConsoleFormatter)]) == 1
    assert root.level == logging.DEBUG
    result = CliRunner().invoke(cli_app.app, ["--log-format", "xml", "config", "show", "status"])
    assert result.exit_code == 2


def test_a_component_logs_its_settings_as_json_lines_in_a_pod() -> None:
    """stderr is not a terminal (a pod): JSON lines by default; at debug level the start-up line names each
    setting that is not a default and where it came from, with the secret masked."""
    argv = [sys.executable, "-m", "faultline", "worker", "quarantine", "--rules", "/nonexistent/rules.yaml",
            "--lease", "9s"]  # fmt: skip
    env = {**os.environ, "MONGODB_URI": "mongodb://admin:hunter2@db", "FAULTLINE_LOG_LEVEL": "debug"}
    env.pop("FAULTLINE_LOG_FORMAT", None)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 2  # the rules file is missing: a configuration error, after the line below
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    start = next(line for line in lines if line["event"] == "settings")
    assert (start["level"], start["logger"], start["component"]) == ("debug", "cli.options", "quarantine")
    assert start["settings"] == {
        "lease": "9s",
        "mongodb_uri": "**********",
        "rules": "/nonexistent/rules.yaml",
    }
    assert start["sources"] == {"lease": "flag --lease", "mongodb_uri": "env MONGODB_URI",
                                "rules": "flag --rules"}  # fmt: skip
    assert "hunter2" not in done.stderr
