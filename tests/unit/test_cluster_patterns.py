"""Cluster-scope patterns (`patterns.cluster`): the pack language's `scope: cluster`, windows by key over
event time (count, distinct, late and repeated records, expiry), derived faults, checkpoints, examples,
and the analyzer's dataflow in one worker and in two."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bytewax.testing import TestingSink, TestingSource, cluster_main, run_main

from dataflows import cluster as flow
from faultline.errors import PackError
from faultline.models import Action, Component
from patterns import cluster, loader
from patterns.cluster import ClusterPacks, Record, Windows
from tests.unit.feeding import feed_items

T = 1_800_000_000.0

STICKY = """
pack: t
patterns:
  - id: sticky
    scope: cluster
    description: one GPU failing again
    match: {codes: ["XID-79", "XID-9?"]}
    window: {key: [gpu], within: 1h, count: 3}
    fault: {code: GPU-STICKY, component: GPU, entity: {type: GPU, id: "{gpu}"}, fatal: true,
            action: CONTACT_SUPPORT, description: the same GPU failed again}
    examples:
      match:
        - records:
            - {node: n1, code: XID-79, metadata: {gpu_uuid: G1}}
            - {at: 10m, node: n1, code: XID-95, metadata: {gpu_uuid: G1}}
            - {at: 50m, node: n2, code: XID-79, metadata: {gpu_uuid: G1}}
          expect: {code: GPU-STICKY, nodes: [n2], entity_id: G1, count: 3}
      no_match:
        - records:
            - {node: n1, code: XID-79, metadata: {gpu_uuid: G1}}
            - {at: 10m, node: n1, code: XID-79, metadata: {gpu_uuid: G1}}
            - {at: 61m, node: n1, code: XID-79, metadata: {gpu_uuid: G1}}
  - id: zone-burst
    scope: cluster
    description: fatal faults on many nodes of one zone
    match: {codes: ["*"], fatal: true}
    window: {key: ["zone=label:topology.kubernetes.io/zone"], within: 5m, count: 3, distinct: node}
    fault: {code: "ZONE-INCIDENT", entity: {type: ZONE, id: "{zone}"}, nodes: every}
    examples:
      match:
        - records:
            - {node: a, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z1}}
            - {at: 1m, node: b, code: XID-48, fatal: true, labels: {topology.kubernetes.io/zone: z1}}
            - {at: 2m, node: c, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z1}}
          expect: {nodes: [a, b, c], entity_id: z1, count: 3}
      no_match:
        - records:
            - {node: a, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z1}}
            - {at: 1m, node: a, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z1}}
            - {at: 2m, node: b, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z2}}
