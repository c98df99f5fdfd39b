"""RMA evidence bundles (`rma`): what faultline knew of a node when it handed it to a person or to the cloud
provider's replacement, kept as one document per repair round (written once: the first writer's stands)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pymongo.errors import DuplicateKeyError

from faultline.store.base import Base, utc


class Rma(Base):
    def keep_rma(self, bundle: dict[str, Any]) -> bool:
        """Keep a bundle under its `_id` unless one is kept already (a takeover's second write is a no-op);
        whether this call kept it."""
        try:
            self.rma.insert_one(bundle)
        except DuplicateKeyError:
            return False
        return True

    def rma_bundles(self, node: str | None = None, gpu: str | None = None) -> list[dict[str, Any]]:
        """The bundles of a node, or of a GPU by serial number or UUID, oldest first."""
        flt: dict[str, Any] = {}
        if node is not None:
            flt["node"] = node
        if gpu is not None:
            flt["$or"] = [{"gpus.serial": gpu}, {"gpus.uuid": gpu}]
        return sorted(
            self.rma.find(flt), key=lambda d: (d.get("created_at") is None, d.get("created_at"), d["_id"])
        )

    def keep_bug_report(self, node: str, name: str, data: bytes, at: dt.datetime) -> None:
        """A `nvidia-bug-report` the node's repair Job collected (`name`: its file's, the request's), as the
        node's agent found it (compressed; the caller bounds its size). Idempotent by node and name."""
        self.upsert(self.bug_report_files, {"_id": f"{node}/{name}"}, {"$setOnInsert": {
            "node": node, "name": name, "collected_at": utc(at), "size": len(data), "data": data,
        }})  # fmt: skip

    def bug_reports(self, node: str, *, data: bool = False) -> list[dict[str, Any]]:
        """The node's bug reports (without their bytes unless `data`), oldest first."""
        fields = None if data else {"data": 0}
        docs = self.bug_report_files.find({"node": node}, fields)
        return sorted(docs, key=lambda d: (d.get("collected_at") is None, d.get("collected_at"), d["_id"]))

    def prune_bug_reports(self, older_than: dt.timedelta) -> int:
        """Delete the bug reports collected before the cutoff (retention); how many."""
        cutoff = self.now() - older_than
        return int(self.bug_report_files.delete_many({"collected_at": {"$lt": cutoff}}).deleted_count)
