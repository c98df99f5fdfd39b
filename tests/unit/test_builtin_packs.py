"""The built-in packs: the whole XID catalogue, its classifications and the other packs' lines."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from faultline.errors import PackError
from faultline.models import Action
from patterns import compiler, examples, loader
from patterns.compiler import CompiledPacks


def test_every_builtin_example_passes(builtin: CompiledPacks) -> None:
    assert examples.run(builtin) == []


def test_builtin_regexes_compile_as_loading_trusted_them(builtin: CompiledPacks) -> None:
    """Loading compiles a built-in regex only when a line first needs it, taking its groups from the
    stdlib's parse and skipping the backtracking probe: both checked here, for every built-in pattern."""
    fresh = compiler.compile_packs(loader.load(), check_examples=False)
    assert all(p.builtin for p in fresh.patterns)
    assert not any(
        "regex" in vars(p) for p in fresh.patterns if p.spec.prefilter is None
    )  # none compiled yet
    compiler.verify_builtin(fresh)
    assert all("regex" in vars(p) for p in fresh.patterns)


def test_user_patterns_and_overrides_are_compiled_and_checked_at_load(
    write_pack: Callable[[str, str], Path],
) -> None:
    """Only the shipped patterns are taken on trust: a user pattern, also one overriding a built-in id,
    is compiled at load and its examples run there."""
    directory = write_pack(
        "site.yaml",
        """
        pack: site
        patterns:
          - id: site-ecc
            regex: 'site ecc on (?P<gpu>[0-9a-f:.]+)'
            code: SITE-ECC
            entity: {type: GPU, id: '{gpu}'}
            description: site ECC report
            examples: {match: ['site ecc on 0000:01:00.0'], no_match: ['site ecc off']}
        """,
    )
    compiled = compiler.compile_packs(loader.load([directory]))
    site = next(p for p in compiled.patterns if p.id == "site-ecc")
    assert not site.builtin and "regex" in vars(site)
    write_pack(
        "override.yaml",
        """
        pack: override
        patterns:
          - id: xid
            regex: 'NVRM: Xid \\(PCI:(?P<pci>[0-9a-f:.]+)\\): (?P<xid>\\d+)'
            code: 'XID-{xid}'
            entity: {type: GPU, id: '{pci}'}
            description: narrower XID form
            examples: {match: ['NVRM: Xid 79 is not this form'], no_match: ['NVRM: nothing']}
        """,
    )
    with pytest.raises(PackError, match="does not catch example") as caught:
        compiler.compile_packs(loader.load([directory]))
    assert caught.value.file == str(directory / "override.yaml")


def test_patterns_test_command_passes_on_the_builtin_packs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "faultline", "patterns", "test"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok: ")


def test_patterns_lint_command_passes_on_the_builtin_packs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "faultline", "patterns", "lint"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_xid_catalogue_is_complete() -> None:
    table = loader.load().tables["xid"]
    assert sorted(int(k) for k in table) == list(range(1, 173))
    for code, row in table.items():
        assert row.description, code
        assert row.cause in {"application", "hardware", "driver", "firmware", "engine", "other", "unknown"}, (
            code
        )
        assert row.action is not None and row.fatal is not None and row.recommendation, code


@pytest.mark.parametrize("code", ["13", "31", "43", "45"])
def test_application_xids_are_not_fatal_once_but_escalate(code: str) -> None:
    row = loader.load().tables["xid"][code]
    assert row.cause == "application"
    assert row.fatal is False
    assert row.escalate is not None and row.escalate.fatal is True


def xid_line(code: int, text: str = "something") -> str:
    return f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=app, {text}"


