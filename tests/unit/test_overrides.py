"""Operator overrides of quarantine (workers.overrides): the pure decisions."""

from __future__ import annotations

import datetime as dt

import pytest

from faultline.models import Action, Component
from workers import overrides, rules

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
TAINT = (rules.FAULT_TAINT, "XID-79", "NoSchedule")


def fault(key: str = "f1", code: str = "XID-79") -> rules.OpenFault:
    return rules.OpenFault(key, code, Component.GPU, Action.RESTART_BM, True, 1, NOW, "done")


def state(*, cordoned: bool, taints: tuple[tuple[str, str, str], ...], owned: rules.Owned,
          labels: dict[str, str] | None = None) -> rules.NodeState:  # fmt: skip
    return rules.NodeState(cordoned, taints, labels or {}, owned)


HELD = rules.Owned(True, (TAINT,), (rules.STATE_LABEL,))


@pytest.mark.parametrize(
    ("cordoned", "taints", "expected"),
    [(True, (TAINT,), False), (False, (TAINT,), True), (True, (), True), (False, (), True)],
)
def test_an_override_is_faultlines_cordon_or_taint_taken_back(
    cordoned: bool, taints: tuple[tuple[str, str, str], ...], expected: bool
) -> None:
    assert overrides.overridden(state(cordoned=cordoned, taints=taints, owned=HELD)) is expected
    assert not overrides.overridden(state(cordoned=False, taints=(), owned=rules.Owned()))  # held nothing


def test_who_is_the_latest_writer_that_is_not_faultline_or_the_cluster() -> None:
    fields = [
        {"manager": "kubectl-label", "operation": "Update", "time": "2026-12-03T10:00:00Z"},
        {"manager": "kubectl-edit", "operation": "Update", "time": "2026-12-03T11:00:00Z"},
        {"manager": "faultline", "operation": "Update", "time": "2026-12-03T11:30:00Z"},
        {"manager": "kube-controller-manager", "operation": "Update", "time": "2026-12-03T11:40:00Z"},
        {
            "manager": "kubelet",
            "operation": "Update",
            "subresource": "status",
            "time": "2026-12-03T11:50:00Z",
        },
    ]
    assert overrides.who(fields) == ("kubectl-edit", "2026-12-03T11:00:00Z")
    assert overrides.who(None) == ("unknown", "")


def test_a_cancellation_names_the_faults_and_goes_when_they_resolve() -> None:
    c = overrides.cancel(["f1", overrides.MANUAL_FAULT], None, [], NOW)
    assert c == overrides.Cancelled(("f1",), "unknown", "2026-12-03T12:00:00Z")
    assert overrides.Cancelled.from_json(c.as_json()) == c
    assert overrides.Cancelled.from_json('{"faults": 3}') is None  # not faultline's record: cancels nothing
    assert overrides.still_cancelled(c, ["f1", "f2"]) == c
    assert overrides.still_cancelled(c, ["f2"]) is None


@pytest.mark.parametrize(
    ("raw", "until", "error"),
    [
        (None, None, None),
        ("2026-12-03T13:00:00Z", dt.datetime(2026, 12, 3, 13, tzinfo=dt.UTC), None),
        ("2026-12-03T14:00:00+01:00", dt.datetime(2026, 12, 3, 13, tzinfo=dt.UTC), None),
        ("2026-12-03T11:00:00Z", None, None),  # over
        ("tomorrow", None, "is not an RFC 3339 time"),
        ("2026-12-03T13:00:00", None, "has no time zone"),
    ],
)
def test_pause_values(raw: str | None, until: dt.datetime | None, error: str | None) -> None:
    got, why = overrides.paused_until(raw, NOW)
    assert got == until
    assert (
        (why is None)
        if error is None
        else (error in (why or "") and overrides.PAUSE_ANNOTATION in (why or ""))
    )


def test_decide_force_over_opt_out_over_pause_over_faults() -> None:
    rule_list = list(rules.DEFAULT_RULES)
    plain = state(cordoned=False, taints=(), owned=rules.Owned())
    d = overrides.decide(rule_list, [fault()], plain, {}, None, NOW)
    assert (d.outcome, d.want.cordon) == ("quarantined", True)
    paused = {overrides.PAUSE_ANNOTATION: "2026-12-03T13:00:00Z"}
    d = overrides.decide(rule_list, [fault()], plain, paused, None, NOW)
    assert (d.outcome, d.want.quarantined, d.paused.cordon) == ("paused", False, True)
    forced = state(cordoned=False, taints=(), owned=rules.Owned(), labels={overrides.FORCE_LABEL: "x"})
    d = overrides.decide(rule_list, [], forced, paused, None, NOW)
    assert d.outcome == "forced" and overrides.MANUAL_TAINT in d.want.taints and d.want.cordon
    opted = state(cordoned=False, taints=(), owned=rules.Owned(), labels={rules.MANAGED_LABEL: "false"})
    assert overrides.decide(rule_list, [fault()], opted, paused, None, NOW).outcome == "opted-out"
    taken_back = state(cordoned=False, taints=(TAINT,), owned=HELD)
    d = overrides.decide(rule_list, [fault()], taken_back, {rules.FAULTS_ANNOTATION: "f1"}, None, NOW)
    assert d.outcome == "cancelled" and d.overridden and d.cancelled is not None
    assert d.cancelled.faults == ("f1",) and not d.want.quarantined
    d = overrides.decide(rule_list, [fault(), fault("f2", "XID-48")], taken_back, {rules.FAULTS_ANNOTATION: "f1"},
                         None, NOW)  # fmt: skip
    assert d.outcome == "quarantined" and d.want.faults == ("f2",)  # a new fault quarantines again
