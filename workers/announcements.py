"""Cloud maintenance announcements (pure): what each provider says is coming to an instance, in one
shape, and the fault each kind of maintenance becomes.

    kind       what happens to the node                                   code (CSP-MAINTENANCE-...), action
    REBOOT     the VM restarts where it is (its name and disks kept)      -REBOOT, RESTART_VM
    REDEPLOY   the VM is stopped and started again on other hardware      -REDEPLOY, REPLACE_VM
    TERMINATE  the instance goes away or stays stopped (retirement, Spot)  -TERMINATE, REPLACE_VM
    FREEZE     the VM keeps running, paused for seconds (live migration)  -FREEZE, NONE

The action is the one the event implies (what it takes the node through), not a repair faultline makes:
the provider carries the maintenance out itself, so these faults are marked `repair: provider` and the
remediation worker asks for no repair of them (`faultline.models.PROVIDER_REPAIR`).

Each provider, in its own words:

- AWS EC2 scheduled events (DescribeInstanceStatus, `eventsSet`): `instance-reboot` and `system-reboot`
  REBOOT; `instance-stop` REDEPLOY (an EBS-backed instance started again runs on other hardware);
  `instance-retirement` TERMINATE; `system-maintenance` (network or power work on the host) FREEZE. EC2
  keeps an ended event for a while with its description starting `[Completed]` or `[Canceled]`.
- GCP `instance.upcomingMaintenance` (the Compute API): the instance's `scheduling.onHostMaintenance`
  says what the host's maintenance does to it: MIGRATE (live migration) FREEZE; TERMINATE (GPU instances
  cannot migrate) REBOOT when `automaticRestart`, else TERMINATE (it stays stopped).
  `maintenanceStatus` ONGOING is started. The window is `windowStartTime` to `windowEndTime`.
- Azure Scheduled Events (the node's instance metadata service, relayed by its agent): `Reboot` REBOOT,
  `Redeploy` REDEPLOY, `Freeze` FREEZE, `Preempt` (a Spot eviction) and `Terminate` TERMINATE;
  `EventStatus` Started is started; `NotBefore` (RFC 1123) the earliest start. An event is for this node
  only when its `Resources` name the VM (events reach every VM of an availability set or scale set).
- OCI `instance.timeMaintenanceRebootDue` (the Core API): REBOOT, due at that time; the field is cleared
  once the instance has been stopped.

Readers return (announcements, notes): a note names what could not be understood (an unknown event code
or type, a bad time), which the caller logs; an announcement whose time cannot be read has none, and is
raised at once.
"""

from __future__ import annotations

import datetime as dt
import email.utils
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from faultline.models import Action

SCHEDULED, STARTED, COMPLETED, CANCELLED = "scheduled", "started", "completed", "cancelled"
ACTIVE = (SCHEDULED, STARTED)
CODE_PREFIX = "CSP-MAINTENANCE-"


@dataclass(frozen=True)
class Kind:
    code: str
    action: Action
    restarts: bool  # the node goes down: once it is back, its boot id is a new one
    what: str


KINDS: dict[str, Kind] = {
    "REBOOT": Kind(f"{CODE_PREFIX}REBOOT", Action.RESTART_VM, True, "a reboot"),
    "REDEPLOY": Kind(f"{CODE_PREFIX}REDEPLOY", Action.REPLACE_VM, True, "a move to other hardware"),
    "TERMINATE": Kind(f"{CODE_PREFIX}TERMINATE", Action.REPLACE_VM, True, "the instance's end"),
    "FREEZE": Kind(f"{CODE_PREFIX}FREEZE", Action.NONE, False, "a pause of the running VM"),
}
BY_CODE = {k.code: name for name, k in KINDS.items()}


@dataclass(frozen=True)
class Announcement:
    """One maintenance event a provider announced for one instance."""

    provider: str  # aws | gcp | azure | oci
    event_id: str  # the provider's id where it has one, else one made from the instance and the time
    kind: str  # a key of KINDS
    state: str  # scheduled | started | completed | cancelled
    not_before: dt.datetime | None  # the window's start (None: unknown, treat as now)
    not_after: dt.datetime | None = None  # its end, where the provider says
    what: str = ""  # the provider's own words: its event code or type, and its description

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


Read = tuple[list[Announcement], list[str]]

_EC2 = {
    "instance-reboot": "REBOOT", "system-reboot": "REBOOT", "instance-stop": "REDEPLOY",
    "instance-retirement": "TERMINATE", "system-maintenance": "FREEZE",
}  # fmt: skip
_AZURE = {"Reboot": "REBOOT", "Redeploy": "REDEPLOY", "Freeze": "FREEZE", "Preempt": "TERMINATE",
          "Terminate": "TERMINATE"}  # fmt: skip