"""


@pytest.fixture
def packs(write_pack: Callable[[str, str], Path]) -> ClusterPacks:
    return cluster.load([write_pack("t.yaml", STICKY)], builtin=False)


def rec(i: int, node: str, code: str = "XID-79", t: float = 0.0, **kw: Any) -> Record:
    meta = kw.pop("metadata", {"gpu_uuid": "G1"})
    return Record(position=i << 16, kind="events", id=f"e{i}", t=T + t, node=node, code=code,
                  metadata=meta, **kw)  # fmt: skip


def test_a_window_fires_at_its_count_within_its_time_and_keeps_firing_while_it_holds(
    packs: ClusterPacks,
) -> None:
    out = cluster.replay(packs, [rec(1, "n1"), rec(2, "n1", "XID-95", 600), rec(3, "n2", t=3000)])
    assert [(d.code, d.node, d.entity_type, d.entity_id, d.count, d.revision) for d in out] == [
        ("GPU-STICKY", "n2", "GPU", "G1", 3, 3 << 16)
    ]
    d = out[0]
    assert (d.first_seen, d.last_seen, d.records) == (T, T + 3000, ("e1", "e2", "e3"))
    f = d.fault()
    assert (f.fatal, f.action, f.component, f.pattern) == (
        True,
        Action.CONTACT_SUPPORT,
        Component.GPU,
        "sticky",
    )
    assert f.metadata == {"scope": "cluster", "window": "G1", "records": "e1,e2,e3"}
    more = cluster.replay(
        packs, [rec(1, "n1"), rec(2, "n1", t=600), rec(3, "n2", t=3000), rec(4, "n3", t=3100)]
    )
    assert [(d.node, d.count) for d in more] == [("n2", 3), ("n3", 4)]
    # the first record is an hour before the fourth: gone from the window, which still holds 3
    later = cluster.replay(
        packs, [rec(1, "n1"), rec(2, "n1", t=600), rec(3, "n2", t=3000), rec(4, "n2", t=3700)]
    )
    assert [(d.node, d.count, d.records) for d in later] == [("n2", 3, ("e1", "e2", "e3")),
                                                            ("n2", 3, ("e2", "e3", "e4"))]  # fmt: skip


def test_keys_codes_and_missing_fields(packs: ClusterPacks) -> None:
    other_gpu = rec(2, "n1", t=1, metadata={"gpu_uuid": "G2"})
    by_pci = rec(3, "n1", t=2, metadata={}, entity_type="GPU", entity_id="0000:3b:00")  # no UUID: node/PCI
    unmatched = rec(4, "n1", "XID-13", t=3)
    healthy = rec(5, "n1", t=4, healthy=True)
    assert cluster.replay(packs, [rec(1, "n1"), other_gpu, by_pci, unmatched, healthy]) == []
    routed = packs.route(by_pci, T)
    assert [(r.pattern, r.key) for r in routed] == [("sticky", "n1/0000:3b:00")]
    assert packs.route(rec(6, "n1", metadata={}), T) == []  # no GPU identity at all: no window


def test_distinct_counts_values_and_every_node_of_the_window_gets_the_fault(packs: ClusterPacks) -> None:
    zone = {"topology.kubernetes.io/zone": "z1"}
    recs = [rec(1, "a", fatal=True, labels=zone), rec(2, "a", t=10, fatal=True, labels=zone),
            rec(3, "b", t=20, fatal=True, labels=zone), rec(4, "c", t=30, fatal=True, labels=zone)]  # fmt: skip
    out = [d for d in cluster.replay(packs, recs) if d.pattern == "zone-burst"]
    assert [(d.node, d.code, d.entity_id, d.count) for d in out] == [
        ("a", "ZONE-INCIDENT", "z1", 3), ("b", "ZONE-INCIDENT", "z1", 3), ("c", "ZONE-INCIDENT", "z1", 3)
    ]  # fmt: skip


def test_late_and_repeated_records_are_ignored_and_quiet_windows_expire(packs: ClusterPacks) -> None:
    w = Windows(packs)
    [r1] = packs.route(rec(1, "n1", t=4000), T + 4000)
    assert w.add(r1) == []
    [late] = packs.route(rec(2, "n1", t=0), T + 4000)  # over an hour before the feed's newest
    assert w.add(late) == [] and w.late == 1
    [again] = packs.route(rec(1, "n1", t=4000), T + 4000)  # a replay of a record held already
    assert w.add(again) == [] and w.repeats == 1
    assert len(w.windows) == 1
    assert w.expire(T + 4000 + 3599) == 0
    assert w.expire(T + 4000 + 3601) == 1 and w.windows == {}


def test_state_round_trips_through_a_checkpoint(packs: ClusterPacks) -> None:
    w = Windows(packs)
    for r in [rec(1, "n1"), rec(2, "n1", t=60)]:
        for routed in packs.route(r, r.t):
            w.add(routed)
    w.upto = 7 << 16 | 0xFFFF
    state = w.state()
    back = Windows.restore(packs, state)
    assert back.state() == state and back.upto == w.upto and back.watermark == T + 60
    [r3] = packs.route(rec(3, "n2", t=120), T + 120)
    assert [d.count for d in back.add(r3)] == [3]  # the restored windows count on


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("window: {key: [gpu], within: 1h, count: 3}", None),
        ("window: {key: [rack], within: 1h}", "unknown field"),
        ("window: {key: [gpu, gpu], within: 1h}", "names a field twice"),
        ("window: {key: ['zone=label:'], within: 1h}", "name the label"),
        ("window: {key: [gpu], within: 0s}", "duration must be positive"),
        ("window: {key: [node], within: 1h}", "names ['gpu'], not in the window key"),
    ],
)
def test_bad_cluster_patterns_fail_at_load_naming_the_pattern(
    write_pack: Callable[[str, str], Path], change: str, reason: str | None
) -> None:
    text = STICKY.replace("window: {key: [gpu], within: 1h, count: 3}", change)
    path = write_pack("bad.yaml", text)
    if reason is None:
        cluster.load([path], builtin=False)
        return
    with pytest.raises(PackError, match="pattern 'sticky'") as exc:
        cluster.load([path], builtin=False)
    assert reason in str(exc.value)


@pytest.mark.redteam
def test_a_derived_fault_code_must_be_a_taint_value(write_pack: Callable[[str, str], Path]) -> None:
    path = write_pack(
        "long.yaml", STICKY.replace("fault: {code: GPU-STICKY", "fault: {code: 'GPU-STICKY-{gpu}.'")
    )
    with pytest.raises(PackError, match="pattern 'sticky'") as exc:
        cluster.load([path], builtin=False)
    assert "fault.code" in str(exc.value) and "'GPU-STICKY-{gpu}.' (as 'GPU-STICKY-0.'" in str(exc.value)
    assert "is not a valid taint value" in str(exc.value)


def test_a_derived_fault_needs_a_code(write_pack: Callable[[str, str], Path]) -> None:
    """Found by fuzzing: `fault.code: ""` loaded and derived faults without a code (node patterns refuse
    one); one whose template renders empty derives nothing."""
    path = write_pack("nocode.yaml", STICKY.replace("fault: {code: GPU-STICKY", 'fault: {code: ""'))
    with pytest.raises(PackError, match="pattern 'sticky'") as exc:
        cluster.load([path], builtin=False)
    assert "fault.code" in str(exc.value) and "at least 1 character" in str(exc.value)


def test_examples_that_fail_are_reported(write_pack: Callable[[str, str], Path]) -> None:
    path = write_pack(
        "t.yaml",
        STICKY.replace("expect: {code: GPU-STICKY, nodes: [n2]", "expect: {code: GPU-STICKY, nodes: [n1]"),
    )
    packs = cluster.load([path], builtin=False, check=False)
    assert [f.reason for f in cluster.check_examples(packs)] == [
        "example 1: expected nodes=['n1'], got ['n2']"
    ]
    with pytest.raises(PackError, match="expected nodes"):
        cluster.load([path], builtin=False)
    path = write_pack("t2.yaml", STICKY.replace("at: 61m", "at: 59m"))
    assert [f.reason for f in cluster.check_examples(cluster.load([path], builtin=False, check=False))] == [
        "negative example 1 makes GPU-STICKY on n1"
    ]


def test_node_patterns_and_cluster_patterns_live_in_one_pack_apart(
    write_pack: Callable[[str, str], Path],
) -> None:
    node_pattern = """
  - id: hello
    description: a node pattern beside the cluster ones
    regex: 'hello (?P<n>\\\\d+)'
    code: HELLO
    examples: {match: ["hello 1"], no_match: ["bye"]}
