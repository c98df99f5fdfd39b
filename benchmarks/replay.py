"""Replay throughput and memory, measured beside two baselines in the same run.

    python benchmarks/replay.py                   # 1M-line corpus: faultline vs grep vs a Python loop
    python benchmarks/replay.py --memory          # also: peak memory on a 20 MB and a large corpus
    python benchmarks/replay.py --memory --big-mb 2000
    python benchmarks/replay.py --startup --processes   # also: start-up, and 2 processes against 1

The corpus (benchmarks/gen_corpus.py `large`) is RFC 3164 from 64 hosts with ~3 % GPU/NIC lines, most of
them in floods.  The baselines use the same prefilter words faultline's packs compile to:
`grep -cE 'w1|w2|...'`, and a plain Python loop testing each line against one combined stdlib regex.
Goals (issue 2): >= 1,000,000 lines/s on one core, within 10x grep's time, flat memory.

`--startup`: the whole command on a 1,000-line file as installed (the project's modules byte-compiled
first, as the image ships them; a checkout run with PYTHONDONTWRITEBYTECODE set would compile them at each
start), best of 15 or `--runs`, beside the Python interpreter starting alone (goal: <= 0.3 s).
`--processes`: the same corpus of `--processes-lines` lines (16 million, 1.9 GB, by default: the start
and the planning of the ranges are serial, so a small corpus measures them) replayed by one process and by
`--processes-n` (`--processes`), alternated, best of `--runs` each: the whole command's seconds and the
scan-and-detect seconds the summary line gives (goal: >= 1.8x on 2 cores), and the faults of both
compared (they must be the same).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen_corpus  # noqa: E402

OUT = HERE / "out"
R = TypeVar("R")
PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
    "sys.stderr.write(rc.stderr)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(rc.returncode)\n"
)


def corpus(lines: int) -> Path:
    path = OUT / f"corpus-{lines}.log"
    if not path.exists():
        started = time.perf_counter()
        gen_corpus.large(path, lines)
        print(
            f"generated {path.name} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s"
        )
    return path


def corpus_of_size(megabytes: int) -> Path:
    """A corpus from 8 hosts: its set of possible faults is covered within the first megabytes, so a
    bigger one differs only in length (what a streaming replay must not pay for)."""
    path = OUT / f"corpus-8hosts-{megabytes}MB.log"
    if not path.exists():
        lines = megabytes * 1_000_000 // 120
        gen_corpus.large(path, lines, nodes=8)
    return path


def literals() -> list[str]:
    from patterns import compiler, loader  # noqa: PLC0415

    return compiler.compile_packs(loader.load()).literals


def replay(path: Path, processes: int = 1, faults: Path | None = None) -> tuple[float, float, int, str]:
    """(wall seconds, dataflow lines/s, peak RSS KiB, summary line) of `faultline replay` (its faults, as
    JSON lines, written to `faults` when given)."""
    cmd = [sys.executable, "-m", "faultline", "replay", str(path), "--output", "jsonl", "--year", "2026",
           "--no-progress", "--processes", str(processes)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, *cmd], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    if faults is not None:  # the child's stdout went to /dev/null: run it again for them, untimed
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        faults.write_text(out)
    summary = done.stderr.strip().splitlines()[-1]
    m = re.search(r"([\d,]+) lines/s", summary)
    rate = float(m.group(1).replace(",", "")) if m else 0.0
    return wall, rate, int(done.stdout.strip()), summary


PACKAGES = ("cli", "dataflows", "faultline", "patterns", "sinks", "sources", "workers")


def byte_compile() -> None:
    """The project's modules compiled as the image does (`compileall`): what an installed command reads."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", *PACKAGES], cwd=HERE.parent, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def startup(path: Path | None) -> tuple[float]:
    """Wall seconds of the whole `faultline replay` command on `path`, timed directly (no wrapper process
    for the peak RSS, whose own start would count); None: the interpreter starting alone (`-c pass`)."""
    cmd = [sys.executable, "-c", "pass"] if path is None else [
        sys.executable, "-m", "faultline", "replay", str(path), "--output", "jsonl", "--year", "2026",
        "--no-progress",
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True)
    return (time.perf_counter() - started,)


def grep(path: Path, words: list[str]) -> tuple[float, int]:
    pattern = "|".join(re.escape(w) for w in words)
    started = time.perf_counter()
    done = subprocess.run(["grep", "-cE", pattern, str(path)], capture_output=True, text=True, check=False)
    return time.perf_counter() - started, int(done.stdout.strip() or 0)


def python_loop(path: Path, words: list[str]) -> tuple[float, int]:
    combined = re.compile("|".join(re.escape(w) for w in words))
    search = combined.search
    started = time.perf_counter()
    hits = 0
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if search(line):
                hits += 1
    return time.perf_counter() - started, hits


