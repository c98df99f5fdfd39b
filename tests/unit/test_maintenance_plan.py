"""When a cloud maintenance fault is raised, kept, resolved and its event acknowledged
(workers.maintenance_plan), with the time passed in."""

from __future__ import annotations

import dataclasses
import datetime as dt

from workers import maintenance_plan as mp
from workers.announcements import Announcement

T0 = dt.datetime(2026, 12, 5, 10, 0, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)
READY = mp.NodeState(exists=True, ready=True, boot_id="boot-1")
SETTINGS = mp.Settings(lead_time=H, settle=10 * M)


def event(kind: str = "REBOOT", state: str = "scheduled", at: dt.datetime | None = T0, *, provider: str = "aws",
          event_id: str = "e-1") -> Announcement:  # fmt: skip
    return Announcement(provider, event_id, kind, state, at, None, f"{provider} {kind}")


def record(kind: str = "REBOOT", **changes: object) -> mp.Raised:
    rec = mp.Raised("aws", ("e-1",), T0, None, "boot-1", f"aws {kind}")
    return dataclasses.replace(rec, **changes)  # type: ignore[arg-type]


def plan(now: dt.datetime, announced: list[Announcement] | None, raised: dict[str, mp.Raised] | None = None,
         node: mp.NodeState = READY, *, drained: bool = False, settings: mp.Settings = SETTINGS) -> mp.NodePlan:  # fmt: skip
    return mp.plan(now, node, announced, raised or {}, drained=drained, settings=settings)


def ops(p: mp.NodePlan) -> list[tuple[str, str, str]]:
    return [(s.op, s.kind, s.reason) for s in p.steps]


def test_raised_lead_time_before_the_window() -> None:
    assert ops(plan(T0 - H - M, [event()])) == []  # announced days ahead: nothing yet
    p = plan(T0 - H, [event()])
    assert ops(p) == [("raise", "REBOOT", "")]
    assert p.steps[0].record == record()  # the window, the events, the boot id it is raised under
    longer = mp.Settings(lead_time=3 * H)
    assert ops(plan(T0 - 2 * H, [event()], settings=longer)) == [("raise", "REBOOT", "")]


def test_raised_at_once_when_started_or_its_start_is_unknown() -> None:
    assert ops(plan(T0 - 5 * H, [event(state="started")])) == [("raise", "REBOOT", "")]
    assert plan(T0 - 5 * H, [event(state="started")]).steps[0].record.started
    assert ops(plan(T0 - 5 * H, [event(at=None)])) == [("raise", "REBOOT", "")]


def test_events_of_one_kind_are_one_fault_with_the_earliest_window() -> None:
    p = plan(T0 - H, [event(event_id="e-2", at=T0 + 5 * H), event()])
    assert ops(p) == [("raise", "REBOOT", "")]
    assert (p.steps[0].record.events, p.steps[0].record.not_before) == (("e-1", "e-2"), T0)
    two = plan(T0, [event(), event("FREEZE", event_id="e-3")])
    assert ops(two) == [("raise", "FREEZE", ""), ("raise", "REBOOT", "")]


def test_ended_events_are_never_raised() -> None:
    assert ops(plan(T0, [event(state="completed"), event(state="cancelled", event_id="e-2")])) == []


def test_kept_while_announced_and_its_record_follows_the_events() -> None:
    assert ops(plan(T0 + M, [event()], {"REBOOT": record()})) == []  # nothing changed: no write
    moved = plan(T0 - 2 * H, [event(at=T0 + 2 * H)], {"REBOOT": record()})
    assert ops(moved) == [("update", "REBOOT", "")]
    assert moved.steps[0].record.not_before == T0 + 2 * H  # rescheduled: still held, the new window
    back = plan(T0, [event()], {"REBOOT": record(over_since=T0 - M)})
    assert ops(back) == [("update", "REBOOT", "")] and back.steps[0].record.over_since is None


def test_a_cancelled_event_resolves_it() -> None:
    raised = {"REBOOT": record()}
    assert ops(plan(T0 - H, [event(state="cancelled")], raised)) == [("resolve", "REBOOT", "cancelled")]