"""
    path = write_pack("mixed.yaml", STICKY + node_pattern)
    packs = loader.load([path], builtin=False)
    assert list(packs.patterns) == ["hello"] and list(packs.cluster) == ["sticky", "zone-burst"]
    dup = write_pack("dup.yaml", STICKY + node_pattern.replace("id: hello", "id: sticky"))
    with pytest.raises(PackError, match="duplicate pattern id"):
        loader.load([dup], builtin=False)


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        self.now += dt.timedelta(seconds=1)
        return self.now


@pytest.mark.parametrize(("workers", "chunks"), [(1, 1), (2, 1), (2, 3)])
def test_the_dataflow_derives_and_checkpoints_in_one_worker_and_in_two(
    packs: ClusterPacks, workers: int, chunks: int
) -> None:
    """Two workers decode a read's chunks each; either way the same faults and checkpoints."""
    records = [rec(1, "n1"), rec(2, "n1", t=60), rec(3, "n2", t=120), rec(4, "n3", t=180)]
    got: list[Any] = []
    f = flow.build(packs, TestingSource(feed_items(records, per_read=3, chunks=chunks)), TestingSink(got),
                   checkpoints={}, checkpoint_interval=0.0)  # fmt: skip
    if workers == 1:
        run_main(f)
    else:
        cluster_main(f, [], 0, worker_count_per_proc=2)
    faults = [v for k, v in got if k == "fault"]
    assert [(d.node, d.count) for d in faults] == [("n2", 3), ("n3", 4)]
    checkpoints = {p: s for k, (p, s) in ((k, v) for k, v in got if k == "checkpoint")}
    assert set(checkpoints) == set(range(cluster.PARTITIONS))  # every partition saw the ticks
    assert {s["upto"] for s in checkpoints.values()} == {4 << 16 | 0xFFFF}

    # restarted from those checkpoints and fed again from the start (as after a crash): nothing twice
    again: list[Any] = []
    f = flow.build(packs, TestingSource(feed_items([*records, rec(5, "n4", t=240)], per_read=3)), TestingSink(again),
                   checkpoints=checkpoints, checkpoint_interval=0.0)  # fmt: skip
    run_main(f)
    assert [(v.node, v.count) for k, v in again if k == "fault"] == [("n4", 5)]


