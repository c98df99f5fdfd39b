"""NIC health from a real sysfs-shaped directory tree: link transitions, counters, positive evidence,
and flapping that becomes one fault rather than one per transition."""

from __future__ import annotations

from pathlib import Path

from patterns.compiler import CompiledPacks
from patterns.detectors import NodeDetector
from sources.nic import NicWatcher


def ib_port(root: Path, dev: str, port: int, *, active: bool = True, link_downed: int = 0) -> Path:
    p = root / "class" / "infiniband" / dev / "ports" / str(port)
    (p / "counters").mkdir(parents=True, exist_ok=True)
    (p / "state").write_text("4: ACTIVE\n" if active else "1: DOWN\n")
    (p / "phys_state").write_text("5: LinkUp\n" if active else "3: Disabled\n")
    (p / "rate").write_text("400 Gb/sec (4X NDR)\n")
    for name in ("symbol_error", "link_error_recovery", "port_rcv_errors"):
        (p / "counters" / name).write_text("0\n")
    (p / "counters" / "link_downed").write_text(f"{link_downed}\n")
    return p


def eth(root: Path, name: str, *, up: bool = True, device: bool = True) -> None:
    p = root / "class" / "net" / name
    p.mkdir(parents=True, exist_ok=True)
    (p / "carrier").write_text("1\n" if up else "0\n")
    (p / "operstate").write_text("up\n" if up else "down\n")
    if device:
        (p / "device").mkdir(exist_ok=True)


def test_absent_devices_report_nothing(tmp_path: Path) -> None:
    watcher = NicWatcher(tmp_path)  # a node type with no InfiniBand and no NIC directories
    assert watcher.poll() == []
    assert watcher.poll() == []


