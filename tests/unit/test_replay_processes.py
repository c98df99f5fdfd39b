"""`faultline replay --processes N`: ranges of whole lines scanned in forked processes, detection here; the
same faults, statistics and diagnostics (line numbers included) as one process."""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import shutil
from pathlib import Path
from typing import Any

import pytest

from dataflows import replay, replay_processes
from patterns import compiler, loader
from sources import files

HERE = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def patient_regexes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A match that runs out of its 50 ms on a loaded machine (a thread not scheduled) would differ between
    the two runs compared here; what is compared is the cutting, so no match runs out of time (the forked
    processes inherit the setting)."""
    monkeypatch.setattr(compiler, "MATCH_TIMEOUT", 10.0)


@pytest.fixture(scope="module")
def compiled() -> compiler.CompiledPacks:
    return compiler.compile_packs(loader.load())


def _corpus(path: Path, lines: int) -> Path:
    spec = importlib.util.spec_from_file_location("gen_corpus", HERE / "benchmarks" / "gen_corpus.py")
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.large(path, lines, nodes=16, gpu_share=0.2)  # many faults: their order matters to the detectors
    return path


def _groups(*paths: Path) -> list[list[files.FileInfo]]:
    return files.sniff_all([str(p) for p in paths], year=2026).groups()


def _both(groups: list[list[files.FileInfo]], compiled: compiler.CompiledPacks) -> tuple[Any, Any]:
    one = replay.run(groups, compiled)
    many = replay_processes.run(groups, compiled, processes=2)
    return one, many


def test_a_file_cut_into_ranges_gives_what_one_process_gives(
    tmp_path: Path, compiled: compiler.CompiledPacks, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _corpus(tmp_path / "fleet.log", 40_000)
    long_line = "x" * (5 << 20)  # longer than a read: skipped, and named by its line number
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(31_000, long_line + "\n")  # an over-long line late in the file: its number must be right
    path.write_text("".join(lines))
    monkeypatch.setattr(replay_processes, "JOB_MIN_BYTES", 256 << 10)
    groups = _groups(path)
    jobs = replay_processes.plan(groups, 2)
    assert len(jobs) >= 3  # (cuts that fall in the long line all end after it)
    data = path.read_bytes()
    assert jobs[0].start == 0
    for job, following in itertools.pairwise(jobs):  # whole lines, no gap, no overlap
        assert job.end == following.start and data[following.start - 1 : following.start] == b"\n"
    one, many = _both(groups, compiled)
    assert len(one.faults) > 50
    assert [f.model_dump() for f in many.faults] == [f.model_dump() for f in one.faults]
    assert many.stats == one.stats
    assert many.counters == one.counters
    assert many.diags == one.diags == [f"{path}:31001: line longer than {files.MAX_LINE} bytes, skipped"]


def test_compressed_rotated_and_small_files_are_one_job_each(
    tmp_path: Path, compiled: compiler.CompiledPacks
) -> None:
    sample = HERE / "benchmarks" / "corpus" / "sample"
    shutil.copy(sample / "gpu-node-07.syslog", tmp_path / "syslog")
    shutil.copy(sample / "gpu-node-07.syslog.1", tmp_path / "syslog.1")
    with gzip.open(tmp_path / "syslog.2.gz", "wb") as fh:
        fh.write(_corpus(tmp_path / "big", 5_000).read_bytes())
    (tmp_path / "big").unlink()
    shutil.copy(sample / "gpu-node-05.dmesg", tmp_path / "node-05.dmesg")
    groups = _groups(
        tmp_path / "syslog", tmp_path / "syslog.1", tmp_path / "syslog.2.gz", tmp_path / "node-05.dmesg"
    )
    jobs = replay_processes.plan(groups, 2)
    assert len(jobs) == 4 and all(j.start == 0 and j.end is None for j in jobs)
    one, many = _both(groups, compiled)
    assert [f.model_dump() for f in many.faults] == [f.model_dump() for f in one.faults]
    assert many.stats == one.stats


def test_a_file_that_cannot_be_read_on_is_said_and_the_other_files_replay(
    tmp_path: Path, compiled: compiler.CompiledPacks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compressed file cut short (its reading ends in an error part of the way) and a file gone since it
    was sniffed: with one process and with two, the same diagnostic for each, what was read before the
    error kept, and the other file replayed whole, cut in ranges."""
    monkeypatch.setattr(replay_processes, "JOB_MIN_BYTES", 64 << 10)
    data = _corpus(tmp_path / "big", 20_000).read_bytes()
    (tmp_path / "big").unlink()
    whole = gzip.compress(data)
    (tmp_path / "cut.log.gz").write_bytes(whole[: len(whole) * 2 // 3])
    gone = tmp_path / "gone.log"
    shutil.copy(HERE / "benchmarks" / "corpus" / "sample" / "gpu-node-07.syslog", gone)
    (tmp_path / "kept.log").write_bytes(data)
    groups = _groups(tmp_path / "cut.log.gz", gone, tmp_path / "kept.log")
    gone.unlink()
    jobs = replay_processes.plan(groups, 2)
    assert [j.start for j in jobs if j.info.path == str(tmp_path / "cut.log.gz")] == [0]  # never cut
    assert len([j for j in jobs if j.info.path == str(tmp_path / "kept.log")]) > 2
    one, many = _both(groups, compiled)
    said = sorted(one.diags)
    assert [d.split(":")[0] for d in said] == [str(tmp_path / "cut.log.gz"), str(gone)]
    assert "rest skipped: Compressed file ended before the end-of-stream marker" in said[0]
    assert said[1].startswith(f"{gone}: read error, rest of file skipped: [Errno 2]")
    assert sorted(many.diags) == said
    assert [f.model_dump() for f in many.faults] == [f.model_dump() for f in one.faults]
    alone = replay.run(_groups(tmp_path / "kept.log"), compiled)
    assert len(alone.faults) > 50
    assert alone.stats.lines < one.stats.lines < 2 * alone.stats.lines  # the cut file's first part was read
    assert many.stats == one.stats
