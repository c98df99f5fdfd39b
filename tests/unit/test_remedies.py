"""The repair ladder: where a fault's action starts it, escalation after repairs that did not help, caps."""

from __future__ import annotations

import datetime as dt

from faultline.models import Action, RepairOutcome, RepairStep
from workers import remedies
from workers.remedies import CONTACT_SUPPORT, GPU_RESET, REBOOT, REPLACE, Caps, Repair

NOW = dt.datetime(2026, 12, 2, 12, tzinfo=dt.UTC)


def repair(step: str, outcome: str, *, keys: tuple[str, ...] = ("f1",), days_ago: float = 1) -> Repair:
    return Repair(RepairStep(step), keys, NOW - dt.timedelta(days=days_ago), RepairOutcome(outcome))


def test_actions_start_their_ladders() -> None:
    caps = Caps()
    assert remedies.decide(Action.COMPONENT_RESET, ["f1"], [], caps, NOW).step == GPU_RESET
    assert remedies.decide(Action.RESTART_BM, ["f1"], [], caps, NOW).step == REBOOT
    assert remedies.decide(Action.CONTACT_SUPPORT, ["f1"], [], caps, NOW).step == CONTACT_SUPPORT
    assert remedies.decide(Action.REPLACE_VM, ["f1"], [], caps, NOW).step == CONTACT_SUPPORT  # no provider
    assert remedies.decide(Action.REPLACE_VM, ["f1"], [], Caps(can_replace=True), NOW).step == REPLACE
    assert remedies.decide(Action.RESTART_APP, ["f1"], [], caps, NOW).step is None
    assert remedies.decide(Action.NONE, ["f1"], [], caps, NOW).step is None


def test_a_repair_that_did_not_clear_the_fault_escalates() -> None:
    caps = Caps(can_replace=True)
    after_reset = remedies.decide(
        Action.COMPONENT_RESET, ["f1"], [repair(GPU_RESET, "NotCleared")], caps, NOW
    )
    assert after_reset.step == REBOOT and "GPU_RESET did not clear" in after_reset.reason
    history = [repair(GPU_RESET, "Failed"), repair(REBOOT, "TimedOut")]
    assert remedies.decide(Action.COMPONENT_RESET, ["f1"], history, caps, NOW).step == REPLACE
    # a success does not escalate; another fault's repairs do not count for this one
    assert (
        remedies.decide(Action.COMPONENT_RESET, ["f1"], [repair(GPU_RESET, "Succeeded")], caps, NOW).step
        == GPU_RESET
    )
    other = [repair(GPU_RESET, "Failed", keys=("f9",))]
    assert remedies.decide(Action.COMPONENT_RESET, ["f1"], other, caps, NOW).step == GPU_RESET


def test_caps_and_repeat_offenders_go_to_the_last_step() -> None:
    caps = Caps(max_attempts_per_fault=2, repeat_offender=3, window=dt.timedelta(days=7))
    tried = [repair(GPU_RESET, "Succeeded"), repair(GPU_RESET, "Succeeded")]
    assert remedies.decide(Action.COMPONENT_RESET, ["f1"], tried, caps, NOW).step == CONTACT_SUPPORT
    busy = [repair(REBOOT, "Succeeded", keys=(f"x{i}",)) for i in range(4)]
    decision = remedies.decide(Action.COMPONENT_RESET, ["f1"], busy, caps, NOW)
    assert decision.step == CONTACT_SUPPORT and "repeat offender" in decision.reason
    old = [repair(REBOOT, "Succeeded", keys=(f"x{i}",), days_ago=30) for i in range(4)]
    assert (
        remedies.decide(Action.COMPONENT_RESET, ["f1"], old, caps, NOW).step == GPU_RESET
    )  # outside the window
