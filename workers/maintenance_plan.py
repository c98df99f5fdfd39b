"""When a cloud maintenance fault is raised, resolved, and its event acknowledged (pure; time passed in).

For one node, from what its provider announces now, the node itself (there, Ready, its boot id) and the
maintenance faults open on it (their stored `Raised` record), per kind of maintenance:

- **raise**: an announced event (scheduled or started) is raised as a fault `lead_time` before its window
  starts (at once when it has started, or its start is unknown), so quarantine and drain are done before
  the provider takes the node down. Events of one kind on one node are one fault: the earliest window.
- **keep**: while it is announced, the fault stays open; its record follows the events (ids, window).
- **cancelled**: an event the provider marks cancelled (EC2's `[Canceled]`): the fault resolves at once.
- **over**: no longer announced otherwise (completed, or gone from the list): the fault resolves once
  the node is Ready again and, for kinds that take the node down (`Kind.restarts`), is back with a new
  boot id, or has stayed Ready with its boot id for `settle` since the event went (a maintenance that
  needed no restart, or an announcement withdrawn: resolved as `cancelled` when it went before its
  window, never started, was not asked to start early, and the boot id never changed). An event that
  merely vanished is not taken for a cancellation at once: OCI clears its due time as the instance stops
  (also when its owner stops it before the due time), before the Node shows it NotReady.
- **gone**: the Node no longer exists (an instance retired and replaced): its faults resolve.
- **acknowledge** (providers that take it: Azure's `StartRequests`): once the node is drained in its
  current quarantine, an event of a kind that quarantines is asked to start now instead of at its
  `NotBefore`, so the node is back sooner. Only scheduled events, each once (the record keeps when).

When the provider could not be read this time (`announced` is None) nothing changes but for a Node that
is gone: a fault is never resolved on missing information.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from workers.announcements import CANCELLED, KINDS, STARTED, Announcement

ACKNOWLEDGES = frozenset({"azure"})  # providers whose events can be asked to start early
WHAT = 512  # characters of an announcement's text kept with its fault (in the fault's metadata)


@dataclass(frozen=True)
class Settings:
    lead_time: dt.timedelta = dt.timedelta(hours=1)
    settle: dt.timedelta = dt.timedelta(minutes=10)
    quarantine_kinds: frozenset[str] = frozenset({"REBOOT", "REDEPLOY", "TERMINATE"})
    acknowledge: bool = True


@dataclass(frozen=True)
class NodeState:
    exists: bool
    ready: bool = False
    boot_id: str = ""


@dataclass(frozen=True)
class Raised:
    """What is recorded with an open maintenance fault (in its metadata): the events behind it, the
    window's start, the node's boot id when it was raised, when the events ended (None: still announced),
    when they were asked to start early, and whether one was seen started."""

    provider: str
    events: tuple[str, ...]
    not_before: dt.datetime | None
    not_after: dt.datetime | None = None
    boot_id: str = ""
    what: str = ""
    over_since: dt.datetime | None = None
    acknowledged: dt.datetime | None = None
    started: bool = False


@dataclass(frozen=True)
class Step:
    """One change for one kind: `raise` (a new fault), `update` (its record changed), `resolve`."""

    op: str  # raise | update | resolve
    kind: str
    record: Raised
    reason: str = ""  # resolve: cancelled | over | gone


@dataclass(frozen=True)
class NodePlan:
    steps: list[Step] = field(default_factory=list)
    acknowledge: list[str] = field(default_factory=list)  # event ids to ask to start now


def plan(
    now: dt.datetime, node: NodeState, announced: Iterable[Announcement] | None,
    raised: Mapping[str, Raised], *, drained: bool, settings: Settings,
) -> NodePlan:  # fmt: skip
    """The node's changes (see the module docstring). `raised`: its open maintenance faults by kind;
    `drained`: the node is drained in its current quarantine episode."""
    out = NodePlan()
    if not node.exists:
        out.steps.extend(Step("resolve", kind, rec, "gone") for kind, rec in sorted(raised.items()))
        return out
    if announced is None:
        return out
    events = list(announced)
    for kind in sorted({a.kind for a in events} | set(raised)):
        mine = [a for a in events if a.kind == kind]
        active = [a for a in mine if a.active]
        rec = raised.get(kind)
        if rec is None:
            if active and _due(now, active, settings.lead_time):
                out.steps.append(Step("raise", kind, _record(active, node.boot_id)))
            continue
        if active:
            _keep(now, kind, rec, active, drained, settings, out)
            continue
        ended = [a for a in mine if a.event_id in rec.events]
        if ended and all(a.state == CANCELLED for a in ended):
            out.steps.append(Step("resolve", kind, rec, "cancelled"))
            continue
        over = rec if rec.over_since is not None else replace(rec, over_since=now)
        assert over.over_since is not None
        rebooted = node.boot_id not in ("", rec.boot_id)
        back = node.ready and (
            not KINDS[kind].restarts or rebooted or now - over.over_since >= settings.settle
        )
        if back:
            withdrawn = (
                not rebooted and not rec.started and rec.acknowledged is None and rec.not_before is not None
                and over.over_since < rec.not_before and not ended
            )  # fmt: skip
            out.steps.append(Step("resolve", kind, over, "cancelled" if withdrawn else "over"))
        elif over is not rec:
            out.steps.append(Step("update", kind, over))
    return out


def _due(now: dt.datetime, active: list[Announcement], lead: dt.timedelta) -> bool:
    starts = [a.not_before for a in active]
    if any(a.state == STARTED for a in active) or any(s is None for s in starts):
        return True
    return now >= min(s for s in starts if s is not None) - lead


def _record(active: list[Announcement], boot_id: str, base: Raised | None = None) -> Raised:
    """The record of a kind's announced events: the earliest window, every event id."""
    first = min(active, key=lambda a: (a.not_before is not None, a.not_before or dt.datetime.min))
    ends = [a.not_after for a in active if a.not_after is not None]
    events = tuple(sorted({a.event_id for a in active}))
    not_after = max(ends) if ends else None
    rec = base if base is not None else Raised(first.provider, events, first.not_before, boot_id=boot_id)
    started = rec.started or any(a.state == STARTED for a in active)
    return replace(
        rec, provider=first.provider, events=events, not_before=first.not_before, not_after=not_after,
        what=first.what[:WHAT], over_since=None, started=started,
    )  # fmt: skip


def _keep(
    now: dt.datetime, kind: str, rec: Raised, active: list[Announcement], drained: bool, settings: Settings,
    out: NodePlan,
) -> None:  # fmt: skip
    new = _record(active, rec.boot_id, rec)
    scheduled = sorted(a.event_id for a in active if a.state != STARTED)
    if (
        settings.acknowledge and drained and new.acknowledged is None and scheduled
        and new.provider in ACKNOWLEDGES and kind in settings.quarantine_kinds
    ):  # fmt: skip
        new = replace(new, acknowledged=now)
        out.acknowledge.extend(scheduled)
    if new != rec:
        out.steps.append(Step("update", kind, new))