def test_transitions_counters_and_virtual_interfaces(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", 1)
    eth(tmp_path, "eth0")
    eth(tmp_path, "veth1a2b", up=False, device=False)  # virtual: ignored
    watcher = NicWatcher(tmp_path)
    assert watcher.poll() == []  # baseline
    ib_port(tmp_path, "mlx5_0", 1, active=False, link_downed=1)
    eth(tmp_path, "eth0", up=False)
    assert watcher.poll() == [
        "nic mlx5_0/1: link down",
        "nic mlx5_0/1: counter link_downed +1",
        "nic eth0: link down",
    ]
    ib_port(tmp_path, "mlx5_0", 1, link_downed=1)
    assert watcher.poll() == ["nic mlx5_0/1: link up"]


def test_a_port_down_at_start_is_evidence(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_3", 1, active=False)
    assert NicWatcher(tmp_path).poll() == ["nic mlx5_3/1: link down"]


def test_flapping_in_sysfs_is_one_flapping_fault(tmp_path: Path, builtin: CompiledPacks) -> None:
    ib_port(tmp_path, "mlx5_0", 1)
    watcher = NicWatcher(tmp_path)
    detector = NodeDetector("gpu-node-01", builtin)
    t = 10_000.0
    watcher.poll()
    for i in range(8):  # 4 down/up cycles, one transition per 30 s poll
        ib_port(tmp_path, "mlx5_0", 1, active=i % 2 == 1, link_downed=(i + 2) // 2)
        t += 30
        for message in watcher.poll():
            for hit in builtin.match("nic", message):
                detector.observe(t, hit, message)
    faults = {f.code: f for f in detector.snapshot_faults()}
    assert set(faults) == {"NIC-LINK-DOWN", "NIC-LINK-FLAPPING", "NIC-IB-LINK-DOWNED"}
    flapping = faults["NIC-LINK-FLAPPING"]
    assert (flapping.entity.id, flapping.fatal, flapping.action.value) == (
        "mlx5_0/1",
        True,
        "CONTACT_SUPPORT",
    )
    assert faults["NIC-LINK-DOWN"].count == 4 and faults["NIC-LINK-DOWN"].resolved_at is not None
    assert faults["NIC-IB-LINK-DOWNED"].fatal  # 4 link_downed increments in 4 minutes escalate


def _set_counter(root: Path, dev: str, port: int, name: str, value: int) -> None:
    (root / "class" / "infiniband" / dev / "ports" / str(port) / "counters" / name).write_text(f"{value}\n")


def _poll_into(watcher: NicWatcher, detector: NodeDetector, builtin: CompiledPacks, t: float) -> None:
    for message in watcher.poll():
        for hit in builtin.match("nic", message):
            detector.observe(t, hit, message)


def test_counter_rate_rules_sum_the_increases_in_their_window(tmp_path: Path, builtin: CompiledPacks) -> None:
    """symbol_error: 100 within 10 minutes on one port, summed over the polls' increases; the same total
    spread over more than the window is no fault."""
    ib_port(tmp_path, "mlx5_0", 1)
    ib_port(tmp_path, "mlx5_1", 1)
    watcher = NicWatcher(tmp_path)
    detector = NodeDetector("gpu-node-01", builtin)
    t = 10_000.0
    watcher.poll()
    fast, slow = 0, 0
    for step in range(1, 13):  # one poll a minute
        t += 60
        fast += 30 if step <= 4 else 0  # 120 in 4 minutes on mlx5_0
        slow += 30 if step % 6 == 0 else 0  # 30 every 6 minutes on mlx5_1: 60 in any 10 minutes
        _set_counter(tmp_path, "mlx5_0", 1, "symbol_error", fast)
        _set_counter(tmp_path, "mlx5_1", 1, "symbol_error", slow)
        _poll_into(watcher, detector, builtin, t)
    faults = {(f.entity.id, f.code): f for f in detector.snapshot_faults()}
    assert set(faults) == {("mlx5_0/1", "NIC-IB-SYMBOL_ERROR")}
    fault = faults[("mlx5_0/1", "NIC-IB-SYMBOL_ERROR")]
    assert (fault.fatal, fault.action.value) == (False, "CONTACT_SUPPORT")
    # the fourth poll (+30, 120 in all) crossed 100; polls after it count on the open fault
    assert fault.first_seen.timestamp() == 10_060.0


def test_a_rate_rule_threshold_is_tunable_in_a_pack(tmp_path: Path) -> None:
    """A site pack overrides the built-in rule by id: 10 symbol errors within 10 minutes."""
    from patterns import compiler, loader  # noqa: PLC0415

    site = tmp_path / "packs"
    site.mkdir()
    (site / "site.yaml").write_text(
        """pack: site
version: 1
description: stricter symbol error rate
patterns:
  - id: nic-ib-symbol-errors
    description: InfiniBand symbol errors, 10 within 10 minutes
    sources: [nic]
    regex: "^nic (?P<port>[A-Za-z0-9_./-]+): counter symbol_error \\\\+(?P<n>\\\\d+)$"
    code: NIC-IB-SYMBOL_ERROR
    component: NIC
    entity: {type: NIC, id: "{port}"}
    classify:
      - set: {fatal: false, action: CONTACT_SUPPORT}
    threshold: {count: 10, within: 10m, amount: "{n}"}
    examples:
      match: ["nic mlx5_0/1: counter symbol_error +3"]
      no_match: ["nic mlx5_0/1: counter port_rcv_errors +3"]
"""
    )
    packs = compiler.compile_packs(loader.load([site]))
    sysfs = tmp_path / "sys"
    ib_port(sysfs, "mlx5_0", 1)
    watcher = NicWatcher(sysfs)
    detector = NodeDetector("gpu-node-01", packs)
    watcher.poll()
    _set_counter(sysfs, "mlx5_0", 1, "symbol_error", 12)
    _poll_into(watcher, detector, packs, 10_060.0)
    (fault,) = detector.snapshot_faults()
    assert (fault.code, fault.entity.id) == ("NIC-IB-SYMBOL_ERROR", "mlx5_0/1")


def test_a_rate_rules_amount_is_bounded(builtin: CompiledPacks) -> None:
    """An amount is untrusted text: a number too long to be a counter's increase counts as one match
    (and never raises: int() refuses strings over 4300 digits)."""
    (hit,) = builtin.match("nic", "nic mlx5_0/1: counter symbol_error +" + "9" * 5000)
    assert (hit.code, hit.amount) == ("NIC-IB-SYMBOL_ERROR", 1)
    (hit,) = builtin.match("nic", "nic mlx5_0/1: counter symbol_error +40")
    assert hit.amount == 40
