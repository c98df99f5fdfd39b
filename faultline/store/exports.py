"""The exporter's reads and its positions (`exports`): what changed since a time (faults by their last
write, repairs by their stages' last move), and per sink how far it got and what it sent lately."""

from __future__ import annotations

import datetime as dt
from typing import Any

from faultline.store import documents
from faultline.store.base import Base, utc


class Exports(Base):
    def faults_changed_since(self, since: dt.datetime) -> list[documents.FaultRecord]:
        """Faults written at or after `since` (their writer's clock: the caller allows for skew)."""
        docs = self.faults.find({"updated_at": {"$gte": utc(since)}})
        return [documents.FaultRecord.from_doc(d) for d in docs]

    def fault_written_at(self, ids: list[str]) -> dict[str, dt.datetime]:
        """When each of these faults was last written (`updated_at`)."""
        if not ids:
            return {}
        docs = self.faults.find({"_id": {"$in": ids}}, {"updated_at": 1})
        return {str(d["_id"]): utc(d["updated_at"]) for d in docs if d.get("updated_at")}

    def repairs_changed_since(self, since: dt.datetime) -> list[documents.Repair]:
        """Repairs a round of which was added, started or ended at or after `since` (`changed_at`)."""
        docs = self.repairs.find({"changed_at": {"$gte": utc(since)}})
        return [documents.Repair.from_doc(d) for d in docs]

    def export_position(self, sink: str) -> tuple[dt.datetime | None, dict[str, dt.datetime]]:
        """Where sink `sink` got to: the time it has handled everything before (None: it never ran), and
        the events it handled since (by id, with their times) that a look from before that time finds."""
        doc = self.exports.find_one({"_id": sink}) or {}
        since = doc.get("since")
        handled = {str(h["id"]): utc(h["at"]) for h in doc.get("handled") or []}
        return (utc(since) if since else None), handled

    def save_export_position(self, sink: str, since: dt.datetime, handled: dict[str, dt.datetime]) -> None:
        # a list, not a mapping: the ids hold dots (a repair's time), which no key may
        listed = [{"id": k, "at": utc(v)} for k, v in sorted(handled.items())]
        doc: dict[str, Any] = {"since": utc(since), "updated_at": self.now(), "handled": listed}
        self.upsert(self.exports, {"_id": sink}, {"$set": doc})
