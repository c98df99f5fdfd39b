"""False alarms of the cluster analyzer's GPU anomaly scores on healthy simulated telemetry, and how fast
they see a drift, with the scores' default settings (`faultline.config.analyzer.ANOMALY_FIELDS`).

    python benchmarks/anomaly.py                                  # 200 GPUs x 7 days, a sample a minute
    python benchmarks/anomaly.py --gpus 50 --days 2               # a quicker look
    python benchmarks/anomaly.py --temperature                    # temperature scored too (off by default)

Healthy telemetry, per GPU (seeded): counters that rise as Poisson arrivals at a rate of the GPU's own,
modulated by its load (jobs of 1 to 12 hours, busy or idle): correctable ECC errors (seven in ten GPUs
none, the others a log-normal rate around 2 an hour, up to a few dozen), PCIe replays and NVLink CRC
errors and replays (most GPUs none, some a few an hour), NVLink recoveries, remapped rows and retired
pages (rare: about one a month); the node reboots about once a week (every volatile counter back at 0,
a new boot id); temperature follows the load (idle about 38 C, busy 65 to 80 C) with noise. Every
sample goes through `patterns.anomaly.Models` in time order, as the analyzer's partitions take them;
the GPU-ANOMALY faults opened are false alarms.

`--drifting` more GPUs are healthy like the others until a random time after their first day, from
which their correctable ECC rate climbs by `--drift` an hour every hour (what precedes row remapping and
uncorrectable errors): how many raise GPU-ANOMALY-ECC-SBE-VOLATILE and how long after the drift began.

Events/s is the models' own rate (one process, one thread), the analyzer's per-sample cost beside its
windows; the dataflow's and the store's cost are benchmarks/analyzer.py's.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from faultline.config.analyzer import ANOMALY_FIELDS
from patterns import anomaly

T0 = 1_800_000_000.0
HOUR = 3600.0
RARE = 1 / (30 * 24)  # an hour: about once a month


@dataclass
class SimGpu:
    name: str
    rates: dict[str, float]  # counter -> healthy rate per hour at full load
    drift_at: float | None = None  # when its correctable ECC rate starts climbing (drifting GPUs)
    counters: dict[str, int] = field(default_factory=dict)
    boot: int = 0
    busy: bool = False
    job_end: float = 0.0
    busy_temp: float = 70.0


def healthy_rates(rng: random.Random) -> dict[str, float]:
    def some(p_none: float, median: float, cap: float) -> float:
        return 0.0 if rng.random() < p_none else min(rng.lognormvariate(math.log(median), 1.0), cap)

    return {
        "ecc_sbe_volatile": some(0.7, 2.0, 40.0),
        "pcie_replay": some(0.8, 2.0, 30.0),
        "nvlink_crc": some(0.8, 3.0, 30.0),
        "nvlink_replay": some(0.85, 2.0, 20.0),
        "nvlink_recovery": RARE,
        "remapped_rows_correctable": RARE,
        "retired_pages_sbe": RARE,
    }


def poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    n, p, limit = 0, 1.0, math.exp(-mean)
    while True:
        p *= rng.random()
        if p <= limit:
            return n
        n += 1


def telemetry(
    gpus: list[SimGpu], days: float, interval: float, drift: float, rng: random.Random
) -> Iterator[anomaly.Sample]:
    """Every GPU's samples in time order (as the feed gives them), each GPU's at its own phase."""
    end = T0 + days * 86400
    queue = [(T0 + rng.random() * interval, i) for i in range(len(gpus))]
    heapq.heapify(queue)
    position = 0
    while queue:
        t, i = heapq.heappop(queue)
        if t >= end:
            continue
        g = gpus[i]
        if t >= g.job_end:  # the next job, or idle time
            g.busy = rng.random() < 0.7
            g.job_end = t + rng.uniform(1, 12) * HOUR
            g.busy_temp = rng.uniform(65, 80)
        if rng.random() < interval / (7 * 86400):  # a reboot: volatile counters restart
            g.boot += 1
            g.counters = {}
        load = 1.0 if g.busy else 0.2
        for name, r in g.rates.items():
            rate = r * load
            if name == "ecc_sbe_volatile" and g.drift_at is not None and t > g.drift_at:
                rate += drift * (t - g.drift_at) / HOUR
            g.counters[name] = g.counters.get(name, 0) + poisson(rng, rate * interval / HOUR)
        temperature = (g.busy_temp if g.busy else 38.0) + rng.gauss(0, 1.5)
        values = (*((n, float(v)) for n, v in g.counters.items()), ("temperature", round(temperature)))
        position += 1
        yield (g.name, position, t, f"node-{i // 8}", str(g.boot), f"e{position}", values)
        heapq.heappush(queue, (t + interval, i))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=200, help="healthy GPUs")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between a GPU's samples")
    parser.add_argument("--drifting", type=int, default=20, help="GPUs whose correctable ECC rate drifts")
    parser.add_argument("--drift", type=float, default=20.0, help="the drift: errors/h more every hour")
    parser.add_argument("--warmup", type=int, default=30, help="samples learned before a score raises")
    parser.add_argument("--temperature", action="store_true", help="score temperature too")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    gpus = [SimGpu(f"GPU-{i}", healthy_rates(rng)) for i in range(args.gpus)]
    for i in range(args.drifting):
        at = T0 + 86400 + rng.random() * max(0.0, args.days - 1.5) * 86400
        gpus.append(SimGpu(f"GPU-drift-{i}", healthy_rates(rng), drift_at=at))
    fields = dict(ANOMALY_FIELDS)
    if args.temperature:
        fields["temperature"] = fields["temperature"].model_copy(update={"enabled": True})
    settings = anomaly.Settings(fields, warmup=args.warmup, expire=7 * 86400.0)
    models = anomaly.Models(settings)
    enabled = settings.enabled()

    false_alarms: dict[str, int] = {}
    detected: dict[str, float] = {}  # drifting GPU -> hours from the drift's start to its fault
    samples = 0
    started = time.perf_counter()
    drift_at = {g.name: g.drift_at for g in gpus}
    for sim in telemetry(gpus, args.days, args.interval, args.drift, rng):
        s = (*sim[:6], tuple((n, v) for n, v in sim[6] if n in enabled))  # as the router hands them on
        samples += 1
        for f in models.add(s):
            if f.resolved:
                continue
            at = drift_at.get(f.gpu)
            if at is not None and f.field == "ecc_sbe_volatile" and f.t > at:
                detected.setdefault(f.gpu, (f.t - at) / HOUR)
            else:
                false_alarms[f.field] = false_alarms.get(f.field, 0) + 1
    elapsed = time.perf_counter() - started

    gpu_days = args.gpus * args.days + args.drifting * args.days
    alarms = sum(false_alarms.values())
    print(f"anomaly scores: {len(gpus)} GPUs x {args.days:g} days, a sample every {args.interval:g} s "
          f"({samples:,} samples; fields: {', '.join(enabled)}; warm-up {args.warmup} samples)")  # fmt: skip
    print(f"  false alarms: {alarms} ({alarms / gpu_days:.4f} per GPU-day, {alarms / samples:.2e} per sample)"
          + (f" by field: {false_alarms}" if false_alarms else ""))  # fmt: skip
    if args.drifting:
        delays = sorted(detected.values())
        median = f", {statistics.median(delays):.1f} h after the drift began (median)" if delays else ""
        print(f"  drifting GPUs raised: {len(detected)} of {args.drifting}{median}")
    print(f"  {samples / elapsed:,.0f} samples/s ({elapsed:.1f} s, one thread; "
          f"{samples * len(enabled) / elapsed:,.0f} field updates/s)")  # fmt: skip


if __name__ == "__main__":
    main()
