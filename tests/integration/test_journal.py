"""Following real journal files (written by systemd-journal-remote): the current boot before the agent
started, entries appended while following, and a restart from a cursor with no gap and no duplicate."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from devtools import procs
from patterns import compiler, loader
from sources import journal

pytestmark = pytest.mark.integration
REMOTE = Path("/lib/systemd/systemd-journal-remote")
BOOT = "4b1d3c2a9e8f4d7c8b6a5f4e3d2c1b0a"


def append(journal_file: Path, first: int, count: int, tmp: Path, *, boot: str = BOOT) -> None:
    """Write entries #first.. into a real journal file (journal-remote appends on later runs)."""
    now = int(time.time() * 1e6)
    records = [
        f"__REALTIME_TIMESTAMP={now + i}\n__MONOTONIC_TIMESTAMP={5_000_000 + i}\n_BOOT_ID={boot}\n"
        f"_HOSTNAME=gpu-node-09\n_TRANSPORT=kernel\nSYSLOG_FACILITY=0\nSYSLOG_IDENTIFIER=kernel\n"
        f"MESSAGE=NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, entry #{i}\n"
        for i in range(first, first + count)
    ]
    export = tmp / f"batch-{first}.export"
    export.write_text("\n".join(records) + "\n")
    subprocess.run([str(REMOTE), f"--output={journal_file}", str(export)], check=True, capture_output=True)


def numbers(entries: list[journal.Entry]) -> list[int]:
    return [int(e.record.message.rsplit("#", 1)[1]) for e in entries]


def collect(follower: journal.JournalFollower, want: int, timeout: float = 20) -> list[journal.Entry]:
    got: list[journal.Entry] = []

    def enough() -> bool:
        got.extend(follower.drain())
        return len(got) >= want

    procs.wait_for(f"{want} journal entries", enough, timeout)
    return got


@pytest.fixture
def journal_file(tmp_path: Path) -> Path:
    assert REMOTE.exists(), (
        "systemd-journal-remote is installed by .ci/run (Debian package systemd-journal-remote)"
    )
    assert shutil.which("journalctl"), "journalctl comes with systemd"
    return tmp_path / "remote.journal"


def test_follow_reads_the_boot_so_far_then_new_entries_then_resumes(
    journal_file: Path, tmp_path: Path
) -> None:
    append(journal_file, 0, 3, tmp_path)  # logged before the agent started
    follower = journal.JournalFollower(journal.command(file=journal_file))
    try:
        first = collect(follower, 3)
        append(journal_file, 3, 2, tmp_path)  # logged while following
        second = collect(follower, 2)
    finally:
        follower.stop()
    assert numbers(first + second) == [0, 1, 2, 3, 4]
    assert first[0].record.host == "gpu-node-09"
    assert first[0].record.boot == pytest.approx(first[0].record.ts - 5.0, abs=1e-3)
    cursor = second[0].cursor  # as if the agent stopped after entry #3

    append(journal_file, 5, 2, tmp_path)  # logged while the agent was down
    resumed = journal.JournalFollower(journal.command(file=journal_file, after=cursor))
    try:
        rest = collect(resumed, 3)
        time.sleep(0.5)
        rest += resumed.drain()
    finally:
        resumed.stop()
    assert numbers(rest) == [4, 5, 6]  # no gap, no duplicate


def test_parse_skips_non_entries() -> None:
    assert journal.parse("not json") is None
    assert journal.parse('{"MESSAGE": "no cursor"}') is None
    entry = journal.parse('{"__CURSOR": "s=1", "__REALTIME_TIMESTAMP": "2000000", "MESSAGE": "hi"}')
    assert entry is not None and (entry.cursor, entry.record.ts, entry.record.message) == ("s=1", 2.0, "hi")


def test_prefilter_hands_on_pattern_lines_and_each_chunks_last(journal_file: Path, tmp_path: Path) -> None:
    compiled = compiler.compile_packs(loader.load([], builtin=True), check_examples=False)
    now = int(time.time() * 1e6)
    records = [
        f"__REALTIME_TIMESTAMP={now + i}\n__MONOTONIC_TIMESTAMP={5_000_000 + i}\n_BOOT_ID={BOOT}\n"
        f"_HOSTNAME=gpu-node-09\n_TRANSPORT=kernel\nSYSLOG_FACILITY=0\nSYSLOG_IDENTIFIER=kernel\n"
        + (
            f"MESSAGE=NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, entry #{i}\n"
            if i % 3 == 0
            else f'MESSAGE=nfs: server "storage" OK \\ entry #{i}\n'
        )
        for i in range(31)
    ]
    records[-1] = records[-1].replace("MESSAGE=NVRM: Xid", "MESSAGE=noise, not NVRM: Xd")
    (tmp_path / "batch.export").write_text("\n".join(records) + "\n")
    subprocess.run([str(REMOTE), f"--output={journal_file}", str(tmp_path / "batch.export")], check=True,
                   capture_output=True)  # fmt: skip
    source = journal.JournalSource(file=journal_file, prefilter=compiled)
    assert source.prefilter is compiled  # the builtin literals are JSON-safe
    follower = journal.JournalFollower(source.argv(None), prefilter=source.prefilter)
    got: list[journal.Entry] = []
    try:
        procs.wait_for(
            "entry #30",
            lambda: bool(got.extend(follower.drain()) or (got and "#30" in got[-1].record.message)),
            20,
        )
    finally:
        follower.stop()
    xids = [n for n in numbers(got) if n % 3 == 0 and n != 30]
    assert xids == list(range(0, 30, 3))  # every line a pattern may match, in order
    assert numbers(got)[-1] == 30  # the last line of the chunk comes for its cursor
    assert len(got) < 20  # most noise was never parsed
    assert got[-1].cursor  # the snapshot position is the real last entry


def test_prefilter_is_off_for_unsafe_literals_and_binary_messages() -> None:
    class Packs:
        literals = ["NVRM: Xid"]

        def candidate_lines(self, data: bytes):  # type: ignore[no-untyped-def]
            start = 0
            for line in data.split(b"\n"):
                if b"NVRM: Xid" in line:
                    yield start, start + len(line)
                start += len(line) + 1

    unsafe = Packs()
    unsafe.literals = ['say "hi"']
    assert journal.JournalSource(prefilter=unsafe).prefilter is None
    assert journal.JournalSource(prefilter=Packs()).prefilter is not None
    follower = journal.JournalFollower(["true"], prefilter=Packs())
    try:
        chunk = b'{"MESSAGE":"a"}\n{"MESSAGE":"NVRM: Xid 79"}\n{"MESSAGE":"b"}\n{"MESSAGE":"c"}\n'
        assert follower._lines(chunk) == [b'{"MESSAGE":"NVRM: Xid 79"}', b'{"MESSAGE":"c"}']
        binary = chunk + b'{"MESSAGE":[78,86,255]}\n'
        assert follower._lines(binary) == binary.splitlines()  # cannot see into an array: all of it
        assert follower._lines(b"") == []
    finally:
        follower.stop()
