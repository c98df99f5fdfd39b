"""Each provider's maintenance announcements as one shape: the kind, the state, the window, and what is
not understood (workers.announcements)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from faultline.models import Action
from workers import announcements as ann


def t(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def test_each_kind_has_its_code_and_the_action_it_implies() -> None:
    got = {name: (k.code, k.action, k.restarts) for name, k in ann.KINDS.items()}
    assert got == {
        "REBOOT": ("CSP-MAINTENANCE-REBOOT", Action.RESTART_VM, True),
        "REDEPLOY": ("CSP-MAINTENANCE-REDEPLOY", Action.REPLACE_VM, True),
        "TERMINATE": ("CSP-MAINTENANCE-TERMINATE", Action.REPLACE_VM, True),
        "FREEZE": ("CSP-MAINTENANCE-FREEZE", Action.NONE, False),
    }
    assert ann.BY_CODE["CSP-MAINTENANCE-REDEPLOY"] == "REDEPLOY"


@pytest.mark.parametrize(
    ("code", "description", "kind", "state"),
    [
        ("system-reboot", "scheduled reboot", "REBOOT", "scheduled"),
        ("instance-reboot", "The instance is scheduled for a reboot", "REBOOT", "scheduled"),
        ("instance-stop", "The instance is running on degraded hardware", "REDEPLOY", "scheduled"),
        ("instance-retirement", "The instance is running on degraded hardware", "TERMINATE", "scheduled"),
        ("system-maintenance", "Scheduled network maintenance", "FREEZE", "scheduled"),
        ("system-reboot", "[Completed] scheduled reboot", "REBOOT", "completed"),
        ("instance-reboot", "[Canceled] The instance is scheduled for a reboot", "REBOOT", "cancelled"),
    ],
)
def test_ec2_scheduled_events(code: str, description: str, kind: str, state: str) -> None:
    got, notes = ann.from_ec2([{
        "instanceEventId": "instance-event-0d59937288b749b32", "code": code, "description": description,
        "notBefore": "2026-12-05T00:00:00.000Z", "notAfter": "2026-12-05T02:00:00.000Z",
    }])  # fmt: skip
    assert notes == []
    assert got == [ann.Announcement("aws", "instance-event-0d59937288b749b32", kind, state,
                                    t("2026-12-05T00:00:00"), t("2026-12-05T02:00:00"),
                                    f"EC2 {code}: {description}")]  # fmt: skip


def test_ec2_events_not_understood_are_noted_not_guessed() -> None:
    got, notes = ann.from_ec2([
        {"instanceEventId": "e-1", "code": "system-upgrade", "description": "?", "notBefore": "2026-12-05T00:00:00Z"},
        {"instanceEventId": "e-2", "code": "system-reboot", "description": "x", "notBefore": "next tuesday"},
    ])  # fmt: skip
    assert [(a.event_id, a.kind, a.not_before) for a in got] == [("e-2", "REBOOT", None)]  # raised at once
    assert notes == ["EC2 event e-1: unknown event code 'system-upgrade'",
                     "EC2 event e-2: 'next tuesday' is not an RFC 3339 time"]  # fmt: skip


@pytest.mark.parametrize(
    ("scheduling", "status", "kind", "state"),
    [
        ({"onHostMaintenance": "TERMINATE", "automaticRestart": True}, "PENDING", "REBOOT", "scheduled"),
        ({"onHostMaintenance": "TERMINATE"}, "ONGOING", "REBOOT", "started"),
        ({"onHostMaintenance": "TERMINATE", "automaticRestart": False}, "PENDING", "TERMINATE", "scheduled"),
        ({"onHostMaintenance": "MIGRATE"}, "PENDING", "FREEZE", "scheduled"),
        ({}, "PENDING", "FREEZE", "scheduled"),  # MIGRATE is the default
    ],
)
def test_gce_upcoming_maintenance(scheduling: dict[str, Any], status: str, kind: str, state: str) -> None:
    instance = {"name": "gke-a3-1", "scheduling": scheduling, "upcomingMaintenance": {
        "type": "SCHEDULED", "canReschedule": True, "windowStartTime": "2026-12-05T10:00:00Z",
        "windowEndTime": "2026-12-05T11:00:00Z", "maintenanceStatus": status}}  # fmt: skip
    got, notes = ann.from_gce("gke-a3-1", instance)
    assert notes == []
    assert [(a.provider, a.kind, a.state, a.not_before, a.not_after) for a in got] == [
        ("gcp", kind, state, t("2026-12-05T10:00:00"), t("2026-12-05T11:00:00"))
    ]
    assert got[0].event_id == "gce:gke-a3-1:2026-12-05T10:00:00Z"
    assert ann.from_gce("gke-a3-1", {"name": "gke-a3-1", "scheduling": scheduling}) == ([], [])


def test_azure_scheduled_events_for_this_vm_only() -> None:
    events: list[dict[str, Any]] = [
        {"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Reboot", "ResourceType": "VirtualMachine",
         "Resources": ["aks-gpu-12345678-vmss_3"], "EventStatus": "Scheduled",
         "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description": "Host server is undergoing maintenance.",
         "EventSource": "Platform", "DurationInSeconds": 7},
        {"EventId": "other", "EventType": "Redeploy", "Resources": ["aks-gpu-12345678-vmss_4"],
         "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"},
        {"EventId": "e-3", "EventType": "Preempt", "Resources": "aks-gpu-12345678-vmss_3", "EventStatus": "Started",
         "NotBefore": ""},
        {"EventId": "e-4", "EventType": "Freeze", "Resources": ["aks-gpu-12345678-vmss_3"], "EventStatus": "Scheduled",
         "NotBefore": "Mon, 19 Sep 2016 18:30:00 GMT", "EventSource": "User"},
        {"EventId": "e-5", "EventType": "Hibernate", "Resources": ["aks-gpu-12345678-vmss_3"]},
    ]  # fmt: skip
    got, notes = ann.from_azure("aks-gpu-12345678-vmss_3", events)
    assert [(a.event_id, a.kind, a.state, a.not_before, a.what) for a in got] == [
        ("602d9444-d2cd-49c7-8624-8643e7171297", "REBOOT", "scheduled", t("2016-09-19T18:29:47"),
         "Azure Reboot (Platform): Host server is undergoing maintenance."),
        ("e-3", "TERMINATE", "started", None, "Azure Preempt (Platform)"),
        ("e-4", "FREEZE", "scheduled", t("2016-09-19T18:30:00"), "Azure Freeze (User)"),
    ]  # fmt: skip
    assert notes == ["Azure scheduled event e-5: unknown event type 'Hibernate'"]


def test_oci_maintenance_reboot_due() -> None:
    ocid = "ocid1.instance.oc1.iad.example"
    got, notes = ann.from_oci(ocid, {"id": ocid, "timeMaintenanceRebootDue": "2026-12-20T08:00:00.000Z"})
    assert notes == []
    assert [(a.event_id, a.kind, a.state, a.not_before) for a in got] == [
        (f"oci:{ocid}:2026-12-20T08:00:00.000Z", "REBOOT", "scheduled", t("2026-12-20T08:00:00"))
    ]
    assert ann.from_oci(ocid, {"id": ocid, "timeMaintenanceRebootDue": None}) == ([], [])