def _iso(value: object, where: str, notes: list[str]) -> dt.datetime | None:
    """An RFC 3339 time (`2026-12-05T00:00:00.000Z`), aware UTC; None (noted) when absent or unreadable."""
    if not value:
        return None
    try:
        t = dt.datetime.fromisoformat(str(value))
    except ValueError:
        notes.append(f"{where}: {value!r} is not an RFC 3339 time")
        return None
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def _rfc1123(value: object, where: str, notes: list[str]) -> dt.datetime | None:
    """An RFC 1123 time (`Mon, 19 Sep 2016 18:29:47 GMT`), aware UTC; None (noted) when unreadable."""
    if not value:
        return None
    try:
        t = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        notes.append(f"{where}: {value!r} is not an RFC 1123 time")
        return None
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def from_ec2(events: Iterable[Mapping[str, str]]) -> Read:
    """An instance's `eventsSet` items of DescribeInstanceStatus (their fields as text: `code`,
    `instanceEventId`, `description`, `notBefore`, `notAfter`)."""
    out, notes = [], []
    for e in events:
        code, description = e.get("code", ""), e.get("description", "")
        where = f"EC2 event {e.get('instanceEventId') or code}"
        kind = _EC2.get(code)
        if kind is None:
            notes.append(f"{where}: unknown event code {code!r}")
            continue
        state = SCHEDULED
        if description.startswith("[Completed]"):
            state = COMPLETED
        elif description.startswith("[Canceled]"):
            state = CANCELLED
        not_before = _iso(e.get("notBefore"), where, notes)
        event_id = e.get("instanceEventId") or f"{code}@{e.get('notBefore', '')}"
        not_after = _iso(e.get("notAfter"), where, notes)
        what = f"EC2 {code}: {description}".strip()
        out.append(Announcement("aws", event_id, kind, state, not_before, not_after, what))
    return out, notes


def from_gce(name: str, instance: Mapping[str, Any]) -> Read:
    """An instance of the Compute API (`upcomingMaintenance`, `scheduling`), named `name`."""
    upcoming = instance.get("upcomingMaintenance")
    if not isinstance(upcoming, Mapping) or not upcoming:
        return [], []
    notes: list[str] = []
    where = f"GCE instance {name}: upcomingMaintenance"
    scheduling = instance.get("scheduling") or {}
    on_host = str(scheduling.get("onHostMaintenance") or "MIGRATE")
    if on_host == "MIGRATE":
        kind = "FREEZE"
    elif scheduling.get("automaticRestart", True) is False:
        kind = "TERMINATE"
    else:
        kind = "REBOOT"
    start = upcoming.get("windowStartTime") or upcoming.get("startTimeWindow", {}).get("earliest")
    not_before = _iso(start, where, notes)
    state = STARTED if upcoming.get("maintenanceStatus") == "ONGOING" else SCHEDULED
    kind_word = upcoming.get("type") or "maintenance"
    what = f"GCE {kind_word} host maintenance (onHostMaintenance {on_host})"
    event_id = f"gce:{name}:{start or 'unscheduled'}"
    return [Announcement("gcp", event_id, kind, state, not_before,
                         _iso(upcoming.get("windowEndTime"), where, notes), what)], notes  # fmt: skip


def from_azure(vm_name: str, events: Iterable[Mapping[str, Any]]) -> Read:
    """The Scheduled Events (`Events` of the instance metadata service's document) that name `vm_name`."""
    out, notes = [], []
    for e in events:
        resources = e.get("Resources") or []
        if isinstance(resources, str):
            resources = [r for r in resources.split(",") if r]
        if vm_name not in resources:
            continue
        event_id, event_type = str(e.get("EventId", "")), str(e.get("EventType", ""))
        where = f"Azure scheduled event {event_id}"
        kind = _AZURE.get(event_type)
        if kind is None or not event_id:
            notes.append(f"{where}: unknown event type {event_type!r}" if event_id else f"{where}: no id")
            continue
        state = STARTED if e.get("EventStatus") == "Started" else SCHEDULED
        description = " ".join(str(e.get("Description") or "").split())
        source = e.get("EventSource") or "Platform"
        what = f"Azure {event_type} ({source}): {description}".rstrip(": ")
        out.append(Announcement("azure", event_id, kind, state, _rfc1123(e.get("NotBefore"), where, notes),
                                None, what))  # fmt: skip
    return out, notes


def from_oci(ocid: str, instance: Mapping[str, Any]) -> Read:
    """An instance of the Core API (`timeMaintenanceRebootDue`)."""
    due = instance.get("timeMaintenanceRebootDue")
    if not due:
        return [], []
    notes: list[str] = []
    not_before = _iso(due, f"OCI instance {ocid}: timeMaintenanceRebootDue", notes)
    what = "OCI maintenance reboot due (Oracle reboots it within 24 hours of the due time)"
    return [Announcement("oci", f"oci:{ocid}:{due}", "REBOOT", SCHEDULED, not_before, None, what)], notes
