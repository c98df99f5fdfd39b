"""Repairs (`repairs`): one document per quarantine episode of a node that needs repair (`Repair`).

Remediation makes it (`open_repair`), decides each round and appends it (`add_round`), and hands the
round to the janitor when its claim closes (`HandOver.TO_JANITOR`); the janitor records the round's
start (`start_round`), its cloud call (`record_cloud_call`), the verified outcome of its step
(`record_step_verified`), what each look at a validating round found (`record_look`, a `RoundLook`)
and the round's outcome (`record_round_outcome`), and gives a failed round back to remediation
(`HandOver.TO_REMEDIATION`), which escalates. A RemediationRequest a person created is
adopted by the janitor as a repair of its own (`adopt_request`, `<node>/request-<turn>`): one round,
the janitor's stage pending; a failed round goes to remediation like any other.

The node agent reads one thing here: `repairs_to_confirm(node)`, the verified rounds of its node that
the janitor is validating now, so it can re-read those GPUs' health and report the ones that read
healthy (one equality query on `node` and the janitor's stage, made every few seconds per agent).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pymongo.errors import DuplicateKeyError

from faultline import bounds
from faultline.models import RepairOutcome
from faultline.store import documents
from faultline.store.base import Base, Stage, State, Work, utc
from faultline.store.claims import Claim

JANITOR_OPEN = (State.PENDING, State.CLAIMED)  # a repair's janitor stage not finished: claimed or due
# a repair's remediation stage deciding (or about to decide) its next round, which the janitor then takes
REMEDIATION_OPEN = (State.PENDING, State.CLAIMED, State.DRAIN)


def repair_key(node: str, episode: dt.datetime) -> str:
    """A repair's id: `<node>/<episode>`, the episode written as naive UTC ISO time (as it always was,
    so ids stay stable across versions)."""
    return f"{node}/{utc(episode).replace(tzinfo=None).isoformat()}"


def user_repair_key(node: str, turn: int) -> str:
    """The id of the `turn`-th person's RemediationRequest adopted for the node (`Store.adopt_request`)."""
    return f"{node}/request-{turn}"


def episode_label(episode: dt.datetime | None) -> str:
    """The episode as earlier versions printed it (naive UTC), for names derived from it."""
    return str(None if episode is None else utc(episode).replace(tzinfo=None))


@dataclass(frozen=True)
class RoundLook:
    """What a look at round `index` of a held repair found while it validates (`Store.record_look`, or a
    `Wait`'s `also`): when the look was (`checked_at`; None: not recorded this time) and validation's
    deadline, where it moved (`validate_until`; None: unchanged)."""

    index: int
    checked_at: dt.datetime | None = None
    validate_until: dt.datetime | None = None


@dataclass(frozen=True)
class RepairInFlight:
    """A repair the janitor is carrying out now (`Store.repairs_in_flight`): its id, node and step."""

    repair_id: str
    node: str
    step: str


