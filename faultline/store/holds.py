"""What faultline holds on each node, and the quarantine circuit breaker (`nodes`).

One document per node the quarantine worker has worked on (`NodeHold`, by node name), its dry-run
records (`dry-run:<node>`) and the breaker (`breaker:quarantine`). The quarantine worker is the only
writer; the drainer and remediation read `quarantined`, `quarantined_at` (the episode) and
`owned.cordoned`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from pymongo.errors import DuplicateKeyError

from faultline.models import FaultState
from faultline.store import documents
from faultline.store.base import Base, utc

BREAKER_ID = "breaker:quarantine"


class Holds(Base):
    def record_hold(
        self, node: str, *, faults: Iterable[str], owned: documents.Owned | Mapping[str, Any],
        at: dt.datetime, newly: bool = False, released: bool = False,
    ) -> None:  # fmt: skip
        """The quarantine's record of a node: what it owns there (held while it owns anything), the open
        faults behind it, when it was checked; `newly`: this is the episode's first quarantine (its time
        is the episode, and what the breaker's window counts); `released`: faultline let the node go."""
        owned = owned if isinstance(owned, documents.Owned) else documents.Owned.model_validate(owned)
        at = utc(at)
        fields: dict[str, Any] = {
            "quarantined": owned != documents.Owned(), "faults": list(faults),
            "owned": owned.model_dump(mode="python"), "checked_at": at,
        }  # fmt: skip
        if newly:
            fields["quarantined_at"] = at
        if released:
            fields["released_at"] = at
        self.upsert(self.nodes, {"_id": node}, {"$set": fields})

    def node_gone(self, node: str) -> None:
        """The Node no longer exists: nothing is held on it."""
        self.nodes.update_one({"_id": node}, {"$set": {"quarantined": False, "gone": True}})

    def record_dry_run(self, node: str, at: dt.datetime, would: str) -> None:
        self.upsert(
            self.nodes, {"_id": f"dry-run:{node}"}, {"$set": {"node": node, "at": utc(at), "would": would}}
        )

    def hold(self, node: str) -> documents.NodeHold | None:
        doc = self.nodes.find_one({"_id": node})
        return None if doc is None else documents.NodeHold.from_doc(doc)

    def held_nodes(self) -> list[documents.NodeHold]:
        """The nodes faultline holds (quarantined), by name."""
        docs = self.nodes.find({"quarantined": True})
        return sorted(map(documents.NodeHold.from_doc, docs), key=lambda h: h.id)

    def held_node_names(self) -> set[str]:
        return {str(d["_id"]) for d in self.nodes.find({"quarantined": True}, {"_id": 1})}

    def holds_with_faults_gone(self) -> set[str]:
        """Held nodes of which a fault behind the hold is no longer open (resolved, or no longer stored):
        the ones a release, or a smaller quarantine, may be due on. Other open faults of the node (ones no
        rule quarantines on, say) do not keep it off this list. Two queries, whatever the number of nodes."""
        holds = {str(d["_id"]): list(d.get("faults") or [])
                 for d in self.nodes.find({"quarantined": True}, {"faults": 1})}  # fmt: skip
        keys = sorted({k for faults in holds.values() for k in faults})
        still: set[str] = set()
        if keys:
            docs = self.faults.find({"_id": {"$in": keys}, "state": FaultState.OPEN.value}, {"_id": 1})
            still = {str(d["_id"]) for d in docs}
        return {node for node, faults in holds.items() if not faults or not set(faults) <= still}

    def holds_episode(self, node: str, episode: dt.datetime | None) -> bool:
        """Is the node still held in the quarantine episode `episode`?"""
        doc = self.nodes.find_one({"_id": node}, {"quarantined": 1, "quarantined_at": 1}) or {}
        return bool(doc.get("quarantined")) and doc.get("quarantined_at") == episode

    def quarantined_since(self, since: dt.datetime) -> set[str]:
        """Nodes whose episode began at or after `since` (what the breaker counts)."""
        return {str(d["_id"]) for d in self.nodes.find({"quarantined_at": {"$gte": utc(since)}}, {"_id": 1})}

    def breaker(self) -> documents.Breaker:
        return documents.Breaker.from_doc(self.nodes.find_one({"_id": BREAKER_ID}) or {})

    def save_breaker(self, state: str, since: dt.datetime | None, reason: str, *, revision: int) -> bool:
        """A worker's change of the breaker, made only if it is still at `revision` (what the worker read):
        False when another replica or a person changed it since (a reset is never undone by a replica that
        had not seen it; the worker reads it again and decides again)."""
        fields = {"state": state, "since": None if since is None else utc(since), "reason": reason}
        change = {"$set": {**fields, "revision": revision + 1}}
        if revision:
            done = self.nodes.update_one({"_id": BREAKER_ID, "revision": revision}, change)
            return bool(done.matched_count)
        # revision 0: a document older than revisions, or none yet (made here; no upsert with an operator
        # in its filter, which older FerretDB versions do not take as MongoDB does)
        if self.nodes.update_one({"_id": BREAKER_ID, "revision": {"$exists": False}}, change).matched_count:
            return True
        try:
            self.nodes.insert_one({"_id": BREAKER_ID, **fields, "revision": 1})
        except DuplicateKeyError:
            return False  # written meanwhile, with a revision
        return True

    def reset_breaker(self, state: str, at: dt.datetime, reason: str, *, by: str, why: str) -> None:
        """A person's reset of the breaker: its new state, and who reset it, why and when (kept until the
        next reset; a later trip leaves them). It wins over any replica's change in flight (see
        `save_breaker`)."""
        at = utc(at)
        fields = {"state": state, "since": at, "reason": reason, "reset_by": by, "reset_reason": why,
                  "reset_at": at}  # fmt: skip
        self.upsert(self.nodes, {"_id": BREAKER_ID}, {"$set": fields, "$inc": {"revision": 1}})
