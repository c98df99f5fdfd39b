"""`faultline demo` as a newcomer runs it (its output not a terminal: plain lines): the whole chart on the
local cluster, the four scripted cases with their timeline, in time, and nothing left behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from devtools import procs, tools
from devtools.demo import CHART, DEMO_VALUES, store_values

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
SCENARIO_LIMIT_S = 180.0  # the bound for the scenario on a warm machine
ALL_STEPS = ("detected", "quarantined", "drained", "repair_requested", "rebooted", "validated", "released")


def _timeline(output: str, code: str) -> tuple[dict[str, float], str]:
    """The `timeline CODE NODES step=seconds ... verdict` line of one case: its steps and the whole line."""
    line = next(ln for ln in output.splitlines() if ln.startswith(f"timeline {code} "))
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}, line


def test_the_demo_values_reach_every_settings_file(tmp_path: Path) -> None:
    """The chart, rendered with the demo's values, gives every component a settings file its model reads,
    with the demo's tuning in it (the demo changes settings, never code)."""
    from cli import settings  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({**DEMO_VALUES, **store_values("mongodb://127.0.0.1:1/")}))
    tools.ensure("helm")
    argv = [str(tools.binary("helm")), "template", "faultline", str(CHART),
            "--namespace", "faultline-system", "-f", str(values)]  # fmt: skip
    rendered = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered)
            if d and d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})]  # fmt: skip
    resolved = {}
    for doc in docs:
        component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
        path = tmp_path / f"{component}.yaml"
        path.write_text(doc["data"]["config.yaml"])
        env = {"MONGODB_URI": "mongodb://127.0.0.1:1/", "NODE_NAME": "gpu-node-01"}
        resolved[component] = settings.resolve(
            config.COMPONENTS[component], config_file=path, environ=env
        ).config
    assert set(resolved) == {
        "agent",
        "quarantine",
        "drain",
        "remediation",
        "janitor",
        "chart-secrets",
        "retention",
    }
    assert resolved["agent"].gpu_backend == "sim"  # type: ignore[attr-defined]
    assert resolved["agent"].nic_interval == 0.2  # type: ignore[attr-defined]
    assert resolved["quarantine"].hold_down.total_seconds() == 3  # type: ignore[attr-defined]
    assert resolved["quarantine"].breaker_max_share == 0.7  # type: ignore[attr-defined]
    assert resolved["quarantine"].breaker_max_held_share == 0.7  # type: ignore[attr-defined]
    assert resolved["drain"].gpu_only is True  # type: ignore[attr-defined]
    assert resolved["janitor"].service_account == "faultline-repair"  # type: ignore[attr-defined]


def _run_demo(*args: str) -> tuple[str, float, float]:
    """`python -m faultline demo ARGS` to its end; checks the four cases' timelines and that everything
    it started is stopped and its directory removed. Returns its output and the scenario's and setup's
    seconds."""
    done = subprocess.run(
        [sys.executable, "-m", "faultline", "demo", *args],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    output = done.stdout
    assert done.returncode == 0, f"demo failed ({done.returncode}):\n{output[-6000:]}\n{done.stderr[-3000:]}"
    assert "simulated nodes execute no pod" in output  # it says how the chart's components run

    scenario = re.search(r"^scenario: completed in ([\d.]+) s \(setup ([\d.]+) s\)$", output, re.M)
    assert scenario, output[-3000:]
    assert float(scenario.group(1)) < SCENARIO_LIMIT_S

    xid79, line = _timeline(output, "XID-79")
    assert set(ALL_STEPS) <= xid79.keys(), line
    assert [xid79[s] for s in ALL_STEPS] == sorted(xid79[s] for s in ALL_STEPS), line  # in order
    xid13, line = _timeline(output, "XID-13")
    assert "detected" in xid13 and "quarantined" not in xid13, line
    assert "cordoned: none" in line, line
    nvswitch, line = _timeline(output, "SXID-24007")
    assert {"detected", "quarantined"} <= nvswitch.keys(), line
    nic, line = _timeline(output, "NIC-LINK-FLAPPING")
    assert {"detected", "quarantined"} <= nic.keys(), line

    pids = re.search(r"processes: ([\d ]+) \(work directory (\S+)\)", output)
    assert pids, output[:3000]
    left = [int(p) for p in pids.group(1).split() if procs.alive(int(p))]
    assert not left, f"processes left behind: {left}"
    assert not Path(pids.group(2)).exists()
    print("\n".join(ln for ln in output.splitlines() if ln.startswith(("timeline ", "scenario: "))))
    return output, float(scenario.group(1)), float(scenario.group(2))


def test_the_demo_plays_every_case_in_time_and_leaves_nothing() -> None:
    started = time.monotonic()
    _, scenario, setup = _run_demo()
    print(f"demo: {time.monotonic() - started:.1f} s in all; scenario {scenario} s, setup {setup} s")


@pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)")
def test_the_demo_with_a_real_node_runs_the_charts_agent_as_a_real_pod() -> None:
    """As root (CI): a real kubelet node joins, the chart's agent DaemonSet pod runs there from the
    project's image and passes its readiness probe; the cases on the simulated nodes play as without."""
    defaults = [Path("/var/lib/faultline"), Path("/run/faultline")]  # the chart's agent hostPaths
    before = {p for p in defaults if p.exists()}
    output, _, _ = _run_demo("--real-node")
    _, line = _timeline(output, "REAL-NODE")
    assert re.search(r"pod faultline-agent-\w+ Ready after [\d.]+ s ok$", line), line
    assert {p for p in defaults if p.exists()} == before  # the real node is this machine: nothing left
