"""Claims: how workers take work documents (`queue`, `drains`, `repairs`) one at a time.

FerretDB v1 applies a conditional update as "read, then write by _id", so two claimers can both win a
find_one_and_update (measured: 4 threads took 119 claims of 40 documents). What every server does
atomically is reject a duplicate _id. So each claim, completion and takeover of one (stage, item)
inserts the next numbered document into `leases`; exactly one inserter wins each number, and a stale
reader can only try a number that already exists.

Candidates are found by equality on `<stage>.state` (FerretDB evaluates other filters after fetching
every document); an item given back with a `retry_after` still in the future is skipped client-side.

A claim, a completion and a take-back are two writes: the lease document, then the work document. A
writer killed between them (or cut off from the store) leaves the work document a number behind its
leases, and every later try of that number fails: a pending item nobody could claim again, or a
claimed one the reaper could not take back (found by the chaos suite's remediation-kill: a repair
never carried out). Such a lease is an orphan once it is dead (a claim past its `until`, any other
kind ORPHAN_S after it was written: a live writer makes its second write within its store timeout),
and whoever trips over it takes the item back (`_recover`): the number after its newest lease, the item
pending, its stage redone (every handler is idempotent). A stage's first claim may find no number on the
document at all (a repair's and a drain's stages start without one): that is 0 to the take-back too
(before, a first claim orphaned on a repair was never taken back and its node stayed cordoned: what a
CI run of the chaos suite's janitor-kill showed).
"""

from __future__ import annotations

import datetime as dt
import enum
import random
from dataclasses import dataclass
from typing import Any

import pymongo
from pymongo.errors import DuplicateKeyError

from faultline.errors import LeaseLostError
from faultline.store import documents
from faultline.store.base import WORK, Base, Stage, State, Work, fresh

CLAIM_SCAN = 32  # pending items looked at per claim before giving up (others may be taking them)
ORPHAN_S = 20.0  # past every client's store timeout (10 s): a lease this old has no second write coming


@dataclass(frozen=True)
class Claim:
    id: str
    stage: Stage
    owner: str
    lease_until: dt.datetime
    doc: dict[str, Any]  # the work document as claimed (read it typed: `store.WorkItem.from_doc(...)`)
    n: int  # this claim's number in `leases`
    collection: Work

    @property
    def status(self) -> documents.StageStatus:
        return documents.StageStatus.from_doc(self.doc.get(self.stage) or {})

    @property
    def node(self) -> str | None:
        node = self.doc.get("node")
        return None if node is None else str(node)


class HandOver(enum.Enum):
    """A hand-over between the stages of one work document, written with the completion that makes it
    (`Completion.then`), so the next stage cannot claim the document while this one still writes it:
    the stage named becomes pending with fresh attempts, no back-off and no error."""

    TO_JANITOR = Stage.JANITOR  # remediation decided a round: the janitor carries it out
    TO_REMEDIATION = Stage.REMEDIATION  # the janitor's round did not succeed: remediation escalates


@dataclass(frozen=True)
class Completion:
    """How a claim closes (`Claims.complete`): the stage's `state` (`done`, a worker's own final state,
    `parked`, or `pending` to give it back); `retry_after`: not claimed again before then; `fresh`: its
    attempts start over (given back for a reason that was no failure, e.g. another repair of the node
    under way); `then`: the next stage's hand-over, in the same write."""

    state: State = State.DONE
    retry_after: dt.datetime | None = None
    fresh: bool = False
    then: HandOver | None = None


