"""Request bodies and answer readings both transports share (pure; no I/O, no `kubernetes` import):
a Node's conditions as plain dicts, the status patch that sets and deletes conditions, and a Node Event.
The conditions themselves are decided in `faultline.conditions`."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from faultline import bounds

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


def node_conditions(node: dict[str, Any]) -> dict[str, dict[str, str]]:
    """A Node document's (JSON) conditions by type, as plain dicts."""
    return {
        str(c.get("type")): {
            "status": str(c.get("status", "")),
            "reason": str(c.get("reason") or ""),
            "message": str(c.get("message") or ""),
            "lastHeartbeatTime": str(c.get("lastHeartbeatTime") or ""),
        }
        for c in (node.get("status") or {}).get("conditions") or []
    }


def conditions_patch(conditions: list[dict[str, str]], delete: list[str]) -> dict[str, Any] | None:
    """The strategic-merge status patch that sets `conditions` (merged by type) and deletes the types in
    `delete`; None when there is nothing to write."""
    items: list[dict[str, str]] = [*conditions, *({"type": t, "$patch": "delete"} for t in delete)]
    return {"status": {"conditions": items}} if items else None


def micro_time(now: dt.datetime | None = None) -> str:
    """A MicroTime (RFC 3339 with microseconds, UTC)."""
    now = now or dt.datetime.now(dt.UTC)
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_event(
    node: str, *, reason: str, note: str, action: str, warning: bool, controller: str, instance: str
) -> dict[str, Any]:
    """The body of an events.k8s.io/v1 Event about a Node (in `default`, where node events live)."""
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{node}.{os.urandom(8).hex()}"},  # generateName may not end in "."
        "eventTime": micro_time(),
        "reportingController": controller,
        "reportingInstance": bounds.clip(instance, bounds.EVENT_INSTANCE),
        "action": action,
        "reason": reason,
        "note": bounds.clip(note, bounds.EVENT_NOTE),
        "type": "Warning" if warning else "Normal",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
    }