def best(fn: Callable[..., R], *args: Any, runs: int = 3) -> R:
    """The fastest of `runs` runs (results are tuples whose first item is seconds)."""
    results = [fn(*args) for _ in range(runs)]
    return min(results, key=lambda r: r[0])  # type: ignore[index]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--memory", action="store_true", help="compare peak memory on a small and a large corpus"
    )
    parser.add_argument("--big-mb", type=int, default=400, help="size of the large corpus for --memory")
    parser.add_argument("--startup", action="store_true", help="the whole command on a 1,000-line file")
    parser.add_argument("--processes", action="store_true", help="one process against --processes-n")
    parser.add_argument("--processes-n", type=int, default=2)
    parser.add_argument("--processes-lines", type=int, default=16_000_000)
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    path = corpus(args.lines)
    words = literals()
    n_lines = args.lines
    g_time, g_hits = best(grep, path, words, runs=args.runs)
    p_time, p_hits = best(python_loop, path, words, runs=1)
    r_wall, r_rate, r_rss, summary = best(replay, path, runs=args.runs)
    print(f"corpus: {n_lines:,} lines, {path.stat().st_size / 1e6:.0f} MB, {g_hits:,} prefilter lines "
          f"({100 * g_hits / n_lines:.1f} %), {os.cpu_count()} cores, best of {args.runs}")  # fmt: skip
    print(f"{'run':<44}{'seconds':>10}{'lines/s':>14}{'vs grep':>10}")
    rows = [
        ("grep -cE <prefilter words>", g_time, n_lines / g_time),
        ("python loop, one combined re", p_time, n_lines / p_time),
        ("faultline replay (whole command)", r_wall, n_lines / r_wall),
        ("faultline replay (dataflow only)", n_lines / r_rate if r_rate else 0.0, r_rate),
    ]
    for name, secs, rate in rows:
        print(f"{name:<44}{secs:>10.3f}{rate:>14,.0f}{secs / g_time:>9.1f}x")
    print(f"faultline summary: {summary}")
    print(f"faultline peak RSS: {r_rss / 1024:.0f} MiB")
    assert p_hits == g_hits, "baselines disagree on the prefilter lines"
    verdict = {
        "lines_per_s_dataflow": r_rate,
        "lines_per_s_command": n_lines / r_wall,
        "x_grep_command": r_wall / g_time,
        "goal_1M_lines_per_s": r_rate >= 1_000_000,
        "goal_within_10x_grep": r_wall <= 10 * g_time,
    }
    if args.memory:
        small = corpus_of_size(20)
        big = corpus_of_size(args.big_mb)
        _, _, small_rss, small_summary = replay(small)
        _, _, big_rss, big_summary = replay(big)
        print(f"20 MB corpus (8 hosts): peak RSS {small_rss / 1024:.1f} MiB; {small_summary}")
        print(f"{args.big_mb} MB corpus (8 hosts): peak RSS {big_rss / 1024:.1f} MiB; {big_summary}")
        verdict["rss_small_mib"] = small_rss / 1024
        verdict["rss_big_mib"] = big_rss / 1024
        verdict["goal_flat_memory"] = big_rss <= small_rss * 1.05
    if args.startup:
        small_path = corpus(1000)
        byte_compile()
        start_wall = best(startup, small_path, runs=max(15, args.runs))[0]
        python_wall = best(startup, None, runs=max(15, args.runs))[0]
        print(f"start-up: the whole command on 1,000 lines: {start_wall:.3f} s (goal <= 0.3 s); "
              f"the interpreter alone: {python_wall:.3f} s")  # fmt: skip
        verdict["startup_s"] = start_wall
        verdict["python_startup_s"] = python_wall
        verdict["goal_startup"] = start_wall <= 0.3
    if args.processes:
        big_path = corpus(args.processes_lines)
        n = args.processes_n
        one: list[tuple[float, float]] = []
        many: list[tuple[float, float]] = []
        for _ in range(args.runs):  # alternated: both see the same machine
            wall, rate, _, _ = replay(big_path, 1)
            one.append((wall, args.processes_lines / rate))
            wall, rate, _, _ = replay(big_path, n)
            many.append((wall, args.processes_lines / rate))
        replay(big_path, 1, OUT / "faults-1.jsonl")
        replay(big_path, n, OUT / f"faults-{n}.jsonl")
        same = (OUT / "faults-1.jsonl").read_text() == (OUT / f"faults-{n}.jsonl").read_text()
        w1, d1 = min(one)[0], min(d for _, d in one)
        wn, dn = min(many)[0], min(d for _, d in many)
        print(
            f"{args.processes_lines:,} lines ({big_path.stat().st_size / 1e6:.0f} MB), best of {args.runs}:"
        )
        print(f"  1 process:   {w1:.2f} s whole command, {d1:.2f} s scan and detect")
        print(f"  {n} processes: {wn:.2f} s whole command, {dn:.2f} s scan and detect")
        print(f"  speed-up {w1 / wn:.2f}x whole command, {d1 / dn:.2f}x scan and detect (goal >= 1.8x); "
              f"faults {'the same' if same else 'DIFFERENT'}")  # fmt: skip
        verdict.update(processes=n, speedup_command=w1 / wn, speedup_scan=d1 / dn, same_faults=same,
                       goal_processes=w1 / wn >= 1.8)  # fmt: skip
    print(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
