"""`faultline replay` end to end: the real CLI in a subprocess over the committed sample corpus and
over hand-made bad inputs; the dataflow with one and with two workers."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dataflows import replay
from patterns import compiler, loader
from sources import files

FIXED_TIME = ["--year", "2026", "--boot-time", "2026-11-30T00:00:00"]

# What the sample scenarios (benchmarks/gen_corpus.py) must produce, one row per fault:
# node, entity type, entity id, code, fatal, action, count, state.
EXPECTED = {
    # node-01: XID 13 x6 escalates at the 5th within an hour; the XID 45 flood is one fault of 40; the
    # 'fallen off the bus' twin of XID 79 is counted once (as the XID); link-downs inside the boot grace
    # are dropped; 4 down/up cycles in 8 minutes flap; the second boot resolves what a reboot repairs.
    ("gpu-node-01", "GPU", "0000:3a:00", "XID-13", True, "COMPONENT_RESET", 6, "resolved"),
    ("gpu-node-01", "GPU", "0000:5d:00", "XID-45", False, "NONE", 40, "resolved"),
    ("gpu-node-01", "GPU", "0000:9a:00", "XID-154", True, "RESTART_BM", 1, "resolved"),
    ("gpu-node-01", "GPU", "0000:9a:00", "XID-79", True, "RESTART_BM", 1, "resolved"),
    ("gpu-node-01", "NIC", "0000:0c:00.1", "NIC-LINK-DOWN", False, "NONE", 4, "resolved"),
    ("gpu-node-01", "NIC", "0000:0c:00.1", "NIC-LINK-FLAPPING", True, "CONTACT_SUPPORT", 2, "open"),
    # node-02: DBE then a row remap within 10 min; 154 decodes "Drain and Reset". The nvidia-smi reset
    # line after the uncontained error is user space's: no evidence, it resolves nothing (issue 14
    # item 6: a reset is confirmed by the janitor's record and the GPU backend's read, never a log line).
    ("gpu-node-02", "GPU", "0000:18:00", "XID-154", True, "COMPONENT_RESET", 1, "open"),
    ("gpu-node-02", "GPU", "0000:18:00", "XID-48", True, "COMPONENT_RESET", 1, "open"),
    ("gpu-node-02", "GPU", "0000:18:00", "XID-48-ROW-REMAP", True, "COMPONENT_RESET", 1, "open"),
    ("gpu-node-02", "GPU", "0000:18:00", "XID-63", False, "NONE", 1, "open"),
    ("gpu-node-02", "GPU", "0000:2a:00", "XID-45", False, "NONE", 1, "open"),
    ("gpu-node-02", "GPU", "0000:2a:00", "XID-95", True, "COMPONENT_RESET", 1, "open"),
    ("gpu-node-02", "GPU", "0000:ab:00", "XID-94", False, "RESTART_APP", 1, "open"),
    # node-03 (journal JSON): severity read from SXid lines; thermal end resolves thermal start.
    ("gpu-node-03", "GPU", "0000:ba:00", "XID-74", True, "COMPONENT_RESET", 1, "open"),
    ("gpu-node-03", "NVSWITCH", "0000:c1:00", "SXID-12021", False, "NONE", 1, "open"),
    ("gpu-node-03", "NVSWITCH", "0000:c1:00", "SXID-20009", False, "NONE", 1, "open"),
    ("gpu-node-03", "NVSWITCH", "0000:c2:00", "SXID-10004", False, "CONTACT_SUPPORT", 1, "resolved"),
    ("gpu-node-03", "NVSWITCH", "0000:c3:00", "SXID-24007", True, "RESTART_BM", 1, "open"),
    # node-04 (journal export)
    ("gpu-node-04", "GPU", "0000:3a:00", "PCIE-AER-FATAL", True, "RESTART_BM", 1, "open"),
    ("gpu-node-04", "GPU", "0000:5d:00", "XID-119", True, "COMPONENT_RESET", 2, "open"),
    ("gpu-node-04", "GPU", "0000:5d:00", "XID-154", True, "COMPONENT_RESET", 1, "open"),
    ("gpu-node-04", "GPU", "0000:db:00", "GPU-INIT-FAILED", True, "RESTART_BM", 1, "open"),
    # node-05 (dmesg, no host field: named after the file): NVLink5 severity from the line, i1 injected.
    ("gpu-node-05", "GPU", "0008:06:00", "XID-145", True, "COMPONENT_RESET", 1, "open"),
    ("gpu-node-05", "GPU", "0009:06:00", "XID-149", False, "NONE", 1, "open"),
    ("gpu-node-05", "GPU", "0018:06:00", "XID-146", False, "NONE", 1, "open"),
    # node-06 (kmsg, times since boot): 'fallen off the bus' with no XID is its own fault.
    ("gpu-node-06", "GPU", "0000:3a:00", "XID-64", True, "COMPONENT_RESET", 1, "open"),
    ("gpu-node-06", "GPU", "0000:ab:00", "GPU-FELL-OFF-BUS", True, "RESTART_BM", 1, "open"),
    # node-07 (RFC 5424, three rotated files, one gzipped)
    ("gpu-node-07", "NIC", "0000:5e:00.0", "NIC-MODULE-ERROR", False, "CONTACT_SUPPORT", 1, "open"),
    ("gpu-node-07", "NIC", "0000:5e:00.0", "PCIE-AER-FATAL", True, "RESTART_BM", 1, "open"),
    ("gpu-node-07", "NIC", "0000:5e:00.1", "NIC-CABLE-UNPLUGGED", False, "CONTACT_SUPPORT", 1, "resolved"),
}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "faultline", *args], capture_output=True, text=True, check=False, timeout=120
    )


def rows(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def key(d: dict[str, Any]) -> tuple[Any, ...]:
    return (
        d["node"],
        d["entity"]["type"],
        d["entity"]["id"],
        d["code"],
        d["fatal"],
        d["action"],
        d["count"],
        d["state"],
    )


def test_sample_corpus_gives_exactly_the_expected_faults(sample_dir: Path) -> None:
    done = cli("replay", str(sample_dir), "--output", "jsonl", *FIXED_TIME)
    assert done.returncode == 0, done.stderr
    faults = rows(done.stdout)
    assert {key(f) for f in faults} == EXPECTED
    assert len(faults) == len(EXPECTED)
    by_code = {(f["node"], f["code"]): f for f in faults}
    xid79 = by_code["gpu-node-01", "XID-79"]
    assert (xid79["first_seen"], xid79["last_seen"], xid79["resolved_at"]) == (
        "2026-11-30T10:00:00Z", "2026-11-30T10:00:00Z", "2026-11-30T10:30:00Z"
    )  # fmt: skip
    assert by_code["gpu-node-06", "XID-64"]["first_seen"] == "2026-11-30T01:00:05Z"  # boot + 3605 s
    assert set(faults[0]) >= {"node", "entity", "code", "fatal", "action", "count", "first_seen", "last_seen"}
    assert "lines read 3,139 in 9 file(s)" in done.stderr
    assert "skipped 0 as unparseable" in done.stderr


def test_table_output_and_summary(sample_dir: Path) -> None:
    done = cli("replay", str(sample_dir), *FIXED_TIME)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{len(EXPECTED)} fault(s)")
    for header in (
        "node",
        "entity",
        "code",
        "fatal",
        "action",
        "count",
        "first seen",
        "last seen",
        "description",
    ):
        assert header in done.stdout
    assert "GPU 0000:9a:00" in done.stdout and "GPU fell off the bus" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("lines read 3,139 in 9 file(s); skipped 0")


def run_flow(sample_dir: Path, workers: int) -> list[str]:
    compiled = compiler.compile_packs(loader.load())
    inputs = files.sniff_all(files.expand_paths([str(sample_dir)]), year=2026, boot_time=1_764_460_800.0)
    result = replay.run(inputs.groups(), compiled, workers=workers)
    return [f.model_dump_json() for f in result.faults]


def test_one_and_two_workers_give_identical_faults(sample_dir: Path) -> None:
    one = run_flow(sample_dir, 1)
    two = run_flow(sample_dir, 2)
    assert len(one) == len(EXPECTED)
    assert one == two


def test_cli_workers_flag_gives_the_same_output(sample_dir: Path) -> None:
    one = cli("replay", str(sample_dir), "--output", "jsonl", *FIXED_TIME)
    two = cli("replay", str(sample_dir), "--output", "jsonl", "--workers", "2", *FIXED_TIME)
    assert one.returncode == two.returncode == 0
    assert one.stdout == two.stdout


def test_cli_processes_flag_gives_the_same_output(sample_dir: Path) -> None:
    """Every file of the sample (syslog, journal JSON and export, dmesg, kmsg, a rotated .gz) is a job of
    its own in a scanning process: the same faults and the same summary."""
    one = cli("replay", str(sample_dir), "--output", "jsonl", *FIXED_TIME)
    two = cli("replay", str(sample_dir), "--output", "jsonl", "--processes", "2", *FIXED_TIME)
    assert one.returncode == two.returncode == 0
    assert len(rows(one.stdout)) == len(EXPECTED)
    assert one.stdout == two.stdout
    summary = [line.split("; faults")[0] for line in (one.stderr, two.stderr)]
    assert summary[0] == summary[1]


def test_cli_workers_and_processes_together_are_refused(sample_dir: Path) -> None:
    both = cli("replay", str(sample_dir), "--processes", "2", "--workers", "2")
    assert both.returncode == 2
    assert "--workers (threads of the one-process dataflow) and --processes: give one of them" in both.stderr
    assert both.stdout == ""


XID = "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit error"


def test_bad_inputs_are_named_and_the_replay_goes_on(tmp_path: Path) -> None:
    good = tmp_path / "good.log"
    good.write_text(f"Dec  1 10:00:00 gpu-1 kernel: {XID}\n")
    binary = tmp_path / "core.bin"
    binary.write_bytes(bytes(range(256)) * 100)
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    messy = tmp_path / "messy.log"
    messy.write_bytes(
        b"Dec  1 10:00:01 gpu-2 kernel: " + XID.encode() + b"\n"
        + b"Dec  1 10:00:02 gpu-2 kernel: NVRM: Xid \x00\x00 garbage\n"
        + b"Dec  1 10:00:03 gpu-2 kernel: " + b"NVRM: Xid " + b"B" * (1 << 20) + b"\n"
        + b"Dec  1 10:00:04 gpu-2 kernel: \xff\xfe " + XID.encode() + b"\n"
        + b"NVRM: Xid with no header\n"
        + b'{"__REALTIME_TIMESTAMP": "1764583205000000", "_HOSTNAME": "gpu-2", "_TRANSPORT": "kernel", '
        + b'"SYSLOG_FACILITY": "0", "MESSAGE": "' + XID.encode() + b'"}\n'
    )  # fmt: skip
    rotated = tmp_path / "gpu-3.log.1.gz"
    rotated.write_bytes(gzip.compress(f"Dec  1 09:00:00 gpu-3 kernel: {XID}\n".encode()))
    missing = tmp_path / "missing.log"
    done = cli(
        "replay",
        *map(str, (good, binary, empty, messy, rotated, missing)),
        "--year",
        "2026",
        "--output",
        "jsonl",
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert f"error: {binary}: binary data, not a text log" in err
    assert f"error: {missing}: no such file" in err
    assert f"note: {empty}: file is empty" in err
    assert f"warning: {messy}:2: binary data (NUL bytes), line skipped" in err
    assert f"warning: {messy}:3: line longer than 65536 bytes, skipped" in err
    assert f"warning: {messy}:4: invalid UTF-8, decoded with replacement characters" in err
    assert f"warning: {messy}:5: not a rfc3164 line, skipped" in err
    assert f"warning: {messy}:6: line is json, file was detected as rfc3164" in err
    summary = err.strip().splitlines()[-1]
    assert summary.startswith("lines read 8 in 3 file(s); skipped 3 as unparseable")
    assert "(not a log line 1, binary 1, too long 1)" in summary
    assert "invalid UTF-8 1" in summary and "unreadable files 2" in summary
    got = {(f["node"], f["code"], f["count"]) for f in rows(done.stdout)}
    assert got == {("gpu-1", "XID-48", 1), ("gpu-2", "XID-48", 3), ("gpu-3", "XID-48", 1)}


def test_no_readable_input_fails(tmp_path: Path) -> None:
    done = cli("replay", str(tmp_path / "nope.log"))
    assert done.returncode == 1
    assert f"error: {tmp_path / 'nope.log'}: no such file" in done.stderr
    assert "error: no readable input files" in done.stderr


def test_user_pack_directory_adds_and_overrides_patterns(tmp_path: Path) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / "site.yaml").write_text(
        """