def test_a_partition_checkpoints_when_its_interval_passed_or_the_feed_went_quiet(packs: ClusterPacks) -> None:
    clock = Clock()
    logic = flow.PartitionLogic(packs, {}, interval=5.0, clock=clock)
    tick = ("t", 3, (0, 0, (1 << 16) | 0xFFFF, T, []))  # read 0, in no chunk (nothing to wait for)
    assert logic.on_item(tick) == ([], False)  # 1 s since it started: not yet
    assert logic.notify_at() == dt.datetime(2026, 12, 1, 0, 0, 6, tzinfo=dt.UTC)
    out, _ = logic.on_notify()
    assert [(k, p, s["upto"]) for k, (p, s) in out] == [("checkpoint", 3, (1 << 16) | 0xFFFF)]
    assert logic.notify_at() is None  # nothing new since
    again = ("t", 3, (1, 0, (1 << 16) | 0xFFFF, T, []))  # the next read, at the same place
    assert logic.on_item(again) == ([], False) and logic.next_read == 2  # nothing new: no checkpoint
    assert logic.on_eof() == ([], False)


def test_a_partition_takes_a_read_in_once_every_chunk_of_it_is_done_and_reads_in_order(
    packs: ClusterPacks,
) -> None:
    """Chunks decoded on other workers may come after their read's tick, and a later read's tick before
    an earlier one: `upto` moves only over reads whose every chunk is done there, in the reads' order."""
    logic = flow.PartitionLogic(packs, {}, interval=0.0)
    first = (1 << 16) | 0xFFFF
    second = (3 << 16) | 0xFFFF

    def upto() -> int:
        return logic.windows.upto if logic.windows is not None else -1

    assert logic.on_item(("t", 5, (1, 1, second, T + 60, [{"writer": "n1", "n": 3}]))) == ([], False)
    assert logic.on_item(("t", 5, (0, 2, first, T, [{"writer": "n1", "n": 1}]))) == ([], False)
    assert logic.on_item(("d", 5, 0)) == ([], False) and upto() == 0  # read 0 has one chunk to come
    assert logic.on_item(("d", 5, 1)) == ([], False) and upto() == 0  # read 1's chunk: read 0 first
    out, _ = logic.on_item(("d", 5, 0))  # read 0 whole: both reads are taken in, in order
    assert [(p, s["upto"], s["feed"]) for _, (p, s) in out] == [
        (5, first, [{"writer": "n1", "n": 1}]), (5, second, [{"writer": "n1", "n": 3}])
    ]  # fmt: skip
    assert upto() == second and logic.ticks == {} and logic.done == {}


def test_windows_count_against_the_feeds_newest_time_so_partitions_and_expiry_change_nothing(
    packs: ClusterPacks,
) -> None:
    """G1 failed at 0 and G2 at 4000 s; G1's failures at 3400 and 3500 s are within the hour before
    4000 s but the one at 0 is not: two in the window, no fault, whether G1's window had expired or not."""
    recs = [rec(1, "n1"), rec(2, "n2", t=4000, metadata={"gpu_uuid": "G2"}), rec(3, "n1", t=3400),
            rec(4, "n1", t=3500)]  # fmt: skip
    assert cluster.replay(packs, recs) == []
    w = Windows(packs)
    wm = float("-inf")
    for r in recs:
        wm = max(wm, r.t)
        for routed in packs.route(r, wm):
            w.add(routed)
            w.expire(wm)  # as often as can be
    assert [len(win.entries) for (_, key), win in sorted(w.windows.items())] == [2, 1]  # G1, G2


