"""The fleet's history (`gpus`, `episodes`): each GPU's identity as its agent read it, and each quarantine
episode from cordon to release. Read by `faultline report` and the RMA bundles; nothing on a hot path."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from faultline.store import documents
from faultline.store.base import Base, utc


class Fleet(Base):
    def record_gpus(self, node: str, gpus: Iterable[dict[str, Any]], at: dt.datetime) -> int:
        """What the node's agent read of its GPUs (`pci`, `index`, `uuid`, `serial`, `model`, `vbios`,
        `driver`): one document per GPU and node, its fields as last read. How many were written."""
        at, n = utc(at), 0
        for gpu in gpus:
            fields = {k: gpu[k] for k in ("index", "uuid", "serial", "model", "vbios", "driver") if k in gpu}
            key = f"{node}/{gpu['pci']}"
            self.upsert(self.gpu_ids, {"_id": key}, {
                "$set": {"node": node, "pci": gpu["pci"], **fields, "seen_at": at},
                "$setOnInsert": {"first_seen": at},
            })  # fmt: skip
            n += 1
        return n

    def gpus(self, node: str | None = None) -> list[documents.GpuIdentity]:
        """Every GPU identity recorded (of `node` only, if given), by node and PCI address."""
        docs = self.gpu_ids.find({} if node is None else {"node": node})
        return sorted(map(documents.GpuIdentity.from_doc, docs), key=lambda g: (g.node, g.pci))

    def open_episode(
        self, node: str, at: dt.datetime, faults: Iterable[str], codes: Iterable[str],
        first_seen: dt.datetime | None,
    ) -> None:  # fmt: skip
        """A quarantine episode began (idempotent: its id is the node and the time)."""
        at = utc(at)
        doc = {
            "node": node,
            "quarantined_at": at,
            "released_at": None,
            "faults": sorted(set(faults)),
            "codes": sorted(set(codes)),
            "first_seen": utc(first_seen) if first_seen else None,
        }
        self.upsert(self.episodes, {"_id": f"{node}/{at.isoformat()}"}, {"$setOnInsert": doc})

    def close_episode(self, node: str, at: dt.datetime) -> None:
        """The node was released: its open episode (any, if a record was lost) ends now."""
        self.episodes.update_many({"node": node, "released_at": None}, {"$set": {"released_at": utc(at)}})

    def episodes_since(self, since: dt.datetime) -> list[documents.Episode]:
        """The episodes that began at or after `since`, or that were still open then."""
        since = utc(since)
        docs = self.episodes.find({"$or": [{"quarantined_at": {"$gte": since}}, {"released_at": None},
                                           {"released_at": {"$gte": since}}]})  # fmt: skip
        return sorted(map(documents.Episode.from_doc, docs), key=lambda e: (e.quarantined_at, e.node))

    def faults_seen_since(self, since: dt.datetime) -> list[documents.FaultRecord]:
        """Every fault last seen at or after `since` (open or resolved)."""
        docs = self.faults.find({"last_seen": {"$gte": utc(since)}})
        return [documents.FaultRecord.from_doc(d) for d in docs]

    def repairs_since(self, since: dt.datetime) -> list[documents.Repair]:
        """Every repair with a round requested at or after `since` (or none requested yet)."""
        since = utc(since)
        out = []
        for doc in self.repairs.find({}):
            repair = documents.Repair.from_doc(doc)
            times = [r.requested_at for r in repair.rounds if r.requested_at is not None]
            if not times or max(times) >= since:
                out.append(repair)
        return out

    def first_events(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        """The first stored health event of each (node, code): when it was observed and when the agent
        made it (`generated_at`): time to detect."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for node, code in set(keys):
            docs = self.events.find({"node": node, "code": code, "healthy": False},
                                    {"observed_at": 1, "generated_at": 1})  # fmt: skip
            found = list(docs.sort("observed_at", 1).limit(1))
            if found:
                out[(node, code)] = found[0]
        return out