pack: site
patterns:
  - id: ecc-page-storm
    description: our own pattern
    regex: "EDAC MC(?P<mc>\\\\d+): (?P<n>\\\\d+) CE memory read error"
    code: HOST-ECC-CE
    component: NODE
    threshold: {count: 2, within: 1m}
    classify: [{set: {fatal: true, action: RESTART_BM}}]
    examples:
      match: ["EDAC MC0: 1 CE memory read error on CPU_SrcID#0"]
      no_match: ["EDAC MC0: Giving out device to module"]
tables:
  xid:
    "48": {fatal: false, action: NONE}
"""
    )
    log = tmp_path / "host.log"
    log.write_text(
        "Dec  1 10:00:00 h1 kernel: EDAC MC0: 1 CE memory read error on CPU_SrcID#0\n"
        "Dec  1 10:00:30 h1 kernel: EDAC MC0: 1 CE memory read error on CPU_SrcID#0\n"
        f"Dec  1 10:00:40 h1 kernel: {XID}\n"
    )
    done = cli("replay", str(log), "--pack", str(packs), "--year", "2026", "--output", "jsonl")
    assert done.returncode == 0, done.stderr
    got = {(f["code"], f["fatal"], f["action"], f["count"]) for f in rows(done.stdout)}
    assert got == {("HOST-ECC-CE", True, "RESTART_BM", 2), ("XID-48", False, "NONE", 1)}


def test_bad_user_pack_stops_the_replay_with_file_and_pattern(tmp_path: Path, sample_dir: Path) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / "broken.yaml").write_text(
        "pack: broken\npatterns:\n  - id: oops\n    description: x\n    regex: 'a('\n    code: X\n"
        "    examples: {match: [a], no_match: [b]}\n"
    )
    done = cli("replay", str(sample_dir), "--pack", str(packs))
    assert done.returncode == 2
    assert f"error: {packs / 'broken.yaml'}: pattern 'oops': invalid regex" in done.stderr
    test = cli("patterns", "test", str(packs))
    assert test.returncode == 1
    assert f"{packs / 'broken.yaml'}: pattern 'oops': invalid regex" in test.stderr


def test_patterns_test_reports_each_failing_example(tmp_path: Path) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    body = "    description: x\n    regex: 'THING (?P<n>\\d+)'\n    code: T\n"
    (packs / "two.yaml").write_text(
        "pack: two\npatterns:\n"
        f"  - id: first\n{body}    examples: {{match: ['THING x'], no_match: [b]}}\n"
        f"  - id: second\n{body}    examples: {{match: ['THING 1'], no_match: ['THING 2']}}\n"
    )
    done = cli("patterns", "test", str(packs), "--no-builtin")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert f"FAIL {packs / 'two.yaml'}: pattern 'first': example does not match the regex: 'THING x'" in lines
    assert f"FAIL {packs / 'two.yaml'}: pattern 'second': negative example matches: 'THING 2'" in lines
    assert lines[-1] == "2 example failure(s)"


@pytest.mark.parametrize("workers", [1, 2])
def test_runaway_regex_is_stopped_by_the_timeout_in_a_replay(tmp_path: Path, workers: int) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / "evil.yaml").write_text(
        "pack: evil\npatterns:\n  - id: evil\n    description: x\n    regex: 'EVIL (?=.)((a|aa)+)$'\n"
        "    prefilter: [EVIL]\n    code: EVIL\n    examples: {match: ['EVIL aa'], no_match: ['EVIL']}\n"
    )
    compiled = compiler.CompiledPacks(loader.load([packs]), check_backtracking=False)
    log = tmp_path / "gpu-1.log"
    log.write_text(
        "Dec  1 10:00:00 gpu-1 kernel: EVIL " + "a" * 60 + "!\n"
        "Dec  1 10:00:01 gpu-1 kernel: EVIL aa\n"
        f"Dec  1 10:00:02 gpu-1 kernel: {XID}\n"
    )
    inputs = files.sniff_all([str(log)], year=2026)
    result = replay.run(inputs.groups(), compiled, workers=workers)
    assert result.regex_timeouts == 1
    assert {f.code for f in result.faults} == {"EVIL", "XID-48"}