@pytest.mark.parametrize(
    ("line", "fatal", "action"),
    [
        (xid_line(79, "GPU has fallen off the bus."), True, Action.RESTART_BM),
        (xid_line(48), True, Action.COMPONENT_RESET),
        (xid_line(95), True, Action.COMPONENT_RESET),
        (xid_line(94), False, Action.RESTART_APP),
        (xid_line(63), False, Action.NONE),
        (xid_line(64), True, Action.COMPONENT_RESET),
        (xid_line(13), False, Action.RESTART_APP),
        (xid_line(31), False, Action.RESTART_APP),
        (xid_line(45), False, Action.NONE),
        (xid_line(14), False, Action.NONE),
        (xid_line(54), True, Action.CONTACT_SUPPORT),
        (xid_line(1), False, Action.CONTACT_SUPPORT),  # unused on current GPUs: unknown, not ignored
        (xid_line(151), True, Action.RESTART_VM),
        (xid_line(154, "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"), True,
         Action.COMPONENT_RESET),
        (xid_line(154, "GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)"), True, Action.RESTART_BM),
        (xid_line(154, "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)"), False,
         Action.NONE),
        (xid_line(154, "GPU recovery action changed from 0x0 (None) to 0x5 (Recover IMEX)"), False,
         Action.CONTACT_SUPPORT),
        ("NVRM: Xid (PCI:0000:3b:00): 149, NETIR_LINK_DOWN Fatal XC0 i0 Link 04 (0x0 0x0 0x0 0x0 0x0 0x0)", True,
         Action.COMPONENT_RESET),
        ("NVRM: Xid (PCI:0000:3b:00): 149, NETIR_LINK_DOWN Fatal XC0 i1 Link 04 (0x0 0x0 0x0 0x0 0x0 0x0)", False,
         Action.NONE),
    ],
)  # fmt: skip
def test_xid_classification(builtin: CompiledPacks, line: str, fatal: bool, action: Action) -> None:
    (hit,) = builtin.match("kmsg", line)
    assert (hit.fatal, hit.action) == (fatal, action.value)
    assert (hit.entity_type, hit.entity_id, hit.component) == ("GPU", "0000:3b:00", "GPU")


@pytest.mark.parametrize(
    ("line", "code", "entity", "fatal"),
    [
        ("nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 23005, Non-fatal, Link 02 x", "SXID-23005",
         ("NVSWITCH", "0000:07:00"), False),  # the line's severity wins over the table's class
        ("nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 23005, Fatal, Link 02 x", "SXID-23005",
         ("NVSWITCH", "0000:07:00"), True),
        ("nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 22003, minion halted", "SXID-22003",
         ("NVSWITCH", "0000:07:00"), True),
        ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", "GPU-FELL-OFF-BUS", ("GPU", "0000:3b:00"), True),
        ("mlx5_core 0000:5e:00.0 ens5np0: Link down", "NIC-LINK-DOWN", ("NIC", "0000:5e:00.0"), False),
        ("mlx5_core 0000:5e:00.0 mlx5_0: Port: 1 Link DOWN", "NIC-LINK-DOWN", ("NIC", "0000:5e:00.0"), False),
        ("mlx5_core 0000:5e:00.0 ens5np0: NETDEV WATCHDOG: CPU: 3: transmit queue 5 timed out 5120 ms",
         "NIC-TX-TIMEOUT", ("NIC", "0000:5e:00.0"), False),
        ("mce: [Hardware Error]: CPU 12: Machine Check Exception: 5 Bank 4: b200000000070005", "NODE-MCE-FATAL",
         ("NODE", ""), True),
    ],
)  # fmt: skip
def test_other_pack_lines(
    builtin: CompiledPacks, line: str, code: str, entity: tuple[str, str], fatal: bool
) -> None:
    (hit,) = builtin.match("syslog", line)
    assert (hit.code, (hit.entity_type, hit.entity_id), hit.fatal) == (code, entity, fatal)


@pytest.mark.parametrize(
    ("line", "code", "entity", "fatal"),
    [
        ("nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
         "PCIE-AER-FATAL", ("GPU", "0000:3b:00"), True),
        ("pci 0000:3b:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Transaction Layer, (Receiver ID)"
         " device [10de:2330] error status/mask=00040000/00000000 [18] MalfTLP (First)",
         "PCIE-AER-FATAL", ("GPU", "0000:3b:00"), True),
        ("mlx5_core 0000:5e:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer,"
         " (Requester ID)", "PCIE-AER-NON-FATAL", ("NIC", "0000:5e:00.0"), False),
    ],
)  # fmt: skip
def test_aer_records(
    builtin: CompiledPacks, line: str, code: str, entity: tuple[str, str], fatal: bool
) -> None:
    """AER reports are records (the register dump's lines joined to the first): one conclusion each."""
    assert builtin.match("syslog", line) == ()
    (hit,) = builtin.match("syslog", line, records=True)
    assert (hit.code, (hit.entity_type, hit.entity_id), hit.fatal) == (code, entity, fatal)


def test_benign_kernel_lines_match_nothing(builtin: CompiledPacks) -> None:
    for line in (
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
        "nvidia-nvswitch0: open (major=508)",
        "mlx5_core 0000:5e:00.0: firmware version: 28.39.1002",
        "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
        "IPv6: ADDRCONF(NETDEV_CHANGE): ens5np0: link becomes ready",
    ):
        assert builtin.match("syslog", line) == (), line
