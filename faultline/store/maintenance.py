"""Cloud maintenance (`maintenance`, and the maintenance faults in `faults`).

- `maintenance/<node>` (`ScheduledEvents`): an Azure node's Scheduled Events, which only the node itself
  can read from its instance metadata service. Its agent relays them (`record_scheduled_events`, each
  read replacing the events); the maintenance monitor reads them (`scheduled_events`) and, once the node
  is drained, asks for events to be started early (`request_start`); the agent, which alone can post
  them, posts the StartRequests and records which (`record_started`). Each field has one writer.
- The maintenance monitor writes its CSP-MAINTENANCE-* faults like any fault (`write_fault`, by
  revision; pattern `MAINTENANCE_PATTERN`), with its record of each in the fault's `metadata`, and reads
  the open ones back (`maintenance_faults`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from faultline.models import FaultState
from faultline.store import documents
from faultline.store.base import Base, utc

MAINTENANCE_PATTERN = "cloud-maintenance"  # Fault.pattern of the maintenance monitor's faults


class Maintenance(Base):
    def record_scheduled_events(
        self, node: str, *, read_at: dt.datetime, vm_name: str, incarnation: int,
        events: Iterable[documents.ScheduledEvent],
    ) -> None:  # fmt: skip
        """The node's Scheduled Events as its agent read them at `read_at` (they replace the last read)."""
        body = {"node": node, "read_at": utc(read_at), "vm_name": vm_name, "incarnation": int(incarnation),
                "events": [e.model_dump(mode="python") for e in events]}  # fmt: skip
        self.upsert(self.maintenance, {"_id": node}, {"$set": body})

    def scheduled_events(self, nodes: Iterable[str]) -> dict[str, documents.ScheduledEvents]:
        """The relayed Scheduled Events of these nodes (those that have any), by node; one query."""
        wanted = sorted(set(nodes))
        if not wanted:
            return {}
        docs = self.maintenance.find({"_id": {"$in": wanted}})
        return {str(d["_id"]): documents.ScheduledEvents.from_doc(d) for d in docs}

    def request_start(self, node: str, event_ids: Iterable[str]) -> None:
        """Ask the node's agent to start these events now (added to those asked before)."""
        doc = self.maintenance.find_one({"_id": node}, {"start_requested": 1}) or {}
        wanted = sorted(set(doc.get("start_requested") or []) | set(event_ids))
        self.upsert(self.maintenance, {"_id": node}, {"$set": {"node": node, "start_requested": wanted}})

    def record_started(self, node: str, event_ids: Iterable[str], at: dt.datetime) -> None:
        """The agent posted StartRequests for these events (added to those posted before)."""
        doc = self.maintenance.find_one({"_id": node}, {"started": 1}) or {}
        done = sorted(set(doc.get("started") or []) | set(event_ids))
        self.maintenance.update_one({"_id": node}, {"$set": {"started": done, "started_at": utc(at)}})

    def maintenance_faults(self) -> list[documents.FaultRecord]:
        """The maintenance monitor's open faults, every node's (equality filters only)."""
        docs = self.faults.find({"pattern": MAINTENANCE_PATTERN, "state": FaultState.OPEN.value})
        return [documents.FaultRecord.from_doc(d) for d in docs]
