"""Issue 14's corpus (tests/corpus): every fault family detected in every log format, with its code,
fatal, action and entity; multi-line records joined in each format's own way; user-space lines that
look like the kernel's never a fault, and counted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dataflows import replay
from patterns import compiler
from sources import files, formats
from tests.corpus import corpus

FIXED_TIME = ["--year", str(corpus.YEAR), "--boot-time", "2026-12-01T09:00:00"]
WRITERS = {w.name: w for w in corpus.WRITERS}


def test_the_committed_files_are_what_the_corpus_module_writes() -> None:
    for writer in corpus.WRITERS:
        path = corpus.LOGS / corpus.file_of(writer)
        assert path.read_bytes() == corpus.render(writer), f"{path} is stale: python -m tests.corpus.corpus"


@pytest.fixture(scope="module")
def result(builtin: compiler.CompiledPacks) -> replay.ReplayResult:
    inputs = files.sniff_all(
        files.expand_paths([str(corpus.LOGS)]), year=corpus.YEAR, boot_time=float(corpus.BOOT)
    )
    assert not inputs.errors
    return replay.run(inputs.groups(), builtin)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_every_family_in_every_format(result: replay.ReplayResult, fmt: str) -> None:
    writer = WRITERS[fmt]
    got = {
        (f.entity.type, f.entity.id, f.code, f.fatal, f.action.value)
        for f in result.faults
        if f.node == corpus.node_of(writer)
    }
    assert got == corpus.expected(writer)


def test_counts_and_joined_messages(result: replay.ReplayResult) -> None:
    by_key = {(f.node, f.entity.id, f.code): f for f in result.faults}
    for writer in corpus.WRITERS:
        node = corpus.node_of(writer)
        assert by_key[(node, "0000:56:00.0", "NIC-REG-ACCESS-FAILED")].count == 5  # its threshold
        fallen = by_key[(node, "0000:b3:00", "GPU-FELL-OFF-BUS")]
        assert fallen.count == 1
        assert "installed in this system has fallen off the bus" in fallen.message
        xid13 = by_key[(node, "0000:b1:00", "XID-13")]
        assert xid13.description.startswith("Graphics/SM exception on GPC 1, TPC 3")
        assert "link hardware suspected" in by_key[(node, "0000:ba:00", "XID-74")].description


def test_spoofed_lines_are_never_a_fault_and_are_counted(result: replay.ReplayResult) -> None:
    assert not [f for f in result.faults if f.entity.id in corpus.SPOOFED_ENTITIES]
    with_origin = [w for w in corpus.WRITERS if w.origin]
    assert result.stats.untrusted == len(corpus.SPOOFED) * len(with_origin)


def test_cli_summary_names_untrusted_lines() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "faultline", "replay", str(corpus.LOGS), "--output", "jsonl", *FIXED_TIME],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    spoofs = len(corpus.SPOOFED) * sum(1 for w in corpus.WRITERS if w.origin)
    assert f"untrusted kernel-looking lines {spoofs} (not written by the kernel)" in done.stderr
    nodes = {json.loads(line)["node"] for line in done.stdout.splitlines()}
    assert nodes == {corpus.node_of(w) for w in corpus.WRITERS}


def test_syslog_files_not_trusted_give_no_kernel_fault(
    builtin: compiler.CompiledPacks, result: replay.ReplayResult
) -> None:
    """The agent's default (`syslog_trusted` off): a syslog file's `kernel` tags are its writers' word, so its
    kernel-looking lines are all counted untrusted and none is a fault; the journal, kmsg and dmesg files
    conclude what they did. (The fixture replays as `faultline replay` does by default: tags believed.)"""
    inputs = files.sniff_all(
        files.expand_paths([str(corpus.LOGS)]), year=corpus.YEAR, boot_time=float(corpus.BOOT),
        syslog_trusted=False,
    )  # fmt: skip
    untrusted = replay.run(inputs.groups(), builtin)
    syslog = {
        corpus.node_of(WRITERS[n]) for n, source in formats.SOURCE_OF_FORMAT.items() if source == "syslog"
    }
    assert len(syslog) == 3  # rfc3164, iso, rfc5424
    assert not [f for f in untrusted.faults if f.node in syslog]
    assert [f.model_dump() for f in untrusted.faults] == [
        f.model_dump() for f in result.faults if f.node not in syslog
    ]
    assert untrusted.stats.untrusted > result.stats.untrusted


def test_one_and_two_workers_agree(builtin: compiler.CompiledPacks) -> None:
    inputs = files.sniff_all(
        files.expand_paths([str(corpus.LOGS)]), year=corpus.YEAR, boot_time=float(corpus.BOOT)
    )
    one = replay.run(inputs.groups(), builtin)
    two = replay.run(inputs.groups(), builtin, workers=2)
    assert [f.model_dump() for f in one.faults] == [f.model_dump() for f in two.faults]
