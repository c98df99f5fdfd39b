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


def _run(size: int, cpu_ms_per_min: dict[str, float]) -> dict[str, Any]:
    per_node = {
        "store connections (agents)": 2.0,
        **{f"CPU ms/min {k}": v for k, v in cpu_ms_per_min.items()},
    }
    whole = {"storm nodes/s": 42.3, "cores": {k: v * size / 60_000 for k, v in cpu_ms_per_min.items()}}
    return {"size": size, "per_node": per_node, "whole": whole}


# the CPU per node a minute measured at 5,000 nodes on 2 cores (the sizing page's 1.08 cores in all)
CPU_5K = {"agents": 5.52, "FerretDB": 3.48, "PostgreSQL": 0.0, "kube-apiserver": 3.12, "quarantine": 0.84}


def test_a_size_whose_steady_load_would_take_the_machine_is_not_run_and_the_reason_names_the_measurement() -> (
    None
):
    fleet = _fleet()
    runs = [_run(1000, {k: v * 1.5 for k, v in CPU_5K.items()}), _run(5000, CPU_5K)]
    assert round(fleet.cores_needed(runs[1], 5000), 2) == 1.08
    reason = fleet.too_big(runs, 10_000, cores=2)
    assert reason is not None
    # from the largest size run (5,000), not the first: 12.96 ms/min a node times 10,000
    assert "2.16 cores" in reason and "at 5,000 nodes" in reason and "this machine has 2" in reason
    assert fleet.too_big(runs, 6000, cores=2) is None  # 1.30 cores: within three quarters of 2
    assert fleet.too_big(runs, 10_000, cores=16) is None  # a machine with the cores runs it
    assert fleet.too_big([], 10_000, cores=2) is None  # nothing measured yet: the first size always runs


def test_the_table_keeps_the_sizes_that_ran_and_says_why_one_did_not() -> None:
    fleet = _fleet()
    runs = [_run(1000, CPU_5K), _run(5000, CPU_5K)]
    runs.append({"size": 10_000, "not_run": fleet.too_big(runs, 10_000, cores=2)})
    table = fleet._table(runs).splitlines()
    assert table[0].split() == ["per", "node", "1,000", "5,000", "10,000"]
    agents = next(line for line in table if "CPU ms/min agents" in line)
    assert agents.split()[-3:] == ["5.52", "5.52", "-"]
    storm = next(line for line in table if "storm nodes/s" in line)
    assert storm.split()[-3:] == ["42.3", "42.3", "-"]
    assert table[-1].startswith("  10,000 nodes not run: its steady load alone needs 2.16 cores")
