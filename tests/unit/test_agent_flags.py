"""`faultline agent` without the CLI framework (`cli.flags`, `cli.agent.main`): the same flags give the same
settings as the full command line, bad flags are refused naming the flag, and `--help` still prints the
full command's help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import cli.agent
from cli import app as cli_app
from cli import flags
from faultline import config
from faultline.errors import ConfigError

BASE = ["--node", "n1", "--mongodb-uri", "mongodb://m:27017"]


def _through_typer(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> config.AgentConfig:
    seen: list[config.AgentConfig] = []
    monkeypatch.setattr(cli.agent, "run", seen.append)
    result = CliRunner().invoke(cli_app.app, ["agent", *args])
    assert result.exit_code == 0, result.output
    (cfg,) = seen
    return cfg


@pytest.mark.parametrize(
    "args",
    [
        BASE,
        [*BASE, "--pack", "/p1", "--pack=/p2", "--no-syslog-trusted", "--analyzer-feed", "--gpus=4"],
        [*BASE, "--gpu-poll-interval", "2s", "--gpu-backend", "sim", "--node", "n2", "--ingest-socket="],
        [*BASE, "--syslog-trusted", "--no-analyzer-feed", "--stall-timeout=90s", "--metrics-port", "0"],
        [*BASE, "--node", "-x", "--database=a=b", "--"],
    ],
    ids=["required", "repeated-and-bools", "last-wins-and-empty", "bools-and-durations", "dashes"],
)
def test_the_same_flags_give_the_same_settings(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    for name in [n for n in os.environ if n.startswith("FAULTLINE_")]:
        monkeypatch.delenv(name)
    lean = flags.resolve(config.AgentConfig, "agent", args)
    assert lean.config == _through_typer(monkeypatch, args)
    assert lean.sources["node"] == "flag --node"


def test_a_config_file_and_flags_over_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("node: from-file\ngpus: 2\nmongodb_uri: mongodb://f:27017\n")
    args = [f"--config={file}", "--gpus", "6"]
    lean = flags.resolve(config.AgentConfig, "agent", args)
    cfg = lean.config
    assert isinstance(cfg, config.AgentConfig)
    assert (cfg.node, cfg.gpus) == ("from-file", 6)
    assert (lean.sources["node"], lean.sources["gpus"]) == (f"file {file}", "flag --gpus")
    assert cfg == _through_typer(monkeypatch, args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus", "1"], "no such option '--bogus' for faultline agent"),
        (["n1"], "faultline agent takes options only, not 'n1'"),
        ([*BASE, "--", "n1"], "faultline agent takes options only, not 'n1'"),
        (["-n", "n1"], "no such option '-n'"),
        ([*BASE, "--node"], "option --node needs a value"),
        ([*BASE, "--syslog-trusted=yes"], "option --syslog-trusted takes no value"),
        ([*BASE, "--gpus", "many"], r"gpus: .*\(got 'many'\) \[flag --gpus\]"),
        ([*BASE, "--config"], "option --config needs a value"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        flags.resolve(config.AgentConfig, "agent", args)


def _faultline(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")} | (env or {})
    return subprocess.run([sys.executable, "-m", "faultline", *args], capture_output=True, text=True,
                          timeout=60, env=environ, check=False)  # fmt: skip


def test_the_entry_point_refuses_what_it_cannot_run() -> None:
    bad = _faultline("agent", "--bogus")
    assert bad.returncode == 2 and "error: no such option '--bogus' for faultline agent" in bad.stderr
    level: Any = _faultline("agent", *BASE, env={"FAULTLINE_LOG_LEVEL": "loud"})
    assert level.returncode == 2
    assert "FAULTLINE_LOG_LEVEL: 'loud' is not one of debug, info, warning, error" in level.stderr


def test_help_is_the_full_command_lines() -> None:
    shown = _faultline("agent", "--help", env={"COLUMNS": "250"})
    assert shown.returncode == 0 and "--node" in shown.stdout and "--no-syslog-trusted" in shown.stdout
