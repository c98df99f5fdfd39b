"""The fleet benchmark's plan: a size whose steady load alone, from the CPU per node measured at the
largest size run before it, would take the machine is not run, and the table says why beside the sizes
that were."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2]


def _fleet() -> Any:
    spec = importlib.util.spec_from_file_location("fleet_bench", HERE / "benchmarks" / "fleet.py")
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _run(size: int, cpu_ms_per_min: dict[str, float], agents: int | None = None) -> dict[str, Any]:
    per_node: dict[str, Any] = {"store connections (agents)": 2.0}
    per_node.update({f"CPU ms/min {k}": v for k, v in cpu_ms_per_min.items()})
    if agents is not None:
        per_node = dict.fromkeys(per_node)
    whole = {
        "agents": size if agents is None else agents,
        "fault -> cordon p99 ms": 444.0,
        "cores": {k: v * size / 60_000 for k, v in cpu_ms_per_min.items()},
    }
    return {"size": size, "per_node": per_node, "whole": whole, "note": None}


# the CPU per node a minute at 5,000 nodes on 2 cores, as the benchmarks page's 2026-12-06 run measured it
# (0.46 + 0.29 + 0.26 + 0.07 = 1.08 cores in all)
CPU_5K = {"agents": 5.52, "FerretDB": 3.48, "PostgreSQL": 0.0, "kube-apiserver": 3.12, "quarantine": 0.84}


def test_a_size_whose_every_agent_would_take_the_machine_runs_the_agents_that_fit_and_says_why() -> None:
    fleet = _fleet()
    runs = [_run(1000, {k: v * 1.5 for k, v in CPU_5K.items()}), _run(5000, CPU_5K)]
    assert round(fleet.cores_needed(runs[1], 5000), 2) == 1.08
    agents, note = fleet.plan(runs, 10_000, cores=2)
    # from the largest size run whole (5,000), not the first: 12.96 ms/min a node times 10,000 = 2.16
    # cores; three quarters of 2 carry 6,944 agents, in whole processes of 1,000
    assert agents == 6000
    assert note.startswith("6,000 agents simulated")
    assert "2.16 cores" in note and "at 5,000 nodes" in note and "this machine has 2" in note
    assert fleet.plan(runs, 6000, cores=2) == (6000, None)  # 1.30 cores: within three quarters of 2
    assert fleet.plan(runs, 10_000, cores=16) == (10_000, None)  # a machine with the cores runs them all
    assert fleet.plan([], 10_000, cores=2) == (10_000, None)  # nothing measured yet: the first size whole
    # a size run in part is no base for the next: its per-node costs are not known
    assert fleet.plan([*runs, _run(10_000, CPU_5K, agents=6000)], 6000, cores=2) == (6000, None)
    agents, note = fleet.plan(runs, 200_000, cores=2)  # not even the storm's 10,000 nodes fit
    assert agents == 0 and note.startswith("not run: its steady load with every agent needs 43.20 cores")


def test_the_table_keeps_every_size_and_leaves_out_the_per_node_costs_of_one_run_in_part() -> None:
    fleet = _fleet()
    runs = [_run(1000, CPU_5K), _run(5000, CPU_5K)]
    agents, note = fleet.plan(runs, 10_000, cores=2)
    runs.append({**_run(10_000, CPU_5K, agents=agents), "note": note})
    table = fleet._table(runs).splitlines()
    assert table[0].split() == ["per", "node", "1,000", "5,000", "10,000"]
    cpu = next(line for line in table if "CPU ms/min agents" in line)
    assert cpu.split()[-3:] == ["5.52", "5.52", "-"]
    assert next(line for line in table if line.startswith("  agents ")).split()[-3:] == [
        "1000",
        "5000",
        "6000",
    ]
    p99 = next(line for line in table if "fault -> cordon p99 ms" in line)
    assert p99.split()[-3:] == ["444", "444", "444"]
    assert table[-1].startswith("  10,000 nodes: 6,000 agents simulated")
