"""Window rules of the per-node detector, driven by event times passed in (no clock involved)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from faultline.models import FaultState
from patterns import compiler, loader
from patterns.detectors import NodeDetector

PACK = """
pack: test
patterns:
  - id: err
    description: a device error
    regex: "ERR (?P<dev>[a-z0-9]+) (?P<n>\\\\d+)"
    code: "E-{n}"
    component: GPU
    entity: {type: DEV, id: "{dev}"}
    classify:
      - set: {fatal: false, action: RESTART_APP}
      - {table: codes, key: "{n}"}
    then: {first: [E-1], codes: [E-2], within: 60s, code: E-1-2, action: RESTART_BM}
    examples: {match: ["ERR a 1"], no_match: ["ERR A 1"]}
  - id: thr
    description: only a burst counts
    regex: "THR (?P<dev>[a-z0-9]+)"
    code: THR
    entity: {type: DEV, id: "{dev}"}
    classify: [{set: {fatal: true, action: COMPONENT_RESET}}]
    threshold: {count: 3, within: 10s}
    examples: {match: ["THR a"], no_match: ["THR"]}
  - id: down
    description: port down
    regex: "PORT (?P<dev>[a-z0-9]+) DOWN"
    code: PORT-DOWN
    component: NIC
    entity: {type: NIC, id: "{dev}"}
    boot_grace: 60s
    flapping: {count: 3, within: 100s, code: PORT-FLAP}
    examples: {match: ["PORT p1 DOWN"], no_match: ["PORT p1 UP"]}
  - id: up
    description: port up
    kind: clear
    regex: "PORT (?P<dev>[a-z0-9]+) UP"
    entity: {type: NIC, id: "{dev}"}
    clears: {codes: [PORT-DOWN]}
    examples: {match: ["PORT p1 UP"], no_match: ["PORT p1 DOWN"]}
  - id: reset
    description: device reset
    kind: clear
    regex: "RESET (?P<dev>[a-z0-9]+)"
    entity: {type: DEV, id: "{dev}"}
    clears: {codes: ["E-*"], actions: [RESTART_APP, COMPONENT_RESET]}
    examples: {match: ["RESET a"], no_match: ["RESTART a"]}
  - id: lost
    description: device lost without a number
    regex: "LOST (?P<dev>[a-z0-9]+)"
    code: LOST
    entity: {type: DEV, id: "{dev}"}
    classify: [{set: {fatal: true, action: RESTART_BM}}]
    suppressed_by: {codes: [E-9], within: 30s}
    examples: {match: ["LOST a"], no_match: ["LOSS a"]}
  - id: boot
    description: boot
    kind: boot
    regex: "BOOTED"
    prefilter: ["BOOTED"]
    code: BOOT
    clears: {codes: ["*"], actions: [RESTART_BM], scope: node}
    examples: {match: ["BOOTED"], no_match: ["BOOT"]}
tables:
  codes:
    "3": {escalate: {count: 3, within: 60s, action: COMPONENT_RESET}}
    "9": {fatal: true, action: RESTART_BM}
    "7": {ignore: true}
