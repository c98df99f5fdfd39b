"""Quarantine rules and the plan from node state to wanted state (pure logic; the breaker: test_breaker)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from faultline.errors import ConfigError
from faultline.models import Action, Component
from workers import rules

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def of(key: str, code: str, *, fatal: bool = True, action: Action = Action.RESTART_BM, count: int = 1,
       component: Component = Component.GPU) -> rules.OpenFault:  # fmt: skip
    return rules.OpenFault(key, code, component, action, fatal, count)


def test_default_rules_cordon_and_taint_fatal_faults_only() -> None:
    want = rules.desired(rules.DEFAULT_RULES, [of("a", "XID-79"), of("b", "XID-13", fatal=False)], {})
    assert want.cordon
    assert want.taints == (("faultline.io/fault", "XID-79", "NoSchedule"),)
    assert dict(want.labels) == {"faultline.io/state": "quarantined"}
    assert want.faults == ("a",)
    assert not rules.desired(rules.DEFAULT_RULES, [of("b", "XID-13", fatal=False)], {}).quarantined


def test_one_taint_per_key_and_effect_from_the_most_severe_fault() -> None:
    faults = [of("a", "XID-48", action=Action.COMPONENT_RESET), of("b", "XID-79", action=Action.RESTART_BM)]
    want = rules.desired(rules.DEFAULT_RULES, faults, {})
    assert want.taints == (("faultline.io/fault", "XID-79", "NoSchedule"),)  # the heavier action wins
    assert want.faults == ("a", "b")


def test_rules_match_on_fields_and_node_labels(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n"
        "  - name: flapping\n"
        "    match: {code: [NIC-FLAPPING], min_count: 3, node_labels: {pool: training}}\n"
        "    labels: {example.com/nic: degraded}\n"
        "    taints: [{key: example.com/nic, value: '{code}', effect: PreferNoSchedule}]\n"
    )
    loaded = rules.load_rules(path)
    flap = of("n", "NIC-FLAPPING", fatal=False, count=3, component=Component.NIC)
    want = rules.desired(loaded, [flap], {"pool": "training"})
    assert not want.cordon
    assert want.taints == (("example.com/nic", "NIC-FLAPPING", "PreferNoSchedule"),)
    assert dict(want.labels)["example.com/nic"] == "degraded"
    assert not rules.desired(loaded, [flap], {"pool": "inference"}).quarantined
    assert not rules.desired(loaded, [of("n", "NIC-FLAPPING", count=2)], {"pool": "training"}).quarantined


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "rules:\n  - name: x\n    cordon: yes\n    colour: red\n",
            r"rules\.0\.colour \(rule 'x'\): Extra inputs",
        ),
        ("rules:\n  - name: x\n    taints: [{key: k, effect: Sometimes}]\n", r"rules\.0\.taints\.0\.effect"),
        ("rules:\n  - name: x\n    labels: {a: 'not a value!'}\n", "is not a label value"),
        ("rules:\n  - name: x\n  - name: x\n", "rule names must be unique: x"),
        ("rules: [\n", "cannot read quarantine rules"),
    ],
)
def test_bad_rules_name_the_file_rule_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        rules.load_rules(path)
    assert str(path) in str(info.value)


FAULT_TAINT = ("faultline.io/fault", "XID-79", "NoSchedule")
WANT = rules.Desired(True, (FAULT_TAINT,), (("faultline.io/state", "quarantined"),), ("a",))


def test_plan_takes_and_gives_back_exactly_what_faultline_added() -> None:
    bare = rules.NodeState(False, (), {"pool": "x"}, rules.Owned())
    p = rules.plan(bare, WANT)
    assert p.changed and p.unschedulable and p.taints == (FAULT_TAINT,)
    assert p.set_labels == {"faultline.io/state": "quarantined"}
    assert p.owned == rules.Owned(True, (FAULT_TAINT,), ("faultline.io/state",))
    held = rules.NodeState(True, (FAULT_TAINT,), {"pool": "x", "faultline.io/state": "quarantined"}, p.owned)
    assert not rules.plan(held, WANT).changed  # idempotent
    back = rules.plan(held, rules.Desired())
    assert (back.unschedulable, back.taints, back.remove_labels, back.owned) == (
        False, (), ("faultline.io/state",), rules.Owned(),
    )  # fmt: skip


def test_plan_leaves_what_others_set() -> None:
    operator = ("ops.example.com/maintenance", "", "NoSchedule")
    cordoned = rules.NodeState(True, (operator,), {"team": "a"}, rules.Owned())
    p = rules.plan(cordoned, WANT)
    assert not p.owned.cordoned  # the operator's cordon is not faultline's
    assert set(p.taints) == {operator, FAULT_TAINT}
    held = rules.NodeState(True, p.taints, {"team": "a", "faultline.io/state": "quarantined"}, p.owned)
    back = rules.plan(held, rules.Desired())
    assert back.unschedulable  # stays cordoned
    assert back.taints == (operator,)
    # someone else's taint in faultline's slot is kept and not adopted
    theirs = ("faultline.io/fault", "MANUAL", "NoSchedule")
    p = rules.plan(rules.NodeState(False, (theirs,), {}, rules.Owned()), WANT)
    assert p.taints == (theirs,) and p.owned.taints == ()


def test_hold_annotations_come_and_go_with_the_hold_and_others_stay() -> None:
    """Karpenter's do-not-disrupt (and the like) while faultline holds the node: put on with the hold,
    removed at release, recorded as faultline's; one a person set first is theirs, kept after release."""
    dnd, ca = (
        ("karpenter.sh/do-not-disrupt", "true"),
        ("cluster-autoscaler.kubernetes.io/scale-down-disabled", "true"),
    )
    want = dataclasses.replace(WANT, annotations=(ca, dnd))
    p = rules.plan(rules.NodeState(False, (), {}, rules.Owned()), want)
    assert p.set_annotations == dict([ca, dnd]) and p.owned.annotations == (ca[0], dnd[0])
    assert p.owned.as_json()["annotations"] == [ca[0], dnd[0]]
    assert rules.Owned.from_json(p.owned.as_json()) == p.owned
    held = rules.NodeState(True, p.taints, {"faultline.io/state": "quarantined"}, p.owned, dict([ca, dnd]))
    assert not rules.plan(held, want).changed
    back = rules.plan(held, rules.Desired())
    assert back.remove_annotations == (ca[0], dnd[0]) and back.owned == rules.Owned() and back.changed
    # a person's do-not-disrupt, there before the hold: not adopted, not removed
    theirs = rules.NodeState(False, (), {}, rules.Owned(), {dnd[0]: "true"})
    p = rules.plan(theirs, want)
    assert p.set_annotations == dict([ca]) and p.owned.annotations == (ca[0],)
    held = rules.NodeState(True, p.taints, {"faultline.io/state": "quarantined"}, p.owned, dict([ca, dnd]))
    assert rules.plan(held, rules.Desired()).remove_annotations == (ca[0],)
    # a hold recorded before annotations existed gets them, and its record reads as before
    assert "annotations" not in rules.Owned(True).as_json()
    assert rules.plan(
        rules.NodeState(True, p.taints, {}, rules.Owned(True), {}), want
    ).set_annotations == dict([ca, dnd])
