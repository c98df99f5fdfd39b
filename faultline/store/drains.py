"""Drains (`drains`): one document per node, for its current quarantine episode (`Drain`).

The drainer makes one when a node held cordoned starts an episode (`open_drain`, or `reopen_drain` for
a node drained in an episode before: the claim numbers go on), records its pods while it works, and
finishes it with a `result`; `drained` hands the episode to remediation (`drained_episodes`).

Its `scope` says what it empties: the whole node, or (a partial drain) only the pods of the faulty
GPUs (`record_drain_scope`). Remediation widens a partial drain to the whole node (`widen_drain`)
before a repair that needs it; the drainer then drains the same episode again, in full.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from faultline import bounds
from faultline.store import documents
from faultline.store.base import Base, Stage, State, fresh, utc

DRAINED = "drained"


class Drains(Base):
    def drain_episodes(self) -> dict[str, dt.datetime | None]:
        """Each drain's node and the episode it is for."""
        return {str(d["_id"]): d.get("episode") for d in self.drains.find({}, {"episode": 1})}

    def drained_episodes(self) -> dict[str, dt.datetime | None]:
        """The nodes whose drain finished `drained`, and that drain's episode."""
        return {
            str(d["_id"]): d.get("episode") for d in self.drains.find({"result": DRAINED}, {"episode": 1})
        }

    def open_drain(self, node: str, episode: dt.datetime, *, fatal: bool) -> None:
        """A pending drain of the node for `episode`, unless the node has a drain document already."""
        fields = _fresh(node, episode, fatal)
        fields[Stage.NODEDRAIN] = {"state": State.PENDING, "attempts": 0}
        self.upsert(self.drains, {"_id": node}, {"$setOnInsert": fields})

    def reopen_drain(self, node: str, episode: dt.datetime, *, fatal: bool) -> None:
        """Start the node's drain over for a new episode (its claim numbers go on)."""
        fields = {**_fresh(node, episode, fatal), **fresh(Stage.NODEDRAIN)}
        self.drains.update_one({"_id": node}, {"$set": fields})

    def start_drain(self, node: str, at: dt.datetime) -> None:
        """When the drain started (kept from the first holder)."""
        self.drains.update_one({"_id": node, "started_at": None}, {"$set": {"started_at": utc(at)}})

    def record_drain_pods(
        self, node: str, pods: Mapping[str, documents.PodRecord | Mapping[str, Any]]
    ) -> None:
        """The drain's record of each pod, by uid (each a `PodRecord`)."""
        records = {
            uid: (p if isinstance(p, documents.PodRecord) else documents.PodRecord.model_validate(p))
            for uid, p in pods.items()
        }
        stored = {uid: r.model_dump(mode="python", exclude_none=True) for uid, r in records.items()}
        self.drains.update_one({"_id": node}, {"$set": {"pods": stored}})

    def record_drain_scope(self, node: str, scope: str, gpus: Iterable[str], reason: str) -> None:
        """What the drain empties: `node` (the whole node) or `gpus` (only the pods using those GPUs),
        and why."""
        why = bounds.clip(reason, bounds.STORED_TEXT)
        self.drains.update_one(
            {"_id": node}, {"$set": {"scope": scope, "gpus": sorted(set(gpus)), "scope_reason": why}}
        )

    def widen_drain(self, node: str, episode: dt.datetime, reason: str) -> bool:
        """Drain the whole node for `episode` after a partial drain of it (its pod records are kept):
        pending again, scope `node`. False when the node's drain is for another episode, or is not a
        partial one."""
        result = self.drains.update_one(
            {"_id": node, "episode": utc(episode), "scope": "gpus"},
            {"$set": {"scope": "node", "scope_reason": bounds.clip(reason, bounds.STORED_TEXT),
                      "result": None, "drained_at": None, **fresh(Stage.NODEDRAIN)}},
        )  # fmt: skip
        return result.modified_count == 1

    def finish_drain(self, node: str, result: str, at: dt.datetime) -> None:
        """The drain's end: `drained` (hands the episode to remediation) or why it stopped."""
        self.drains.update_one({"_id": node}, {"$set": {"drained_at": utc(at), "result": result}})

    def drain(self, node: str) -> documents.Drain | None:
        doc = self.drains.find_one({"_id": node})
        return None if doc is None else documents.Drain.from_doc(doc)

    def count_drained(self) -> int:
        return int(self.drains.count_documents({"result": DRAINED}))


def _fresh(node: str, episode: dt.datetime, fatal: bool) -> dict[str, Any]:
    episode = utc(episode)
    return {"node": node, "episode": episode, "first_seen": episode, "fatal": fatal, "pods": {},
            "started_at": None, "drained_at": None, "result": None, "scope": None, "gpus": [],
            "scope_reason": None}  # fmt: skip