"""

Feed = Callable[[float, str], None]


@pytest.fixture
def detector(write_pack: Callable[[str, str], Path]) -> NodeDetector:
    compiled = compiler.compile_packs(loader.load([write_pack("test.yaml", PACK)], builtin=False))
    return NodeDetector("node-a", compiled)


@pytest.fixture
def feed(detector: NodeDetector) -> Feed:
    def go(ts: float, line: str) -> None:
        hits = detector.compiled.match("syslog", line)
        assert hits or line.startswith("ERR a 7"), f"test line did not match: {line}"
        for hit in hits:
            detector.observe(ts, hit, line)

    return go


def faults(detector: NodeDetector) -> dict[tuple[str, str], tuple[int, bool, str, str]]:
    return {
        (f.entity.id, f.code): (f.count, f.fatal, f.action.value, f.state.value)
        for f in detector.snapshot_faults()
    }


def test_single_match_opens_a_fault(detector: NodeDetector, feed: Feed) -> None:
    feed(100.0, "ERR a 1")
    (fault,) = detector.snapshot_faults()
    assert (fault.node, fault.entity.type, fault.entity.id, fault.code) == ("node-a", "DEV", "a", "E-1")
    assert (fault.count, fault.fatal, fault.action.value, fault.state) == (
        1,
        False,
        "RESTART_APP",
        FaultState.OPEN,
    )
    assert fault.first_seen.timestamp() == 100.0


def test_flood_is_one_fault_with_a_count_and_time_span(detector: NodeDetector, feed: Feed) -> None:
    for i in range(500):
        feed(1000.0 + i, "ERR b 1")
    (fault,) = detector.snapshot_faults()
    assert fault.count == 500
    assert (fault.first_seen.timestamp(), fault.last_seen.timestamp()) == (1000.0, 1499.0)


def test_table_row_can_ignore_a_code(detector: NodeDetector, feed: Feed) -> None:
    feed(1.0, "ERR a 7")
    assert detector.snapshot_faults() == []


@pytest.mark.parametrize(
    ("times", "opened", "count"),
    [
        ([0, 5], False, 0),  # two are not enough
        ([0, 5, 9], True, 3),  # three inside 10 s
        ([0, 5, 11], False, 0),  # three, but over 11 s
        ([0, 20, 25, 29], True, 3),  # the first is outside every window of three
        ([9, 0, 5], True, 3),  # out of order, still one window
    ],
)
def test_threshold_count_in_window(
    detector: NodeDetector, feed: Feed, times: list[float], opened: bool, count: int
) -> None:
    for t in times:
        feed(t, "THR a")
    got = faults(detector)
    assert (("a", "THR") in got) == opened
    if opened:
        assert got["a", "THR"][0] == count
        assert detector.counters.below_threshold == len(times) - count


@pytest.mark.parametrize(
    ("times", "escalated"),
    [
        ([0, 30], False),
        ([0, 30, 59], True),
        ([0, 30, 61], False),
        ([0, 100, 130, 150], True),
    ],
)
def test_escalation_makes_a_repeated_fault_fatal(
    detector: NodeDetector, feed: Feed, times: list[float], escalated: bool
) -> None:
    for t in times:
        feed(t, "ERR a 3")
    count, fatal, action, _ = faults(detector)["a", "E-3"]
    assert count == len(times)
    assert (fatal, action) == ((True, "COMPONENT_RESET") if escalated else (False, "RESTART_APP"))


@pytest.mark.parametrize(
    ("gap", "derived"),
    [(10.0, True), (60.0, True), (61.0, False), (-5.0, False)],
)
def test_a_then_b_within_window(detector: NodeDetector, feed: Feed, gap: float, derived: bool) -> None:
    feed(1000.0, "ERR a 1")
    feed(1000.0 + gap, "ERR a 2")
    got = faults(detector)
    assert (("a", "E-1-2") in got) == derived
    if derived:
        assert got["a", "E-1-2"][1:3] == (True, "RESTART_BM")


def test_a_then_b_needs_the_same_entity(detector: NodeDetector, feed: Feed) -> None:
    feed(0.0, "ERR a 1")
    feed(5.0, "ERR b 2")
    assert ("b", "E-1-2") not in faults(detector)


def test_cancellation_resolves_earlier_faults_only(detector: NodeDetector, feed: Feed) -> None:
    feed(10.0, "ERR a 1")  # RESTART_APP: a reset clears it
    feed(11.0, "ERR a 9")  # RESTART_BM: a reset does not
    feed(12.0, "ERR b 1")  # another device
    feed(20.0, "RESET a")
    feed(30.0, "ERR a 3")  # after the reset: stays open
    got = faults(detector)
    assert got["a", "E-1"][3] == "resolved"
    assert got["a", "E-9"][3] == "open"
    assert got["b", "E-1"][3] == "open"
    assert got["a", "E-3"][3] == "open"
    resolved = {f.code: f.resolved_at for f in detector.snapshot_faults() if f.entity.id == "a"}
    assert resolved["E-1"] is not None and resolved["E-1"].timestamp() == 20.0


def test_a_new_occurrence_reopens_a_resolved_fault(detector: NodeDetector, feed: Feed) -> None:
    feed(10.0, "ERR a 1")
    feed(20.0, "RESET a")
    feed(30.0, "ERR a 1")
    assert faults(detector)["a", "E-1"] == (2, False, "RESTART_APP", "open")


def test_boot_grace_drops_matches_right_after_boot(detector: NodeDetector, feed: Feed) -> None:
    feed(1000.0, "BOOTED")
    feed(1030.0, "PORT p1 DOWN")  # inside the 60 s grace
    assert ("p1", "PORT-DOWN") not in faults(detector)
    assert detector.counters.boot_grace == 1
    feed(1061.0, "PORT p1 DOWN")
    assert faults(detector)["p1", "PORT-DOWN"][0] == 1


def test_boot_hint_from_uptime_starts_grace(detector: NodeDetector) -> None:
    (hit,) = detector.compiled.match("kmsg", "PORT p1 DOWN")
    detector.observe(500.0, hit, "PORT p1 DOWN", boot=470.0)  # 30 s after boot
    assert detector.snapshot_faults() == []


def test_boot_clears_faults_a_reboot_repairs(detector: NodeDetector, feed: Feed) -> None:
    feed(10.0, "ERR a 9")  # RESTART_BM
    feed(11.0, "ERR a 1")  # RESTART_APP: not in the boot pattern's actions
    feed(100.0, "BOOTED")
    got = faults(detector)
    assert got["a", "E-9"][3] == "resolved"
    assert got["a", "E-1"][3] == "open"


@pytest.mark.parametrize(
    ("cycles", "period", "flapping"),
    [(2, 20.0, False), (3, 20.0, True), (3, 50.0, True), (3, 51.0, False), (5, 20.0, True)],
)
def test_flapping_counts_down_up_cycles(
    detector: NodeDetector, feed: Feed, cycles: int, period: float, flapping: bool
) -> None:
    for i in range(cycles):
        feed(1000.0 + i * period, "PORT p1 DOWN")
        feed(1000.0 + i * period + 5, "PORT p1 UP")
    got = faults(detector)
    assert got["p1", "PORT-DOWN"] == (cycles, False, "NONE", "resolved")
    assert (("p1", "PORT-FLAP") in got) == flapping
    if flapping:
        assert got["p1", "PORT-FLAP"][1:] == (True, "CONTACT_SUPPORT", "open")


def test_down_without_up_is_not_a_flap(detector: NodeDetector, feed: Feed) -> None:
    for i in range(5):
        feed(1000.0 + i, "PORT p1 DOWN")
    assert ("p1", "PORT-FLAP") not in faults(detector)


@pytest.mark.parametrize(
    ("first", "second", "lost_kept"),
    [
        ("ERR a 9", "LOST a", False),  # the numbered error came first: LOST is its twin
        ("LOST a", "ERR a 9", False),  # LOST first, numbered error within 30 s: LOST withdrawn
        ("ERR b 9", "LOST a", True),  # another device
    ],
)
def test_suppressed_by_counts_twin_reports_once(
    detector: NodeDetector, feed: Feed, first: str, second: str, lost_kept: bool
) -> None:
    feed(100.0, first)
    feed(110.0, second)
    assert (("a", "LOST") in faults(detector)) == lost_kept


def test_suppressed_by_respects_its_window(detector: NodeDetector, feed: Feed) -> None:
    feed(100.0, "ERR a 9")
    feed(200.0, "LOST a")
    assert ("a", "LOST") in faults(detector)


STREAM = [
    (10.0, "BOOTED"),
    (100.0, "ERR a 3"),
    (101.0, "THR a"),
    (102.0, "THR a"),
    (110.0, "ERR a 3"),
    (120.0, "PORT p1 DOWN"),
    (130.0, "PORT p1 UP"),
    (140.0, "PORT p1 DOWN"),
    (150.0, "ERR a 3"),
    (103.5, "THR a"),
    (160.0, "PORT p1 UP"),
    (170.0, "PORT p1 DOWN"),
    (175.0, "PORT p1 UP"),
    (178.0, "PORT p1 DOWN"),
    (180.0, "ERR a 1"),
    (200.0, "ERR a 2"),
]


@pytest.mark.parametrize("cut", [1, 4, 7, 10, 13])
def test_restored_state_continues_exactly_where_it_stopped(detector: NodeDetector, cut: int) -> None:
    """A detector rebuilt (through pickle, as a recovery snapshot is) from the state after `cut` items
    ends with the same faults as one that saw the whole stream: counts, escalation, thresholds pending
    below their count, flapping cycles and sequences all continue."""

    def run(det: NodeDetector, items: list[tuple[float, str]]) -> None:
        for ts, line in items:
            for hit in det.compiled.match("syslog", line):
                det.observe(ts, hit, line)

    run(detector, STREAM)
    partial = NodeDetector("node-a", detector.compiled)
    run(partial, STREAM[:cut])
    restored = NodeDetector.restore("node-a", detector.compiled, pickle.loads(pickle.dumps(partial.state())))
    run(restored, STREAM[cut:])
    assert faults(restored) == faults(detector)
    assert {f.code for f in detector.snapshot_faults()} >= {"E-3", "THR", "PORT-FLAP", "E-1-2"}


def test_restore_drops_faults_of_patterns_no_longer_loaded(
    detector: NodeDetector, feed: Feed, write_pack: Callable[[str, str], Path]
) -> None:
    feed(100.0, "ERR a 1")
    feed(101.0, "LOST b")
    without_lost = PACK.replace("  - id: lost\n", "  - id: lost2\n")
    compiled = compiler.compile_packs(loader.load([write_pack("test.yaml", without_lost)], builtin=False))
    restored = NodeDetector.restore("node-a", compiled, detector.state())
    assert {f.code: f.pattern for f in restored.snapshot_faults()} == {"E-1": "err"}
