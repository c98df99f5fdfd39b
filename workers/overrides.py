"""Operator overrides of quarantine (pure): what a person did to a node, read from the Node itself.

- **An uncordon cancels.** When faultline's cordon is gone (or a taint faultline added was removed) and
  faultline did not remove it, someone overrode the quarantine: its faults (the ones behind it then) are
  cancelled on that node. They never quarantine it again; a new fault does. The cancellation is kept in
  the node's annotation `faultline.io/cancelled` (`{"faults": [...], "by": manager, "at": time}`, who and
  when from the Node's managedFields where they tell it: the latest write by someone other than
  faultline, the kubelet or the node controller; `kubectl uncordon` removes the field and leaves no
  manager behind, so "unknown" at the time faultline saw it) and dropped once none of its faults is open
  any more.
- **Pause**: the annotation `faultline.io/paused-until: <RFC 3339 time>` makes faultline leave the node
  alone until then: it takes back what it put there and takes no new action, as with the opt-out label
  `faultline.io/managed=false`; afterwards the node's open faults quarantine it again. A value that is not
  a time is reported (a Warning Event naming it) and ignored.
- **Force**: the label `faultline.io/force-quarantine=<reason>` quarantines the node (cordon, taint
  `faultline.io/fault=Manual:NoSchedule`) with no fault at all, so the drainer empties it; no repair
  follows (nothing says what to repair). Removing the label releases it. Force wins over pause and
  over a cancellation.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers import rules

CANCELLED_ANNOTATION = "faultline.io/cancelled"
PAUSE_ANNOTATION = "faultline.io/paused-until"
FORCE_LABEL = "faultline.io/force-quarantine"
MANUAL_FAULT = "manual"  # the fault key a forced quarantine is recorded under
MANUAL_TAINT = (rules.FAULT_TAINT, "Manual", "NoSchedule")
# outcomes of `decide` besides rules' own ("quarantined", "released")
OPTED_OUT, PAUSED, CANCELLED, FORCED = "opted-out", "paused", "cancelled", "forced"
# managers whose writes are not a person's: faultline's own transports, the kubelet, the node controller
_SYSTEM_MANAGERS = ("faultline", "kubelet", "kube-controller-manager", "kube-scheduler")


@dataclass(frozen=True)
class Cancelled:
    """The faults an operator's override cancelled on a node, who (a field manager) and when."""

    faults: tuple[str, ...]
    by: str = "unknown"
    at: str = ""  # RFC 3339, from managedFields ("" when the API did not say)

    def as_json(self) -> str:
        return json.dumps({"faults": list(self.faults), "by": self.by, "at": self.at}, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | None) -> Cancelled | None:
        """The annotation's record; None when absent or not faultline's (a damaged one cancels nothing)."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
            faults = tuple(str(f) for f in data["faults"])
        except (ValueError, TypeError, KeyError):
            return None
        return cls(faults, str(data.get("by", "unknown")), str(data.get("at", "")))


def overridden(state: rules.NodeState) -> bool:
    """Has someone taken back what faultline put on the node (its cordon, or one of its taints)?"""
    owned = state.owned
    if owned.cordoned and not state.unschedulable:
        return True
    present = set(state.taints)
    return any(t not in present for t in owned.taints)


def who(managed_fields: Sequence[Mapping[str, Any]] | None) -> tuple[str, str]:
    """(manager, time) of the latest write to the Node's spec or metadata by someone other than
    faultline and the cluster's own components; ("unknown", "") when the API does not say."""
    best: tuple[str, str] = ("unknown", "")
    for entry in managed_fields or ():
        manager = str(entry.get("manager", ""))
        if entry.get("subresource") or not manager or manager.startswith(_SYSTEM_MANAGERS):
            continue
        at = str(entry.get("time", ""))
        if at >= best[1]:
            best = (manager, at)
    return best


def cancel(
    held: Iterable[str], previous: Cancelled | None, managed_fields: Sequence[Mapping[str, Any]] | None,
    now: dt.datetime,
) -> Cancelled:  # fmt: skip
    """The cancellation after an override of a quarantine held for the faults `held` (adding to one
    already recorded). Who: the managedFields' latest writer when the API kept one (`kubectl
    uncordon` sends `unschedulable: null`, which leaves no manager behind: "unknown"); when: its write,
    else the time faultline saw it."""
    by, at = who(managed_fields)
    at = at or now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    faults = set(held) - {MANUAL_FAULT} | set(previous.faults if previous else ())
    return Cancelled(tuple(sorted(faults)), by, at)


