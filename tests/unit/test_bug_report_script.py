"""The repair Job's bug-report step (workers.janitor.BUG_REPORT_SCRIPT), run with a stand-in
nvidia-bug-report.sh that behaves as the driver's documents it (`--output-file FILE` writes FILE.gz when
gzip is there, FILE otherwise) and records how it was called. The report lands complete under its final
name (the agent uploads what it finds), and nothing it does can fail the repair. The GPU Operator's driver
root case is the same commands under chroot (not run here: it needs a root file system to enter)."""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

from workers import janitor


def _tool(tmp: Path, body: str) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-bug-report.sh"
    tool.write_text(f'#!/bin/sh\necho "$*" >> {tmp / "calls.txt"}\n{body}\n')
    tool.chmod(0o755)
    return bin_dir


def _run(tmp: Path, bin_dir: Path | None, limit: int = 30) -> subprocess.CompletedProcess[str]:
    path = f"{bin_dir}:{os.environ['PATH']}" if bin_dir else "/usr/bin:/bin"
    env = {"PATH": path, "BUG_REPORT_DIR": str(tmp / "reports"), "DRIVER_ROOT": str(tmp / "no-driver-root"),
           "BUG_REPORT_TIMEOUT": str(limit)}  # fmt: skip
    return subprocess.run(["sh", "-c", janitor.BUG_REPORT_SCRIPT, "bug-report", "gpu-7-abc-1"], env=env,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip


def test_a_report_is_left_complete_under_its_final_name(tmp_path: Path) -> None:
    bin_dir = _tool(tmp_path, 'printf "nvidia-bug-report log\\n" | gzip > "$2.gz"')
    done = _run(tmp_path, bin_dir)
    assert done.returncode == 0, done.stderr
    report = tmp_path / "reports" / "gpu-7-abc-1.log.gz"
    assert gzip.decompress(report.read_bytes()) == b"nvidia-bug-report log\n"
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == [
        "gpu-7-abc-1.log.gz"
    ]  # no partial file
    assert (tmp_path / "calls.txt").read_text() == f"--output-file {tmp_path}/reports/.gpu-7-abc-1.log\n"
    assert "bug report: " in done.stdout


def test_an_uncompressed_report_is_compressed(tmp_path: Path) -> None:
    bin_dir = _tool(tmp_path, 'printf "plain log\\n" > "$2"')  # no gzip where the tool ran
    assert _run(tmp_path, bin_dir).returncode == 0
    assert gzip.decompress((tmp_path / "reports" / "gpu-7-abc-1.log.gz").read_bytes()) == b"plain log\n"


def test_no_driver_tools_no_report_and_no_failure(tmp_path: Path) -> None:
    done = _run(tmp_path, None)
    assert done.returncode == 0 and "no nvidia-bug-report.sh" in done.stdout
    assert list((tmp_path / "reports").iterdir()) == []


def test_a_report_that_hangs_is_given_up_without_failing_the_repair(tmp_path: Path) -> None:
    bin_dir = _tool(tmp_path, 'printf "part" > "$2"; sleep 30')
    done = _run(tmp_path, bin_dir, limit=1)
    assert done.returncode == 0
    leftovers = list((tmp_path / "reports").iterdir())
    assert all(p.name.startswith(".") is False for p in leftovers) and all(
        p.suffix == ".gz" for p in leftovers
    )


def test_the_repair_job_runs_it_first_in_the_hosts_mount_namespace() -> None:
    s = janitor.Settings(image="img", bug_report_timeout=120)  # type: ignore[arg-type]
    init = janitor._bug_report(s, "gpu-7-abc-1")
    assert (
        init["command"][:6] == ["nsenter", "-t", "1", "-m", "--", "sh"]
        and init["command"][-1] == "gpu-7-abc-1"
    )
    assert {e["name"]: e["value"] for e in init["env"]} == {
        "BUG_REPORT_DIR": "/var/lib/faultline/bug-reports", "BUG_REPORT_TIMEOUT": "120"}  # fmt: skip
    assert init["securityContext"]["privileged"] is True
