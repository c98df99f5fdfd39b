"""`faultline demo`'s pure parts: container paths mapped onto the demo's local mounts, the timeline lines
a machine reads, and `--real-node` refused by name when not root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app as cli_app
from cli import demo
from devtools.demo import _local
from devtools.demo_scenario import Case


def test_container_paths_map_onto_the_longest_mount() -> None:
    mounts = {"/etc/faultline/config": Path("/d/config"), "/host/sys": Path("/d/node/sys"),
              "/run/faultline": Path("/d/node/run/faultline")}  # fmt: skip
    assert _local("/etc/faultline/config/config.yaml", mounts) == Path("/d/config/config.yaml")
    assert _local("/host/sys", mounts) == Path("/d/node/sys")
    assert _local("/run/faultline/ingest.sock", mounts) == Path("/d/node/run/faultline/ingest.sock")
    assert _local("/host/system", mounts) == "/host/system"  # a prefix of a name is not a mount
    assert _local("500ms", mounts) == "500ms"


def test_timeline_lines_name_each_step_reached() -> None:
    full = Case("XID 79", ["gpu-node-01"], "XID-79", ("detected",), steps={"detected": 0.12, "repair requested": 3.0},
                ok=True)  # fmt: skip
    quiet = Case("XID 13", ["n2", "n3"], "XID-13", ("detected",), steps={"detected": 0.4}, check="cordoned: none",
                 ok=True)  # fmt: skip
    missed = Case("NIC", ["n6"], "NIC-LINK-FLAPPING", ("detected",), ok=False)
    assert demo.timeline_lines([full, quiet, missed]) == [
        "timeline XID-79 gpu-node-01 detected=0.1 repair_requested=3.0 ok",
        "timeline XID-13 n2,n3 detected=0.4 cordoned: none ok",
        "timeline NIC-LINK-FLAPPING n6  FAILED",
    ]


def test_real_node_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(cli_app.app, ["demo", "--real-node"])
    assert result.exit_code == 2
    assert "--real-node: real nodes need root" in result.output