def still_cancelled(cancelled: Cancelled | None, open_keys: Iterable[str]) -> Cancelled | None:
    """The record, kept while any of its faults is still open (None: drop the annotation)."""
    if cancelled is None:
        return None
    keys = set(open_keys)
    left = tuple(f for f in cancelled.faults if f in keys)
    return Cancelled(left, cancelled.by, cancelled.at) if left else None


def paused_until(raw: str | None, now: dt.datetime) -> tuple[dt.datetime | None, str | None]:
    """(the end of a pause in force, or None; an error naming the bad value, or None)."""
    if raw is None or not raw.strip():
        return None, None
    text = raw.strip()
    try:
        until = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None, (f"annotation {PAUSE_ANNOTATION}={raw!r} is not an RFC 3339 time "
                      "(e.g. 2026-12-04T18:00:00Z); faultline is not paused on this node")  # fmt: skip
    if until.tzinfo is None:
        return None, (f"annotation {PAUSE_ANNOTATION}={raw!r} has no time zone (write e.g. "
                      f"{text}Z); faultline is not paused on this node")  # fmt: skip
    return (until, None) if until > now else (None, None)


def forced(desired: rules.Desired) -> rules.Desired:
    """`desired` with the node cordoned and tainted for a forced quarantine."""
    taints = {(k, e): (k, v, e) for k, v, e in desired.taints}
    taints.setdefault((MANUAL_TAINT[0], MANUAL_TAINT[2]), MANUAL_TAINT)
    labels = dict(desired.labels)
    labels.setdefault(rules.STATE_LABEL, "quarantined")
    return rules.Desired(
        cordon=True, taints=tuple(sorted(taints.values())), labels=tuple(sorted(labels.items())),
        faults=tuple(sorted({*desired.faults, MANUAL_FAULT})),
    )  # fmt: skip


@dataclass(frozen=True)
class Decision:
    want: rules.Desired  # what faultline wants on the node now
    outcome: str  # "quarantined", "released", OPTED_OUT, PAUSED, CANCELLED or FORCED
    cancelled: Cancelled | None  # the node's cancellation record from now on (None: none)
    overridden: bool = False  # an operator took back faultline's cordon or taint just now
    force: str | None = None  # the force label's value
    until: dt.datetime | None = None  # the end of a pause in force
    bad_pause: str | None = None  # the error of a pause annotation that is not a time
    paused: rules.Desired = field(
        default_factory=rules.Desired
    )  # what the node's faults would call for, were it not paused


def decide(
    rule_list: Sequence[rules.Rule], faults: Sequence[rules.OpenFault], state: rules.NodeState,
    annotations: Mapping[str, str], managed_fields: Sequence[Mapping[str, Any]] | None, now: dt.datetime,
) -> Decision:  # fmt: skip
    """What faultline wants on a node from its open faults, the rules and the operator's overrides
    (module docstring): force > opt-out > pause > the faults that were not cancelled."""
    labels = state.labels
    force = labels.get(FORCE_LABEL)
    cancelled = Cancelled.from_json(annotations.get(CANCELLED_ANNOTATION))
    held = state.owned != rules.Owned()
    taken_back = held and force is None and overridden(state)
    if taken_back:
        behind = [k for k in annotations.get(rules.FAULTS_ANNOTATION, "").split(",") if k]
        cancelled = cancel(behind, cancelled, managed_fields, now)
    cancelled = still_cancelled(cancelled, (f.key for f in faults))
    counted = [f for f in faults if cancelled is None or f.key not in cancelled.faults]
    until, bad_pause = paused_until(annotations.get(PAUSE_ANNOTATION), now)
    by_faults = rules.desired(rule_list, counted, labels)
    if force is not None:
        want, outcome = forced(by_faults), FORCED
    elif labels.get(rules.MANAGED_LABEL) == "false":
        want, outcome = rules.Desired(), OPTED_OUT  # only take back what faultline put there before
    elif until is not None:
        want, outcome = rules.Desired(), PAUSED
    else:
        want, outcome = by_faults, ("quarantined" if by_faults.quarantined else "released")
    if taken_back and not want.quarantined:
        outcome = CANCELLED
    return Decision(want, outcome, cancelled, taken_back, force, until, bad_pause, by_faults)