def fault_change(i: int, node: str, fault: str, opened: float, t: float, **kw: Any) -> Record:
    return Record(position=i << 16, kind="faults", id=f"{fault}@{i}", t=T + t, node=node, code="XID-79",
                  fatal=True, state="open", opened=T + opened, **kw)  # fmt: skip


def test_an_episode_is_one_fault_from_its_opening_however_often_it_is_updated() -> None:
    opened = fault_change(1, "n1", "f1", 0, 0)
    updated = fault_change(2, "n1", "f1", 0, 60)  # the same fault, its count grown
    reopened = fault_change(3, "n1", "f1", 3600, 3600)  # resolved, then open again: a new episode
    values = [cluster.field_value(r, "episode") for r in (opened, updated, reopened)]
    assert values[0] == values[1] != values[2]
    assert values[0] == f"f1@{T:.3f}"
    assert cluster.field_value(rec(4, "n1"), "episode") is None  # an event has none


def test_the_built_in_cluster_pack_repeats_a_node_once_per_opening_not_per_update() -> None:
    packs = cluster.load()  # the built-in pack, its examples checked
    assert {"gpu-repeated-failure", "node-repeated-failure", "workload-app-xid", "nvlink-domain-fault",
            "switch-link-flaps", "zone-incident"} <= set(packs.patterns)  # fmt: skip
    day = 86400.0
    updates = [fault_change(i, "n1", "f1", 0, i * 60) for i in range(1, 10)]  # one fault, nine revisions
    assert [d for d in cluster.replay(packs, updates) if d.pattern == "node-repeated-failure"] == []
    openings = [fault_change(i, "n1", f"f{i % 2}", i * day, i * day) for i in range(5)]
    out = [d for d in cluster.replay(packs, openings) if d.pattern == "node-repeated-failure"]
    assert [(d.node, d.code, d.entity_id, d.count, d.action) for d in out] == [
        ("n1", "NODE-REPEATED-FAILURE", "n1", 5, Action.REPLACE_VM)
    ]


def test_a_key_value_holding_the_key_separator_is_counted_with_a_replacement(packs: ClusterPacks) -> None:
    """Found by fuzzing (test_fuzz_cluster_packs): a value with \\x1f in it (an event's metadata is
    anyone's text) split into more names than the window key has when the window fired: a ValueError
    out of the analyzer's partition, and out of `cluster.load` for an example record holding one."""
    odd = {"gpu_uuid": "G\x1f1"}
    out = cluster.replay(packs, [rec(i, "n1", t=i, metadata=odd) for i in (1, 2, 3)])
    assert [(d.code, d.entity_id, d.key, d.count) for d in out] == [("GPU-STICKY", "G\ufffd1", "G\ufffd1", 3)]
    assert out[0].fault().metadata["window"] == "G\ufffd1"


def test_a_pattern_without_a_usable_id_is_named_by_its_place_in_the_file(
    write_pack: Callable[[str, str], Path],
) -> None:
    """Found by fuzzing: `id: ""` gave a PackError whose pattern was '' (its message named none); `id:
    null` gave one named 'None'; and the place counted within the pattern's scope, not the file."""
    node_pattern = """
  - id: null
    description: a node pattern beside the cluster ones
    regex: 'hello'
    code: HELLO
    examples: {match: ["hello"], no_match: ["bye"]}
"""
    path = write_pack(
        "noid.yaml", STICKY.replace("id: zone-burst", 'id: ""') + node_pattern.replace("null", "hello")
    )
    with pytest.raises(PackError) as exc:
        cluster.load([path], builtin=False)
    assert exc.value.pattern_id == "#2" and ": pattern '#2': id: String should match" in str(exc.value)
    path = write_pack("noid.yaml", STICKY + node_pattern)
    with pytest.raises(PackError) as exc:
        cluster.load([path], builtin=False)
    assert exc.value.pattern_id == "#3" and ": pattern '#3': id: Input should be a valid" in str(exc.value)