class Claims(Base):
    def claim(
        self,
        stage: Stage,
        owner: str,
        lease: dt.timedelta,
        extra: dict[str, Any] | None = None,
        *,
        spread: bool = False,
        collection: Work,
        order: tuple[str, ...] = ("first_seen",),
    ) -> Claim | None:
        """Take the first pending document of `stage` in `collection`, by `order` (ascending fields; a
        leading "-" descends), optionally filtered by equality on more fields. `spread`: take any of the
        first CLAIM_SCAN (for many claimers at once)."""
        docs = self.pending(stage, CLAIM_SCAN, extra, collection=collection, order=order)
        if spread:  # concurrent claimers start at different places instead of all racing for the first
            random.shuffle(docs)
        for doc in docs:
            claim = self.try_claim(stage, doc, owner, lease, collection=collection)
            if claim is not None:
                return claim
        return None

    def pending(
        self,
        stage: Stage,
        limit: int,
        extra: dict[str, Any] | None = None,
        *,
        collection: Work,
        order: tuple[str, ...] = ("first_seen",),
    ) -> list[dict[str, Any]]:
        """Up to `limit` pending documents of `stage` that are due, in `order` (candidates for
        `try_claim`). Items backing off (`retry_after` later than now) are dropped here, after an
        equality query, so they are not claimed early."""
        sort = [(f.lstrip("-"), pymongo.DESCENDING if f[0] == "-" else pymongo.ASCENDING) for f in order]
        found = self.db[collection].find({f"{stage}.state": State.PENDING, **(extra or {})})
        docs = list(found.sort([*sort, ("_id", pymongo.ASCENDING)]).limit(limit))
        now = self.now()
        return [d for d in docs if (after := (d.get(stage) or {}).get("retry_after")) is None or after <= now]

    def try_claim(
        self, stage: Stage, doc: dict[str, Any], owner: str, lease: dt.timedelta, *, collection: Work
    ) -> Claim | None:
        """Claim `doc` as it was read: the next lease number after the one it shows. A stale copy (claimed,
        completed or reaped since) names a number that exists already, so it fails: None; so does a copy
        of a document deleted since."""
        n = int(doc[stage].get("seq", 0)) + 1
        now = self.now()
        until = now + lease
        if not self._take(stage, doc["_id"], n, owner, "claimed", until):
            self._recover(stage, doc["_id"], n, collection)  # taken by another, or an orphan
            return None
        fields = {
            f"{stage}.state": State.CLAIMED,
            f"{stage}.seq": n,
            f"{stage}.attempts": int(doc[stage].get("attempts", 0)) + 1,
            f"{stage}.lease_owner": owner,
            f"{stage}.lease_until": until,
            f"{stage}.updated_at": now,
        }
        if self.db[collection].update_one({"_id": doc["_id"]}, {"$set": fields}).matched_count == 0:
            return None  # the item went after it was read (its fault resolved): nothing to claim
        doc = {**doc, stage: {**doc[stage], **{k.split(".", 1)[1]: v for k, v in fields.items()}}}
        return Claim(doc["_id"], stage, owner, until, doc, n, collection)

    def _take(self, stage: str, item: str, n: int, owner: str, kind: str, until: dt.datetime | None) -> bool:
        try:
            self.leases.insert_one(
                {"_id": f"{stage}/{item}/{n}", "fault": item, "stage": stage, "n": n, "owner": owner,
                 "kind": kind, "until": until, "at": self.now()}
            )  # fmt: skip
        except DuplicateKeyError:
            return False
        return True

    def renew(self, claim: Claim, lease: dt.timedelta) -> Claim:
        """Extend the lease. Only the lease document is written: FerretDB v1 updates a document by reading
        it and writing it back whole, so a renewal written to the work document while the handler
        updates it could undo the handler's change (seen: a pushed repair round lost)."""
        if self.leases.find_one({"_id": f"{claim.stage}/{claim.id}/{claim.n + 1}"}) is not None:
            raise LeaseLostError(f"{claim.stage} claim on {claim.id} was taken over")
        until = self.now() + lease
        self.leases.update_one({"_id": f"{claim.stage}/{claim.id}/{claim.n}"}, {"$set": {"until": until}})
        return Claim(claim.id, claim.stage, claim.owner, until, claim.doc, claim.n, claim.collection)

    def reread(self, claim: Claim) -> Claim | None:
        """The claimed document as it is now (a held claim's next look: its handler wrote it since);
        None: deleted meanwhile."""
        doc = self.db[claim.collection].find_one({"_id": claim.id})
        return None if doc is None else Claim(claim.id, claim.stage, claim.owner, claim.lease_until, doc,
                                              claim.n, claim.collection)  # fmt: skip

    def complete(
        self,
        claim: Claim,
        how: State | Completion = State.DONE,
        error: str | None = None,
    ) -> None:
        """Close the claim in a state (see `Completion`: a back-off, a hand-over), with the reason it
        failed (`error`, None when it did not); fenced by the next number."""
        done = how if isinstance(how, Completion) else Completion(how)
        if not self._take(claim.stage, claim.id, claim.n + 1, claim.owner, f"closed:{done.state}", None):
            raise LeaseLostError(f"{claim.stage} claim on {claim.id} is no longer held by {claim.owner}")
        s = claim.stage
        fields = {
            f"{s}.state": done.state, f"{s}.seq": claim.n + 1, f"{s}.lease_owner": None,
            f"{s}.lease_until": None, f"{s}.updated_at": self.now(), f"{s}.error": error,
            f"{s}.retry_after": done.retry_after,
        }  # fmt: skip
        if done.fresh:
            fields[f"{s}.attempts"] = 0
        if done.then is not None:
            fields.update(fresh(done.then.value))
        self.db[claim.collection].update_one({"_id": claim.id}, {"$set": fields})

    def reap(self, stage: Stage, max_attempts: int, *, collection: Work) -> tuple[int, int]:
        """Take back expired claims: to pending, or parked once out of attempts; (requeued, parked).
        A claim's expiry is in its lease document, which renewals extend."""
        now = self.now()
        requeued = parked = 0
        coll = self.db[collection]
        for doc in coll.find({f"{stage}.state": State.CLAIMED}):
            n = int(doc[stage].get("seq", 0)) + 1
            held = self.leases.find_one({"_id": f"{stage}/{doc['_id']}/{n - 1}"}, {"until": 1})
            if held is not None and held.get("until") is not None and held["until"] >= now:
                continue
            if not self._take(stage, doc["_id"], n, "reaper", "expired", None):
                # the owner completed it just now, another reaper got there first, or an orphan
                requeued += self._recover(stage, doc["_id"], n, collection)
                continue
            out_of_attempts = int(doc[stage].get("attempts", 0)) >= max_attempts
            coll.update_one(
                {"_id": doc["_id"]},
                {"$set": {
                    f"{stage}.state": State.PARKED if out_of_attempts else State.PENDING, f"{stage}.seq": n,
                    f"{stage}.lease_owner": None, f"{stage}.lease_until": None, f"{stage}.updated_at": now,
                    f"{stage}.error": "lease expired" + (f" {max_attempts} times" if out_of_attempts else ""),
                }},
            )  # fmt: skip
            parked += out_of_attempts
            requeued += not out_of_attempts
        return requeued, parked

    def _recover(self, stage: Stage, item: str, n: int, collection: Work) -> bool:
        """Lease `n` of `item` exists though its document shows `n - 1`: if the newest of its leases from
        `n` on is an orphan (see the module docstring), take the item back with the number after it,
        pending; whether it did. The newest, not `n`: a take-back killed between its two writes leaves
        lease `n + 1` too, and taking `n + 1` again would fail for good."""
        top, lease = n, self.leases.find_one({"_id": f"{stage}/{item}/{n}"}) or {}
        while lease and (newer := self.leases.find_one({"_id": f"{stage}/{item}/{top + 1}"})) is not None:
            top, lease = top + 1, newer
        now = self.now()
        until, at = lease.get("until"), lease.get("at")
        dead = until < now if until is not None else at is not None and (now - at).total_seconds() > ORPHAN_S
        if not dead:
            return False
        # a caller's copy of the item may be old (a thread that stalled): if the item has moved past `n - 1`,
        # its newest lease was written in turn and is no orphan
        doc = self.db[collection].find_one({"_id": item}, {stage: 1}) or {}
        if "_id" not in doc or int((doc.get(stage) or {}).get("seq", 0)) != n - 1:
            return False
        if not self._take(stage, item, top + 1, "reaper", "orphan", None):
            return False
        # the document as the caller read it: `n - 1`, or, before its stage's first lease, no number at all
        # (a repair's and a drain's stages start without one)
        behind: dict[str, Any] = (
            {f"{stage}.seq": n - 1}
            if n > 1
            else {"$or": [{f"{stage}.seq": 0}, {f"{stage}.seq": {"$exists": False}}]}
        )
        self.db[collection].update_one(
            {"_id": item, **behind},
            {"$set": {
                f"{stage}.state": State.PENDING, f"{stage}.seq": top + 1, f"{stage}.lease_owner": None,
                f"{stage}.lease_until": None, f"{stage}.updated_at": now,
                f"{stage}.error": f"taken back: lease {top} ({lease.get('kind')}) had no second write",
            }},
        )  # fmt: skip
        return True

    def count_pending(self, stage: Stage, *, collection: Work) -> int:
        """How many items of `stage` wait (due or backing off): a worker's queue depth."""
        return int(self.db[collection].count_documents({f"{stage}.state": State.PENDING}))

    def count_parked(self, stage: Stage, *, collection: Work) -> int:
        """How many items of `stage` are parked now (waiting for a person): the state metrics."""
        return int(self.db[collection].count_documents({f"{stage}.state": State.PARKED}))

    def parked(self) -> list[documents.Parked]:
        """Every parked work item of every stage, by stage then when it was parked."""
        out = []
        for collection, stage in WORK:
            for doc in self.db[collection].find({f"{stage}.state": State.PARKED}):
                status = documents.StageStatus.from_doc(doc.get(stage) or {})
                out.append(documents.Parked(
                    stage=stage, item=str(doc["_id"]), node=str(doc.get("node", "")),
                    attempts=status.attempts,
                    reason=status.error or "", at=status.updated_at,
                ))  # fmt: skip
        far = dt.datetime.max.replace(tzinfo=dt.UTC)
        return sorted(out, key=lambda p: (p.stage, p.at or far, p.item))
