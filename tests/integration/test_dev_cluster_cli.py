"""`faultline dev cluster up` gives a cluster kubectl and pymongo can use; `down` stops every process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pymongo
import pytest

from devtools import procs, tools

pytestmark = pytest.mark.integration


def test_dev_cluster_up_then_down(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its own state file and work directory
    up = subprocess.Popen(
        [sys.executable, "-m", "faultline", "dev", "cluster", "up", "--nodes", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        lines: dict[str, str] = {}
        deadline = time.monotonic() + 120
        while len(lines) < 2 and time.monotonic() < deadline:
            line = up.stdout.readline()
            if not line:
                break
            if "=" in line and not line.startswith("#"):
                key, _, value = line.strip().partition("=")
                lines[key] = value
        assert set(lines) == {"KUBECONFIG", "MONGODB_URI"}, lines
        nodes = subprocess.run(
            [str(tools.binary("kubectl")), "get", "nodes", "-o", "name"],
            capture_output=True, text=True, check=True, env={**env, "KUBECONFIG": lines["KUBECONFIG"]},
        )  # fmt: skip
        assert nodes.stdout.split() == ["node/gpu-node-01", "node/gpu-node-02"]
        client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(lines["MONGODB_URI"])
        assert client.admin.command("ping")["ok"] == 1.0
        client.close()
        children = [
            pid
            for pid, _ in procs.pids_named(("etcd", "kube-apiserver", "ferretdb"))
            if _child_of(pid, up.pid)
        ]
        assert len(children) == 3
        down = subprocess.run(
            [sys.executable, "-m", "faultline", "dev", "cluster", "down"],
            capture_output=True, text=True, check=True, env=env, timeout=60,
        )  # fmt: skip
        assert down.stdout.startswith(f"stopped the dev cluster (pid {up.pid})")
        assert up.wait(30) == 0
        assert not [pid for pid in children if procs.alive(pid)]
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(30)
        if up.stdout is not None:
            up.stdout.close()


def _child_of(pid: int, parent: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat.split(")")[-1].split()[1]) == parent
