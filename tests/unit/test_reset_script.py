"""The GPU reset Job's script (workers.janitor.RESET_SCRIPT), run with stand-ins: a recording nvidia-smi
(as nvidia-smi(1) documents --gpu-reset and --query-gpu) and a process table whose processes hold NVIDIA
device nodes. It refuses while the GPU is held, resets each GPU, and reads each afresh after."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from workers import janitor

GPUS = ("00000000:3B:00.0", "00000000:86:00.0")


def _smi(tmp: Path, *, fail_reset: bool = False) -> Path:
    """A recording nvidia-smi on PATH: each call's arguments, one line each."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    calls = tmp / "calls.txt"
    code = 1 if fail_reset else 0
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        f'case "$1" in --gpu-reset) exit {code};;\n'
        f'  --query-gpu=minor_number) case "$4" in {GPUS[0]}) echo 0;; {GPUS[1]}) echo " 1";; *) exit 6;; esac;;\n'
        f'  --query-gpu=*) echo "$4, NVIDIA H100 80GB HBM3";; esac\n'
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    return bin_dir


def _holder(proc: Path, pid: int, comm: str, device: str) -> None:
    (proc / str(pid) / "fd").mkdir(parents=True)
    (proc / str(pid) / "comm").write_text(comm + "\n")
    (proc / str(pid) / "fd" / "5").symlink_to(device)


def _run(tmp: Path, bin_dir: Path, proc: Path, wait: int = 2) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PROC": str(proc),
           "DRIVER_ROOT": str(tmp / "no-driver-root"), "HOLD_WAIT": str(wait)}  # fmt: skip
    return subprocess.run(["sh", "-c", janitor.RESET_SCRIPT, "gpu-reset", *GPUS], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def _calls(tmp: Path) -> list[str]:
    """What nvidia-smi was asked, beyond each GPU's minor number (which device node is the GPU's)."""
    path = tmp / "calls.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [c for c in lines if not c.startswith("--query-gpu=minor_number")]


def test_it_resets_each_gpu_then_reads_each_afresh(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _holder(proc, 4242, "bash", "/dev/null")  # holds nothing of NVIDIA's
    done = _run(tmp_path, _smi(tmp_path), proc)
    assert done.returncode == 0, done.stderr
    assert _calls(tmp_path) == [
        f"--gpu-reset -i {GPUS[0]}", f"--gpu-reset -i {GPUS[1]}",
        f"--query-gpu=pci.bus_id,name --format=csv,noheader -i {GPUS[0]}",
        f"--query-gpu=pci.bus_id,name --format=csv,noheader -i {GPUS[1]}",
    ]  # fmt: skip


def test_it_refuses_while_a_process_holds_the_gpu_and_names_it(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _holder(proc, 777, "dcgm-exporter", "/dev/nvidia1")  # GPUS[1]'s minor number is 1
    _holder(proc, 778, "python3", "/dev/nvidiactl")  # another GPU's pod (a partial drain): not this GPU's
    _holder(proc, 779, "python3", "/dev/nvidia5")
    _holder(
        proc, 780, "nvidia-persistenced", "/dev/nvidia0"
    )  # the driver's own daemon: nvidia-smi's to judge
    done = _run(tmp_path, _smi(tmp_path), proc)
    assert done.returncode == 3
    assert "777 dcgm-exporter" in done.stderr and "778" not in done.stderr and "779" not in done.stderr
    assert "780" not in done.stderr
    assert _calls(tmp_path) == []  # never asked to reset


def test_it_waits_for_the_clients_to_leave(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _holder(proc, 900, "nv-hostengine", "/dev/nvidia0")
    bin_dir = _smi(tmp_path)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PROC": str(proc),
           "DRIVER_ROOT": str(tmp_path / "none"), "HOLD_WAIT": "30"}  # fmt: skip
    job = subprocess.Popen(["sh", "-c", janitor.RESET_SCRIPT, "gpu-reset", GPUS[0]], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        subprocess.run(["sleep", "3"], check=True)
        assert job.poll() is None and _calls(tmp_path) == []  # still waiting
        (proc / "900" / "fd" / "5").unlink()  # DCGM's pod has left the node
        assert job.wait(20) == 0
    finally:
        job.kill()
    assert _calls(tmp_path)[0] == f"--gpu-reset -i {GPUS[0]}"


def test_a_failed_reset_or_no_driver_tools_fail_the_job(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    done = _run(tmp_path, _smi(tmp_path, fail_reset=True), proc)
    assert done.returncode == 1 and _calls(tmp_path) == [f"--gpu-reset -i {GPUS[0]}"]
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {"PATH": str(empty) + ":/usr/bin:/bin", "PROC": str(proc), "DRIVER_ROOT": str(tmp_path / "none")}
    done = subprocess.run(["sh", "-c", janitor.RESET_SCRIPT, "gpu-reset", GPUS[0]], env=env, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 4 and "no nvidia-smi" in done.stderr
    other = tmp_path / "other"
    other.mkdir()
    env = {**os.environ, "PATH": f"{_smi(other)}:{os.environ['PATH']}", "PROC": str(proc),
           "DRIVER_ROOT": str(tmp_path / "none")}  # fmt: skip
    done = subprocess.run(["sh", "-c", janitor.RESET_SCRIPT, "gpu-reset", "00000000:AA:00.0"], env=env,
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 1 and "no minor number" in done.stderr  # not a GPU of this node


def test_the_job_runs_it_in_the_hosts_mount_namespace() -> None:
    command = janitor.Settings().reset_command
    assert command[:5] == ("nsenter", "-t", "1", "-m", "--") and command[5:8] == (
        "sh",
        "-c",
        janitor.RESET_SCRIPT,
    )
