"""The chaos suite: faultline's closed loop on 52 simulated GPU nodes while its parts fail.

    python -m benchmarks.chaos                          # every scenario on both FerretDB backends
    python -m benchmarks.chaos --backend sqlite --scenario janitor-kill --scenario store-outage
    python -m benchmarks.chaos --outage 20              # the store outage for 20 s instead of 10 minutes
    python -m benchmarks.chaos --outage-backends postgresql   # the 10-minute outage on one backend only

On the local control plane (API server audit log on) and FerretDB (SQLite, then PostgreSQL), with a
real `faultline agent` on every node (simulated GPUs) and the four workers as `faultline worker`
processes, a steady load of non-fatal XIDs and one fatal XID 79 on half the nodes (a storm of them
around the fault's seeded moment): each scenario (devtools/chaos/plan.py) injects its fault, undoes it,
and measures against ground truth (devtools/chaos/truth.py): events lost, actions done more than once
(cordons and evictions from the API server's audit log, repair Jobs and RemediationRequests likewise,
cloud reboots from the provider fake), and the time from the recovery (or the last event) until every
node is as it should be. Goals: 0 lost, 0 duplicates, converged within 60 s. Prints one table, writes
benchmarks/out/chaos.json, exits 1 when a goal is missed.

Why real agents and not a lighter simulation: measured here, an agent starts on 0.6 s of CPU, holds
76 MiB and idles at 0.2 % of a core, so 52 of them fit this 2-core machine; and only a real agent
makes "SIGKILL mid-batch" and "store unreachable" test what runs in production (Bytewax recovery from
the last snapshot, the MongoDB sink's spool).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from devtools.chaos import harness, plan
from devtools.mongo import BACKENDS
from tests.fakes import cloud as fakes

OUT = Path(__file__).parent / "out" / "chaos.json"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="repeatable; default both")
    parser.add_argument(
        "--scenario", action="append", choices=list(plan.SCENARIOS), help="repeatable; default all"
    )
    parser.add_argument("--nodes", type=int, default=52)
    parser.add_argument("--outage", type=float, default=600.0, help="seconds the store is unreachable")
    parser.add_argument(
        "--outage-backends", action="append", choices=BACKENDS,
        help="run the store outage for --outage seconds on these backends only, 20 s on the others",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--keep-logs", type=Path, default=OUT.parent / "chaos-logs",
        help="the processes' logs of each scenario that misses a goal are copied here",
    )  # fmt: skip
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error("--nodes: at least 2")
    backends = args.backend or list(BACKENDS)
    scenarios = [plan.SCENARIOS[s] for s in args.scenario or plan.SCENARIOS]
    results: list[harness.Result] = []
    started = time.monotonic()
    for backend in backends:
        outage = args.outage if not args.outage_backends or backend in args.outage_backends else 20.0
        knobs = plan.Knobs.full(nodes=args.nodes, outage_s=outage, seed=args.seed)
        with fakes.FakeCloud() as cloud:
            creds = {"AWS_ACCESS_KEY_ID": fakes.AWS_KEY, "AWS_SECRET_ACCESS_KEY": fakes.AWS_SECRET}
            env = harness.Environment(knobs, backend, cloud, creds, keep_logs=args.keep_logs).start()
            try:
                for i, scenario in enumerate(scenarios):
                    result = harness.run(env, scenario, i)
                    results.append(result)
                    harness.say(harness.table([result]))
                    _save(args.out, results, knobs)
            finally:
                env.stop()
    took = (time.monotonic() - started) / 60
    print(f"\nchaos suite: {args.nodes} nodes, seed {args.seed}, {took:.0f} min")
    print(harness.table(results))
    print(f"(details: {args.out})")
    return 0 if all(r.goal_met for r in results) else 1


def _save(path: Path, results: list[harness.Result], knobs: plan.Knobs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    report = harness.report(results, knobs)
    report["knobs"] = dataclasses.asdict(knobs)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
