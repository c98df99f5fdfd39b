"""Which repair a faulted node gets (pure): the fault's action, escalated when repairs did not help.

The ladder starts where the fault's action points and climbs one step each time a repair of that step
failed to clear the fault (the janitor records each repair's outcome):

    COMPONENT_RESET -> GPU_RESET -> REBOOT -> last step
    RESTART_VM / RESTART_BM -> REBOOT -> last step
    REPLACE_VM -> REPLACE (when a cloud provider is configured) -> CONTACT_SUPPORT
    CONTACT_SUPPORT -> CONTACT_SUPPORT (no automatic action: the node stays quarantined)

The last step is REPLACE where the node can be replaced through a cloud provider, else CONTACT_SUPPORT.
Caps: a fault that has had `max_attempts_per_fault` repairs, or a node with more than `repeat_offender`
repairs inside `window` (a repeat offender), goes straight to the last step (`capped`; the janitor
refuses a person's request below the last step for the same reasons). Actions NONE and RESTART_APP
need no node repair.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from faultline import config
from faultline.models import Action, RepairOutcome, RepairStep

# the ladder's steps (`faultline.models.RepairStep`, the values rounds store)
GPU_RESET, REBOOT, REPLACE = RepairStep.GPU_RESET, RepairStep.REBOOT, RepairStep.REPLACE
CONTACT_SUPPORT = RepairStep.CONTACT_SUPPORT
FAILED_OUTCOMES = frozenset({RepairOutcome.FAILED, RepairOutcome.TIMED_OUT, RepairOutcome.NOT_CLEARED})
CANCELLED = RepairOutcome.CANCELLED  # a person's request deleted before the janitor started it: no repair


Caps = config.RepairCaps  # the ladder's limits, defined once with the remediation settings


@dataclass(frozen=True)
class Repair:
    """A repair done before, as recorded: which step, for which faults, when, and how it ended."""

    step: RepairStep
    fault_keys: tuple[str, ...]
    at: dt.datetime
    outcome: RepairOutcome


def last_step(caps: Caps) -> RepairStep:
    return REPLACE if caps.can_replace else CONTACT_SUPPORT


def capped(fault_keys: Iterable[str], history: Iterable[Repair], caps: Caps, now: dt.datetime) -> str | None:
    """Why the node (or these faults) may have no more repairs below the ladder's last step, or None:
    a repeat offender (more than `repeat_offender` repairs inside `window`), or faults repaired
    `max_attempts_per_fault` times already. Cancelled requests were no repairs."""
    keys = set(fault_keys)
    past = [r for r in history if r.outcome != CANCELLED]
    recent = [r for r in past if now - r.at <= caps.window]
    mine = [r for r in past if keys & set(r.fault_keys)]
    if len(recent) > caps.repeat_offender:
        return f"repeat offender: {len(recent)} repairs in {caps.window}"
    if len(mine) >= caps.max_attempts_per_fault:
        return f"{len(mine)} repairs did not clear these faults"
    return None


def ladder(action: Action, caps: Caps) -> list[RepairStep]:
    last = last_step(caps)
    steps = {
        Action.COMPONENT_RESET: [GPU_RESET, REBOOT, last],
        Action.RESTART_VM: [REBOOT, last],
        Action.RESTART_BM: [REBOOT, last],
        Action.REPLACE_VM: [REPLACE, CONTACT_SUPPORT] if caps.can_replace else [CONTACT_SUPPORT],
        Action.CONTACT_SUPPORT: [CONTACT_SUPPORT],
    }.get(action, [])
    out: list[RepairStep] = []
    for step in steps:
        if step not in out:
            out.append(step)
    return out


@dataclass(frozen=True)
class Decision:
    step: RepairStep | None  # None: no repair needed
    reason: str


def decide(
    action: Action, fault_keys: Iterable[str], history: Iterable[Repair], caps: Caps, now: dt.datetime
) -> Decision:
    """The repair for a node's faults (`action`: the heaviest of them) given the node's past repairs."""
    steps = ladder(action, caps)
    if not steps:
        return Decision(None, f"action {action.value} needs no node repair")
    keys = set(fault_keys)
    past = [r for r in history if r.outcome != CANCELLED]
    mine = [r for r in past if keys & set(r.fault_keys)]
    why_capped = capped(keys, past, caps, now)
    if why_capped is not None:
        return Decision(steps[-1], why_capped)
    position = 0
    for repair in mine:  # climb one step per failed repair at or above the current step
        if repair.outcome in FAILED_OUTCOMES and repair.step in steps:
            position = max(position, min(len(steps) - 1, steps.index(repair.step) + 1))
    step = steps[position]
    why = (
        f"escalated after {steps[position - 1]} did not clear the fault"
        if position
        else f"from {action.value}"
    )
    return Decision(step, why)
