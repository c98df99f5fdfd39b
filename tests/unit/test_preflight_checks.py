"""Preflight's checks on the simulated GPUs (`faultline sim inject` records in a control directory), the
kernel log (kmsg records, the simulated boot's XIDs) and DCGM diagnostics (the stand-in bindings): each
check fails on its fault with its code, GPU and action, and passes a clean node; the run around them
(hung driver calls, a gang that fails while checking, reports) is tested in test_preflight_run.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faultline.errors import ConfigError
from faultline.models import Action
from faultline.preflight import CHECKS, Finding, parse_checks, reason
from patterns import compiler, loader
from sources import dcgm, preflight, simulator
from tests.unit.test_dcgm import FAKE

NODE = "pf-node"
BUS = [d.pci for d in simulator.devices_for(NODE)]


@pytest.fixture(scope="module")
def packs() -> compiler.CompiledPacks:
    return compiler.compile_packs(loader.load([]), check_examples=False)


def run(
    tmp: Path, packs: compiler.CompiledPacks, *, kmsg: Path | None = None, diagnose: Any = None, **expect: Any
) -> list[Finding]:
    backend = simulator.SimulatorBackend(NODE, directory=tmp)
    try:
        devices = {d.index: d for d in backend.devices()}

        def kernel() -> list[tuple[str, str, bool]]:
            lines = preflight.kmsg_lines(kmsg) if kmsg is not None else []
            from sources import gpu  # noqa: PLC0415

            rendered = (gpu.message(e, devices.get(e.gpu)) for e in backend.history())
            return lines + [("nvml", text, True) for text in rendered if text is not None]

        want = preflight.Expect(tuple(expect.pop("checks", CHECKS)), **expect)
        readings = preflight.read(backend, want, kernel_lines=kernel, compiled=packs, diagnose=diagnose)
        return preflight.evaluate(readings, want)
    finally:
        backend.close()


def inject(tmp: Path, gpu: int, **record: Any) -> None:
    kind, value = next(iter(record.items()))
    if kind == "field":
        name, number = simulator.parse_field(value)
        simulator.inject(NODE, gpu, kind="field", name=name, value=number, directory=tmp)
    else:
        simulator.inject(NODE, gpu, kind=kind, value=int(value), directory=tmp)


def codes(findings: list[Finding]) -> list[tuple[str, str, str, Action]]:
    return [(f.check, f.code, f.gpu, f.action) for f in findings]


def test_a_clean_node_passes_every_check(tmp_path: Path, packs: compiler.CompiledPacks) -> None:
    assert run(tmp_path, packs, gpus=8) == []


@pytest.mark.parametrize(
    ("gpu", "record", "expected"),
    [
        (
            2,
            {"field": "remapped_rows_pending=1"},
            ("remap", "PREFLIGHT-REMAP-PENDING", Action.COMPONENT_RESET),
        ),
        (
            2,
            {"field": "retired_pages_pending=1"},
            ("remap", "PREFLIGHT-PAGES-PENDING", Action.COMPONENT_RESET),
        ),
        (
            2,
            {"field": "remapped_rows_failure=1"},
            ("remap", "PREFLIGHT-REMAP-FAILED", Action.CONTACT_SUPPORT),
        ),
        (5, {"field": "ecc_dbe_volatile=3"}, ("ecc", "PREFLIGHT-ECC-DBE", Action.COMPONENT_RESET)),
        (1, {"field": "nvlink_down=2"}, ("nvlink", "PREFLIGHT-NVLINK-DOWN", Action.COMPONENT_RESET)),
        (4, {"field": "pcie_width=8"}, ("pcie", "PREFLIGHT-PCIE-WIDTH", Action.RESTART_BM)),
        (3, {"xid": 79}, ("xid", "PREFLIGHT-XID-79", Action.RESTART_BM)),
        (6, {"lost": 0}, ("xid", "PREFLIGHT-GPU-FELL-OFF-BUS", Action.RESTART_BM)),
    ],
)
def test_each_check_fails_on_its_fault(
    tmp_path: Path,
    packs: compiler.CompiledPacks,
    gpu: int,
    record: dict[str, Any],
    expected: tuple[str, str, Action],
) -> None:
    inject(tmp_path, gpu, **record)
    check, code, action = expected
    assert codes(run(tmp_path, packs, gpus=8)) == [(check, code, BUS[gpu], action)]
    others = tuple(c for c in CHECKS if c != check)
    assert run(tmp_path, packs, gpus=8, checks=others) == []  # only that check sees it


def test_count_and_model(tmp_path: Path, packs: compiler.CompiledPacks) -> None:
    (count,) = run(tmp_path, packs, gpus=4, checks=["count"])
    assert (count.code, count.gpu, count.action, count.node_fault) == (
        "PREFLIGHT-GPU-COUNT",
        "",
        Action.RESTART_BM,
        True,
    )
    assert "8 GPUs visible, the pod was given 4" in count.message
    assert run(tmp_path, packs, gpus=8, model="h100", checks=["count"]) == []  # a part of the name, any case
    wrong = run(tmp_path, packs, gpus=8, model="A100", checks=["count"])
    assert {(f.code, f.node_fault, f.action) for f in wrong} == {("PREFLIGHT-GPU-MODEL", False, Action.NONE)}
    assert len(wrong) == 8  # every GPU named: the pod's business, not the node's (no health event)


def test_pcie_generation_only_when_asked(tmp_path: Path, packs: compiler.CompiledPacks) -> None:
    inject(tmp_path, 0, field="pcie_gen=1")  # an idle GPU lowers its link speed
    assert run(tmp_path, packs, checks=["pcie"]) == []
    assert codes(run(tmp_path, packs, checks=["pcie"], pcie_generation=True)) == [
        ("pcie", "PREFLIGHT-PCIE-GEN", BUS[0], Action.RESTART_BM)
    ]


def test_nvlink_minimum_allows_unused_links(tmp_path: Path, packs: compiler.CompiledPacks) -> None:
    inject(tmp_path, 1, field="nvlink_down=2")  # 16 of 18 active
    assert run(tmp_path, packs, checks=["nvlink"], nvlink_min_active=16) == []
    (short,) = run(tmp_path, packs, checks=["nvlink"], nvlink_min_active=17)
    assert "16 NVLinks active, at least 17 expected" in short.message


def test_kernel_log_xids_on_the_pods_gpus_only(tmp_path: Path, packs: compiler.CompiledPacks) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        f"3,100,5000000,-;NVRM: Xid (PCI:{BUS[3]}): 79, pid=1, name=python, GPU has fallen off the bus.\n"
        " SUBSYSTEM=pci\n"  # a continuation line
        "3,101,6000000,-;NVRM: Xid (PCI:0000:ee:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
        f"3,102,7000000,-;NVRM: Xid (PCI:{BUS[2]}): 48, An uncorrectable double bit error (DBE) detected.\n"
        f"3,103,8000000,-;NVRM: Xid (PCI:{BUS[1]}): 13, pid=7, name=train, Graphics SM Warp Exception\n"
    )  # 0000:ee:00 is another pod's GPU; 48 is a reset's to fix (judged by ecc/remap), 13 the application's
    assert codes(run(tmp_path, packs, kmsg=kmsg, checks=["xid"])) == [
        ("xid", "PREFLIGHT-XID-79", BUS[3], Action.RESTART_BM)
    ]
    both = run(tmp_path, packs, kmsg=kmsg, checks=["xid"], xid_min_action=Action.COMPONENT_RESET)
    assert [f.code for f in both] == ["PREFLIGHT-XID-79", "PREFLIGHT-XID-48"]
    user = tmp_path / "user-kmsg"  # facility 1 (user space) writing a kernel-looking line: not evidence
    user.write_text(
        f"11,100,5000000,-;NVRM: Xid (PCI:{BUS[3]}): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    )
    assert run(tmp_path, packs, kmsg=user, checks=["xid"]) == []


def test_a_cleared_simulated_gpu_leaves_its_xids_behind(
    tmp_path: Path, packs: compiler.CompiledPacks
) -> None:
    inject(tmp_path, 3, xid=79)
    simulator.inject(NODE, 3, kind="reset", directory=tmp_path)  # a reset does not rewrite the kernel log
    assert [f.code for f in run(tmp_path, packs, checks=["xid"])] == ["PREFLIGHT-XID-79"]
    simulator.inject(NODE, 3, kind="healthy", directory=tmp_path)  # sim's clear: as after a reboot
    assert run(tmp_path, packs, checks=["xid"]) == []


@pytest.fixture
def bindings() -> Iterator[dict[str, Any]]:
    modules = dcgm.load_bindings(FAKE)
    state = modules["dcgm_agent"].STATE
    saved = {k: list(v) if isinstance(v, list) else v for k, v in state.items()}
    state["gpus"] = [(d.uuid.encode(), f"0000{d.pci[4:]}.0".encode()) for d in simulator.devices_for(NODE)]
    yield modules
    state.update(saved)


def test_dcgm_diagnostics_on_the_pods_gpus(
    tmp_path: Path, packs: compiler.CompiledPacks, bindings: dict[str, Any]
) -> None:
    s, state = bindings["dcgm_structs"], bindings["dcgm_agent"].STATE
    devices = simulator.devices_for(NODE)
    state["diag"] = s.DiagResponse(
        numTests=2,
        tests=[
            s.DiagTestRun(b"software", s.DCGM_DIAG_RESULT_PASS),
            s.DiagTestRun(b"memory", s.DCGM_DIAG_RESULT_FAIL, numErrors=1, errorIndices=[0]),
        ],
        numErrors=1,
        errors=[s.DiagError(s.EntityPair(1, 5), 7, b"Memory test failed:  2 bad   pages")],
    )

    def diagnose(uuids: list[str]) -> dcgm.Diagnosis:
        return dcgm.diagnose("10.0.0.7:5555", 1, uuids, bindings)

    (finding,) = run(tmp_path, packs, diagnose=diagnose, checks=["dcgm"])
    assert codes([finding]) == [("dcgm", "PREFLIGHT-DCGM-MEMORY", devices[5].pci, Action.COMPONENT_RESET)]
    assert finding.message == "DCGM diagnostic 'memory' failed: Memory test failed: 2 bad pages"
    assert state["diag_runs"] == [(s.DCGM_DIAG_LVL_SHORT, list(range(8)))]  # level 1: the short run
    assert state["groups"] == 0 and state["connected"] is None  # its own group, deleted; disconnected


@pytest.mark.parametrize(
    ("setup", "note"),
    [
        ({"refuse": True}, "no DCGM host engine at h:5555"),
        ({"diag": RuntimeError("DCGM_ST_DIAG_ALREADY_RUNNING")}, "DCGM diagnostics did not run"),
        ({"gpus": [(b"GPU-other", b"00000000:18:00.0")]}, "DCGM at h:5555 does not know the GPUs"),
    ],
)
def test_dcgm_that_cannot_diagnose_concludes_nothing(
    bindings: dict[str, Any], setup: dict[str, Any], note: str
) -> None:
    bindings["dcgm_agent"].STATE.update(setup)
    found = dcgm.diagnose("h:5555", 2, [d.uuid for d in simulator.devices_for(NODE)], bindings)
    assert found.failures == []
    assert found.note.startswith(note)
    assert bindings["dcgm_agent"].STATE["groups"] == 0


def test_a_bad_diagnostic_level_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"DCGM diagnostic level 5: expected 1-4"):
        dcgm.diagnose("h:5555", 5, ["GPU-x"])


def test_check_names_and_the_reason() -> None:
    assert parse_checks(" XID, ecc,,ecc ") == ("ecc", "xid")
    with pytest.raises(ValueError, match=r"unknown check 'ecx', 'pci'; valid checks: count, remap, ecc"):
        parse_checks("ecx,ecc,pci")
    with pytest.raises(ValueError, match="no check named"):
        parse_checks(" , ")
    text = reason(
        [
            Finding("count", "PREFLIGHT-GPU-MODEL", "model X", "0000:18:00", Action.NONE, False),
            Finding("remap", "PREFLIGHT-REMAP-FAILED", "no spare rows", "0000:2a:00", Action.CONTACT_SUPPORT),
            Finding("ecc", "PREFLIGHT-ECC-DBE", "3 errors", "0000:3a:00"),
        ]
    )
    assert text.splitlines() == [
        "preflight remap failed: PREFLIGHT-REMAP-FAILED on GPU 0000:2a:00: no spare rows",
        "preflight ecc failed: PREFLIGHT-ECC-DBE on GPU 0000:3a:00: 3 errors",
        "preflight count failed: PREFLIGHT-GPU-MODEL on GPU 0000:18:00: model X",
    ]  # the node's faults first, the most severe first
    assert len(reason([Finding("ecc", "X", "y" * 5000)])) == 1024


def test_the_command_on_the_simulator(tmp_path: Path) -> None:
    """`faultline preflight --gpu-backend sim`: exit 1 with the reason in the termination log for a node with
    a fault, exit 0 and nothing written for a clean one."""
    inject(tmp_path, 2, field="remapped_rows_pending=1")
    term = tmp_path / "termination-log"
    argv = [
        sys.executable,
        "-m",
        "faultline",
        "preflight",
        "--gpu-backend",
        "sim",
        "--sim-dir",
        str(tmp_path),
        "--termination-log",
        str(term),
        "--expected-gpus",
        "8",
    ]
    bad = subprocess.run([*argv, "--node", NODE], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 1, bad.stderr
    people, findings = term.read_text().rstrip("\n").split("\n")
    assert (
        people
        == f"preflight remap failed: PREFLIGHT-REMAP-PENDING on GPU {BUS[2]}: a row remapping waits for a GPU reset"
    )
    assert findings == (f'faultline-findings: [{{"code":"PREFLIGHT-REMAP-PENDING","gpu":"{BUS[2]}",'
                        '"action":"COMPONENT_RESET","check":"remap"}]')  # fmt: skip
    term.unlink()
    good = subprocess.run(
        [*argv, "--node", "pf-clean"], capture_output=True, text=True, timeout=60, check=False
    )
    assert good.returncode == 0, good.stderr
    assert not term.exists()
    refused = subprocess.run(
        [*argv, "--node", NODE, "--checks", "ecc,ecx"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert "unknown check 'ecx'; valid checks: count, remap, ecc, nvlink, pcie, xid, dcgm" in refused.stderr
