"""Real nodes without root: a clear refusal before anything starts (from the library and the CLI); the
state record a cleanup after a crash reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app as cli_app
from devtools import realnode_host
from devtools.cluster import LocalCluster
from faultline.errors import ConfigError


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode_host.os, "geteuid", lambda: 1000)


@pytest.mark.usefixtures("not_root")
def test_a_cluster_with_real_nodes_needs_root_and_starts_nothing_without(tmp_path: Path) -> None:
    cluster = LocalCluster(nodes=1, real_nodes=1, workdir=tmp_path)
    with pytest.raises(ConfigError, match="real nodes need root"):
        cluster.start()
    assert cluster.procs == []


@pytest.mark.usefixtures("not_root")
def test_dev_cluster_up_with_real_nodes_says_it_needs_root(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli_app.app, ["dev", "cluster", "up", "--real-nodes", "1"])
    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError)
    assert "real nodes need root" in str(result.exception)


def test_the_state_record_round_trips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode_host, "STATE_DIR", tmp_path)
    state = realnode_host.HostState(slot=7, workdir=str(tmp_path / "w"), addresses=["10.254.7.1"])
    state.existed = {"/run/containerd": False}
    state.save()
    again = realnode_host.HostState.load(tmp_path / "slot-7.json")
    assert again == state
    assert again.gateway == "10.89.7.1"
    assert realnode_host.node_ip(7, 0) == "10.254.7.1"
