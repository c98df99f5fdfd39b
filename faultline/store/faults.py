"""Health events, faults and their work items (`health_events`, `faults`, `queue`).

Why work items live apart from the faults: FerretDB 1.x (SQLite) does not use its `_id` index for
updates (the index is on `sjson->"_id"`, the query on `sjson->'$._id'`), so every update reads the whole
collection: 11 ms per update with 1,000 faults stored, 2 ms with 1,000 small queue items. Claims update
their item twice; the faults themselves are written only by the node agents (and, for replaced
hardware, the janitor).

Every write is idempotent, so at-least-once streams and retries cannot double count:
- events are inserted with their deterministic id as `_id`; a duplicate is absorbed by the unique index;
- a fault is written with the detector's cumulative figures and a revision number: the update only
  applies when its revision is newer than the stored one (`$max`/`$min` would not order state changes).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from pymongo.errors import BulkWriteError, DuplicateKeyError

from faultline import bounds
from faultline.models import Fault, FaultState, HealthEvent
from faultline.store import documents
from faultline.store.base import STAGES, Base, Stage, State, utc

EVENTS_SCANNED = 1000  # events of one node and code read to find a fault's newest ones (`events_of`)


class Faults(Base):
    # -- writes from the detection side ---------------------------------------------------------------
    def record_events(self, events: Iterable[HealthEvent]) -> int:
        """Insert events (idempotent by id); return how many were new."""
        docs = [event_doc(e) for e in events]
        if not docs:
            return 0
        try:
            return len(self.events.insert_many(docs, ordered=False).inserted_ids)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(err.get("code") not in (11000, 11001) for err in errors):
                raise
            return int(exc.details.get("nInserted", len(docs) - len(errors)))

    def has_event(self, event_id: str) -> bool:
        return self.events.find_one({"_id": event_id}, {"_id": 1}) is not None

    def write_fault(self, fault: Fault, revision: int) -> bool:
        """Store the detector's view of a fault if `revision` is newer than what is stored.

        An open fault gets a pending queue item for every fault-level stage when it opens (a replay of
        the same write makes none twice, and one lost to a crash between the two writes is made by the
        replay); a resolved fault's items are removed, so a fault that comes back under the same key
        gets new ones. Returns whether the fault's write applied."""
        doc = fault_doc(fault)
        doc["revision"] = revision
        doc["resolved_by"] = None  # the writer's own view: a resolver's word from before is not kept
        if self.signer is not None:
            doc["evidence"] = self.signer.sign(fault.id, doc)
        doc["updated_at"] = self.now()
        try:
            result = self.faults.update_one(
                {"_id": fault.id, "revision": {"$lt": revision}},
                {"$set": doc, "$setOnInsert": {"opened_revision": revision}},  # the exporter's "opened"
                upsert=True,
            )
            applied = result.upserted_id is not None or result.modified_count == 1
        except DuplicateKeyError:
            applied = False  # the stored revision is as new or newer: a replay of an older write
        if fault.state == FaultState.OPEN:  # after the fault, so a worker that takes the item finds it
            item = {"node": fault.node, "first_seen": doc["first_seen"], "last_seen": doc["last_seen"],
                    "fatal": fault.fatal}  # fmt: skip
            for stage in STAGES:
                self.enqueue(stage, fault.id, item)
        elif applied or (self.faults.find_one({"_id": fault.id}, {"state": 1}) or {}).get("state") != "open":
            # resolved (and not an old write replayed after a newer opening): its items go, so that the
            # fault coming back under the same key is worked on again
            self.queue.delete_many({"_id": {"$in": [f"{stage}/{fault.id}" for stage in STAGES]}})
        return applied

    def enqueue(self, stage: Stage, key: str, fields: dict[str, Any]) -> bool:
        """A pending work item `<stage>/<key>` in `queue`, unless it exists (in any state); whether new.

        An item made again after its fault resolved and came back must not reuse the lease numbers of
        the one before (they exist in `leases`): its numbers start at the time of its making in
        microseconds, past any number the earlier item reached (it would need a claim a microsecond)."""
        now = self.clock()
        try:
            self.queue.insert_one({
                "_id": f"{stage}/{key}", "key": key, **fields,
                stage: {"state": State.PENDING, "attempts": 0, "updated_at": utc(now),
                        "seq": int(now.timestamp() * 1_000_000)},
            })  # fmt: skip
        except DuplicateKeyError:
            return False
        return True

    def prune_events(self, older_than: dt.timedelta) -> int:
        """Retention without TTL indexes (FerretDB has none): delete events generated before the cutoff."""
        cutoff = self.now() - older_than
        return int(self.events.delete_many({"generated_at": {"$lt": cutoff}}).deleted_count)

    # -- reads and writes of the workers --------------------------------------------------------------
    def faults_of(
        self, nodes: Iterable[str], stage: Stage | None = None
    ) -> dict[str, list[documents.FaultRecord]]:
        """Every fault of these nodes (each node a key, maybe with none), each with its `stage` work
        item's status as `work` when `stage` is given; two queries whatever the number of nodes (scans on
        FerretDB: 50 ms for 1,000 faults, which a query per node would pay again for every node)."""
        wanted = sorted(set(nodes))
        out: dict[str, list[documents.FaultRecord]] = {n: [] for n in wanted}
        if not wanted:
            return out
        flt = {"node": {"$in": wanted}}
        work: dict[str, Any] = {}
        if stage is not None:
            work = {d["key"]: d.get(stage) for d in self.queue.find(flt, {"key": 1, stage: 1})}
        for doc in self.faults.find(flt):
            record = documents.FaultRecord.from_doc(doc)
            if stage is not None:
                status = work.get(record.id)
                record.work = documents.StageStatus.from_doc(status) if status else None
            out.setdefault(record.node, []).append(record)
        return out

    def fault_revision(self, key: str) -> int | None:
        """The stored revision of fault `key` (None: not stored): where a writer's next revision starts."""
        doc = self.faults.find_one({"_id": key}, {"revision": 1})
        return None if doc is None else int(doc.get("revision") or 0)

    def open_faults_from(self, source: str) -> list[documents.FaultRecord]:
        """The open faults a cluster-side source wrote (its `metadata.source`, e.g. the object monitor's
        `kube`): what it holds open, read back at its start and at each resync. Not on a hot path."""
        docs = self.faults.find({"state": FaultState.OPEN.value, "metadata.source": source})
        return [documents.FaultRecord.from_doc(d) for d in docs]

    def oldest_open_first_seen(self) -> dt.datetime | None:
        """When the longest-open fault was first seen (None: no fault is open): the state metrics."""
        found = list(
            self.faults.find({"state": FaultState.OPEN.value}, {"first_seen": 1})
            .sort("first_seen", 1)
            .limit(1)
        )
        return utc(found[0]["first_seen"]) if found and found[0].get("first_seen") else None

    def events_of(self, node: str, code: str, entity_id: str, limit: int = 5) -> list[dict[str, Any]]:
        """The newest `limit` health events of one fault (node, code, entity), newest first, as stored: the
        lines or samples behind it (`faultline explain`). Not on a hot path."""
        docs = self.events.find({"node": node, "code": code}).sort("observed_at", -1).limit(EVENTS_SCANNED)
        out = []
        for doc in docs:
            if any(str(e.get("id", "")) == entity_id for e in doc.get("entities") or []) or not entity_id:
                out.append(doc)
                if len(out) >= limit:
                    break
        return out

    def codes_of(self, keys: Iterable[str]) -> dict[str, str]:
        """The code of each stored fault of `keys` (a node hold's faults), by key."""
        ids = list(keys)
        if not ids:
            return {}
        return {
            str(d["_id"]): str(d.get("code", ""))
            for d in self.faults.find({"_id": {"$in": ids}}, {"code": 1})
        }

    def preflight_run_written(self, run: str) -> bool:
        """Were the findings of this preflight container run (its container id) written already?"""
        return self.faults.count_documents({"metadata.source": "preflight", "metadata.run": run}, limit=1) > 0

    def resolve_observations(self, keys: Iterable[str], source: str, by: str, *, node: str) -> None:
        """Resolve those of `keys` of `node` that are one-time observations from `source` (a failed
        preflight's findings) on the janitor's word that its repair step verifiably happened."""
        flt = {"_id": {"$in": list(keys)}, "node": node, "metadata.source": source}
        found = [d["_id"] for d in self.faults.find(flt, {"_id": 1})]
        if found:
            self.resolve_faults(found, by, node=node)

    def open_fatal_faults(self, node: str) -> list[documents.FaultRecord]:
        docs = self.faults.find({"node": node})
        return [
            r for r in map(documents.FaultRecord.from_doc, docs) if r.state == FaultState.OPEN and r.fatal
        ]

    def any_fatal(self, keys: Iterable[str]) -> bool:
        """Is any of these faults fatal?"""
        return self.faults.count_documents({"_id": {"$in": list(keys)}, "fatal": True}) > 0

    def resolve_faults(self, keys: Iterable[str], by: str, *, node: str | None = None) -> None:
        """Resolve open faults on someone else's word (the janitor, for replaced hardware): `resolved_by`,
        the next revision and `updated_at` (what the exporter reads). With a signer, each is signed again
        as its resolver, one update per fault."""
        change = {
            "state": FaultState.RESOLVED.value,
            "resolved_at": self.now(),
            "resolved_by": bounds.clip(by, bounds.STORED_TEXT),
        }
        flt: dict[str, Any] = {"_id": {"$in": list(keys)}, "state": FaultState.OPEN.value}
        if node is not None:  # only that node's, whatever keys a repair round names
            flt["node"] = node
        if self.signer is None:  # the next revision, and when: the exporter sees the resolution
            self.faults.update_many(
                flt, {"$set": {**change, "updated_at": self.now()}, "$inc": {"revision": 1}}
            )
            return
        for doc in self.faults.find(flt):
            revision = int(doc.get("revision") or 0)
            fields = {**doc, **change, "revision": revision + 1}
            signed = {**change, "revision": revision + 1, "evidence": self.signer.sign(doc["_id"], fields),
                      "updated_at": self.now()}  # fmt: skip
            self.faults.update_one({"_id": doc["_id"], "revision": revision}, {"$set": signed})

    def unresolved(self, keys: Iterable[str], since: dt.datetime) -> list[str]:
        """Those of `keys` not resolved at or after `since` (a fault no longer stored counts as resolved)."""
        keys = list(keys)
        since = utc(since)
        found = {
            d["_id"]: d for d in self.faults.find({"_id": {"$in": keys}}, {"state": 1, "resolved_at": 1})
        }
        return [
            k for k in keys
            if (d := found.get(k)) is not None
            and (d.get("state") != FaultState.RESOLVED or d.get("resolved_at") is None
                 or d["resolved_at"] < since)
        ]  # fmt: skip

    # -- work items' stage states (outside claims) ------------------------------------------------------
    def nodes_in_state(self, stage: Stage, state: State) -> set[str]:
        """The nodes with a `stage` work item in `state` (e.g. the quarantine's `blocked`)."""
        return {str(d["node"]) for d in self.queue.find({f"{stage}.state": state}, {"node": 1})}

    def move_item(self, stage: Stage, key: str, from_state: State, to_state: State) -> None:
        """Set the `stage` item of fault `key` to `to_state` if it is in `from_state` (by _id: the one
        filter every server answers from its index)."""
        self.queue.update_one(
            {"_id": f"{stage}/{key}", f"{stage}.state": from_state}, {"$set": {f"{stage}.state": to_state}}
        )


def event_doc(e: HealthEvent) -> dict[str, Any]:
    """An event as `health_events` (and the feed) store it: its id as `_id`."""
    doc = e.model_dump(mode="python")
    doc["_id"] = doc.pop("id")
    doc["entities"] = [dict(x) for x in doc["entities"]]
    doc["generated_at"] = utc(e.generated_at)
    doc["observed_at"] = utc(e.observed_at)
    return doc


def fault_doc(f: Fault) -> dict[str, Any]:
    """A fault's fields as `faults` stores them (the caller adds `_id` and `revision`)."""
    doc = f.model_dump(mode="python")
    doc.pop("id")
    doc["entity"] = dict(doc["entity"])
    for key in ("first_seen", "last_seen", "resolved_at"):
        if doc[key] is not None:
            doc[key] = utc(doc[key])
    return doc