def test_an_event_that_vanished_before_its_window_resolves_after_settle_as_cancelled() -> None:
    """Not at once: OCI clears its due time as the instance stops, also when its owner stops it early,
    and the Node is still Ready for a while then."""
    p = plan(T0 - H, [], {"REBOOT": record()})
    assert ops(p) == [("update", "REBOOT", "")] and p.steps[0].record.over_since == T0 - H
    waiting = {"REBOOT": record(over_since=T0 - H)}
    assert ops(plan(T0 - H + 9 * M, [], waiting)) == []
    assert ops(plan(T0 - H + 10 * M, [], waiting)) == [("resolve", "REBOOT", "cancelled")]
    # one asked to start early, or seen started, did happen: over, not cancelled
    for rec in (record(over_since=T0 - H, acknowledged=T0 - 2 * H), record(over_since=T0 - H, started=True)):
        assert ops(plan(T0 - H + 10 * M, [], {"REBOOT": rec})) == [("resolve", "REBOOT", "over")]
    # stopped early by its owner: the node comes back with a new boot id, which is the maintenance done
    back = mp.NodeState(exists=True, ready=True, boot_id="boot-2")
    assert ops(plan(T0 - H + M, [], waiting, back)) == [("resolve", "REBOOT", "over")]


def test_over_once_the_node_is_back_with_a_new_boot_id() -> None:
    raised = {"REBOOT": record()}
    down = mp.NodeState(exists=True, ready=False, boot_id="boot-1")
    p = plan(T0 + M, [event(state="completed")], raised, down)
    assert ops(p) == [("update", "REBOOT", "")] and p.steps[0].record.over_since == T0 + M
    waiting = {"REBOOT": record(over_since=T0 + M)}
    assert ops(plan(T0 + 2 * M, [], waiting, down)) == []  # nothing new to record
    # Ready, but still its old boot id (its Ready condition lags the instance stopping): not yet
    assert ops(plan(T0 + 3 * M, [], waiting, READY)) == []
    back = mp.NodeState(exists=True, ready=True, boot_id="boot-2")
    assert ops(plan(T0 + 4 * M, [], waiting, back)) == [("resolve", "REBOOT", "over")]
    # a new boot id but not Ready yet: not yet
    assert ops(plan(T0 + 4 * M, [], waiting, dataclasses.replace(back, ready=False))) == []


def test_over_without_a_restart_after_settle() -> None:
    waiting = {"REBOOT": record(over_since=T0)}
    assert ops(plan(T0 + 9 * M, [], waiting)) == []
    assert ops(plan(T0 + 10 * M, [], waiting)) == [("resolve", "REBOOT", "over")]
    # a pause of the running VM takes nothing down: over as soon as it ended and the node is Ready
    freeze = {"FREEZE": record("FREEZE")}
    assert ops(plan(T0 + M, [event("FREEZE", "completed")], freeze)) == [("resolve", "FREEZE", "over")]


def test_a_node_that_is_gone_resolves_its_faults_whatever_was_read() -> None:
    gone = mp.NodeState(exists=False)
    raised = {"TERMINATE": record("TERMINATE"), "FREEZE": record("FREEZE")}
    for announced in ([event("TERMINATE")], None):
        assert ops(plan(T0, announced, raised, gone)) == [("resolve", "FREEZE", "gone"),
                                                            ("resolve", "TERMINATE", "gone")]  # fmt: skip


def test_nothing_changes_when_the_provider_could_not_be_read() -> None:
    assert ops(plan(T0 + H, None, {"REBOOT": record()})) == []


def test_azure_events_are_acknowledged_once_the_node_is_drained() -> None:
    az = [event(provider="azure", at=T0 + 10 * M)]
    raised = {"REBOOT": record(provider="azure")}
    assert plan(T0, az, raised).acknowledge == []  # not drained yet
    p = plan(T0, az, raised, drained=True)
    assert p.acknowledge == ["e-1"]
    assert ops(p) == [("update", "REBOOT", "")] and p.steps[0].record.acknowledged == T0
    acked = {"REBOOT": record(provider="azure", acknowledged=T0)}
    assert plan(T0 + M, az, acked, drained=True).acknowledge == []  # once
    started = [event(provider="azure", state="started", at=T0 + 10 * M)]
    assert plan(T0, started, raised, drained=True).acknowledge == []  # under way already
    assert plan(T0, [event(provider="aws")], {"REBOOT": record()}, drained=True).acknowledge == []
    off = mp.Settings(acknowledge=False)
    assert plan(T0, az, raised, drained=True, settings=off).acknowledge == []
    freeze = [event("FREEZE", provider="azure", at=T0 + 10 * M)]
    kept = {"FREEZE": record("FREEZE", provider="azure")}
    assert plan(T0, freeze, kept, drained=True).acknowledge == []  # a kind that quarantines nothing