class Repairs(Base):
    def repair_ids(self) -> set[str]:
        return {str(d["_id"]) for d in self.repairs.find({}, {"_id": 1})}

    def open_repair(self, node: str, episode: dt.datetime) -> str:
        """A pending repair of the node's `episode` unless there is one; its id."""
        key, episode = repair_key(node, episode), utc(episode)
        self.upsert(self.repairs, {"_id": key}, {"$setOnInsert": {
            "node": node, "episode": episode, "first_seen": episode, "fatal": True, "rounds": [],
            Stage.REMEDIATION: {"state": State.PENDING, "attempts": 0},
            Stage.JANITOR: {"state": State.IDLE, "attempts": 0},
        }})  # fmt: skip
        return key

    def adopt_request(self, node: str, request: documents.UserRequest, round_: documents.RepairRound) -> bool:
        """A person's RemediationRequest as a repair of the node, for the janitor (its stage pending;
        remediation idle until a round fails). Its id is the node's next turn, `request.turn` (the
        highest turn of the node's repairs as the caller read them, plus one): the insert of that id
        is the fence, so of two janitors adopting two requests of one node at once (or one request
        twice) one wins and the other reads again. False when the turn was taken."""
        at = utc(round_.requested_at or self.clock())
        doc = {
            "_id": user_repair_key(node, request.turn), "node": node, "episode": None, "first_seen": at,
            "fatal": True, "rounds": [_round_doc(round_)], "user": request.model_dump(mode="python"),
            "changed_at": self.now(),
            Stage.REMEDIATION: {"state": State.IDLE, "attempts": 0},
            Stage.JANITOR: {"state": State.PENDING, "attempts": 0},
        }  # fmt: skip
        try:
            self.repairs.insert_one(doc)
        except DuplicateKeyError:
            return False
        return True

    def repairs_of(self, node: str) -> list[documents.Repair]:
        return [documents.Repair.from_doc(d) for d in self.repairs.find({"node": node})]

    def repair(self, repair_id: str) -> documents.Repair | None:
        doc = self.repairs.find_one({"_id": repair_id})
        return None if doc is None else documents.Repair.from_doc(doc)

    def repair_in_progress(self, node: str) -> bool:
        """A repair of the node the janitor has not finished (it validates before the node goes back)."""
        return any(
            (d.get(Stage.JANITOR) or {}).get("state") in JANITOR_OPEN
            for d in self.repairs.find({"node": node}, {Stage.JANITOR: 1})
        )

    def repairs_in_flight(self) -> list[RepairInFlight]:
        """The repairs whose janitor stage is open and whose last round started (`start_round`) and has
        no outcome yet: what the janitor's caps count (`workers.inflight`). One query on the stage's state."""
        out = []
        fields = {"rounds": 1, "node": 1}
        for doc in self.repairs.find({f"{Stage.JANITOR}.state": {"$in": list(JANITOR_OPEN)}}, fields):
            rounds = doc.get("rounds") or []
            if not rounds:
                continue
            last = documents.RepairRound.from_doc(rounds[-1])
            if last.started_at is not None and not last.outcome and not last.external:
                out.append(RepairInFlight(str(doc["_id"]), str(doc.get("node", "")), str(last.step)))
        return out

    def withdraw_start(self, repair_id: str, index: int) -> None:
        """Take back `start_round` of round `index` before anything was done for it (a cap was reached):
        it starts afresh later."""
        here = f"rounds.{index}"
        self.repairs.update_one(
            {"_id": repair_id}, {"$unset": {f"{here}.started_at": "", f"{here}.boot_before": ""}}
        )

    def repairs_in_state(self, stage: Stage, state: State) -> list[documents.Repair]:
        """The repairs whose `stage` is in `state` (a worker's own, e.g. remediation's `drain`)."""
        return [documents.Repair.from_doc(d) for d in self.repairs.find({f"{stage}.state": state})]

    def move_repair(self, repair_id: str, stage: Stage, from_state: State, to_state: State) -> bool:
        """Set the repair's `stage` to `to_state` if it is in `from_state`; whether it moved."""
        result = self.repairs.update_one(
            {"_id": repair_id, f"{stage}.state": from_state}, {"$set": {f"{stage}.state": to_state}}
        )
        return result.modified_count == 1

    def set_repair_result(self, repair_id: str, result: str) -> None:
        self.repairs.update_one({"_id": repair_id}, {"$set": {"result": result}})

    def add_round(self, repair_id: str, round_: documents.RepairRound, *, result: str | None = None) -> None:
        """Append a round (and, for a last round such as contact support, the repair's result)."""
        update: dict[str, Any] = {"$push": {"rounds": _round_doc(round_)}, "$set": {"changed_at": self.now()}}
        if result is not None:
            update["$set"]["result"] = result
        self.repairs.update_one({"_id": repair_id}, update)

    def start_round(self, repair_id: str, index: int, started_at: dt.datetime, boot_before: str) -> None:
        """The first janitor to hold round `index`: when it started and the node's boot id then."""
        here = f"rounds.{index}"
        self.repairs.update_one(
            {"_id": repair_id},
            {
                "$set": {
                    f"{here}.started_at": utc(started_at),
                    f"{here}.boot_before": boot_before,
                    "changed_at": self.now(),
                }
            },
        )

    def record_cloud_call(self, repair_id: str, index: int, said: str) -> None:
        self.repairs.update_one({"_id": repair_id}, {"$set": {f"rounds.{index}.cloud_call": said}})

    def record_step_verified(self, repair_id: str, index: int, at: dt.datetime, evidence: str) -> None:
        """Round `index`'s step verifiably happened (the Job succeeded, the node is back): the node agent
        re-reads the round's GPUs from now on (`repairs_to_confirm`). Idempotent: a takeover that
        verifies again writes the same fields."""
        here = f"rounds.{index}"
        kept = bounds.clip(evidence, bounds.STORED_TEXT)
        self.repairs.update_one(
            {"_id": repair_id}, {"$set": {f"{here}.verified_at": utc(at), f"{here}.evidence": kept}}
        )

    def record_action(self, repair_id: str, index: int, at: dt.datetime) -> None:
        """Round `index`'s Job was created: a later look (any janitor's) waits for it, never creates it
        again."""
        self.repairs.update_one({"_id": repair_id}, {"$set": {f"rounds.{index}.acted_at": utc(at)}})

    def record_lookers(self, repair_id: str, index: int, lookers: list[str]) -> None:
        """The janitor replicas that have taken round `index` on (a request's `status.attempts`)."""
        self.repairs.update_one({"_id": repair_id}, {"$set": {f"rounds.{index}.lookers": lookers}})

    def start_validation(self, repair_id: str, index: int, at: dt.datetime, until: dt.datetime) -> None:
        """Round `index`'s step is done: it validates until `until` (looked at first at `at`)."""
        here = f"rounds.{index}"
        self.repairs.update_one(
            {"_id": repair_id},
            {"$set": {f"{here}.validate_until": utc(until), f"{here}.checked_at": utc(at)}},
        )

    def record_look(self, claim: Claim, look: RoundLook) -> None:
        """What a look at a round of the repair `claim` holds found (see `RoundLook`); nothing to write
        when it found nothing to record."""
        if claim.collection != Work.REPAIRS:
            raise ValueError(f"{claim.id} is no repair: {claim.collection}")
        here, fields = f"rounds.{look.index}", {}
        if look.checked_at is not None:
            fields[f"{here}.checked_at"] = utc(look.checked_at)
        if look.validate_until is not None:
            fields[f"{here}.validate_until"] = utc(look.validate_until)
        if fields:
            self.repairs.update_one({"_id": claim.id}, {"$set": fields})

    def repairs_to_confirm(self, node: str) -> list[documents.RepairNotice]:
        """The node's repairs the janitor verified and is validating now: the last round of each repair
        whose janitor stage is open (claimed, or pending between the janitor's looks), with
        `verified_at` set and no outcome yet."""
        return self.repair_watch(node)[0]

    def repair_watch(self, node: str) -> tuple[list[documents.RepairNotice], bool]:
        """What the node agent reads (one query): `repairs_to_confirm(node)`, and whether any repair of the
        node is under way: its janitor stage open, or its remediation stage deciding the round the janitor
        takes next (a round may be verified soon: the agent reads more often)."""
        out, active = [], False
        for doc in self.repairs.find({"node": node}, {"rounds": 1, Stage.JANITOR: 1, Stage.REMEDIATION: 1}):
            rounds = doc.get("rounds") or []
            if (doc.get(Stage.REMEDIATION) or {}).get("state") in REMEDIATION_OPEN:
                active = True
            if (doc.get(Stage.JANITOR) or {}).get("state") not in JANITOR_OPEN:
                continue
            active = True
            if not rounds:
                continue
            last = documents.RepairRound.from_doc(rounds[-1])
            if last.verified_at is None or last.outcome:
                continue
            out.append(documents.RepairNotice(
                round_id=f"{doc['_id']}#{len(rounds) - 1}", step=last.step, gpus=tuple(last.gpus),
                verified_at=last.verified_at,
            ))  # fmt: skip
        return out, active

    def record_round_outcome(
        self,
        repair_id: str,
        index: int,
        *,
        outcome: RepairOutcome,
        at: dt.datetime,
        message: str,
        started_at: dt.datetime,
    ) -> None:
        here = f"rounds.{index}"
        self.repairs.update_one({"_id": repair_id}, {"$set": {
            f"{here}.outcome": outcome, f"{here}.at": utc(at), f"{here}.message": message,
            f"{here}.started_at": utc(started_at), "changed_at": self.now(),
        }})  # fmt: skip


def _round_doc(r: documents.RepairRound) -> dict[str, Any]:
    doc = r.model_dump(mode="python")
    if not r.external:  # as remediation always wrote them: the external fields only on external rounds
        doc.pop("external")
        doc.pop("timeout")
    # the janitor's verification, written when it verified the step; a user request's own Job name
    for key in ("verified_at", "evidence", "job", "acted_at", "validate_until", "checked_at", "lookers"):
        if not doc.get(key):
            doc.pop(key, None)
    for key, value in doc.items():
        if isinstance(value, dt.datetime):
            doc[key] = utc(value)
    return doc
