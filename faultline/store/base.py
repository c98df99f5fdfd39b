"""What every part of the store shares: stage states, stages and work collections (enums), the clock,
and the database handles the operation modules work on.

Time: every date the store writes and returns is an aware UTC datetime. The client decodes BSON dates
as aware UTC (`CODEC`), and the clock is cut to milliseconds (BSON's precision), so a date written and
read back compares equal to the one the caller holds.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from bson.codec_options import CodecOptions
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError


class State(enum.StrEnum):
    """The state of a stage on a work document (`StageStatus.state`), as stored. Claims move an item
    between `pending`, `claimed` and a final state; a handler ends its claim in `done` or a state of
    its worker's own, each named here (the store is the only place that knows what is persisted)."""

    PENDING = "pending"
    CLAIMED = "claimed"
    DONE = "done"
    PARKED = "parked"  # failed for good, or out of attempts: a person looks (`Store.parked`)
    IDLE = "idle"  # a stage nobody has handed work to yet (a repair's janitor stage before its round)
    STALE = "stale"  # quarantine: the fault was too old to act on (recorded, not acted on)
    BLOCKED = "blocked"  # quarantine: the breaker held the node back (the resync pass tries again)
    PAUSED = "paused"  # quarantine: a person paused the node's quarantine (looked at when it ends)
    REFUSED = "refused"  # quarantine: the fault's writer is not proven (`faultline.evidence`): not acted on
    DRAIN = "drain"  # remediation: the repair waits for the whole node's drain after a partial one


class Stage(enum.StrEnum):
    """A stage of work: its status sits under its name on each of its work documents."""

    QUARANTINE = "quarantine"
    NODEDRAIN = "nodedrain"
    REMEDIATION = "remediation"
    JANITOR = "janitor"
    ANALYZER = "analyzer"  # the cluster analyzer's one lease item, `analyzer/cluster`


class Work(enum.StrEnum):
    """The collections of work documents, the ones claims take items from (`ClaimLoop(collection=)`)."""

    QUEUE = "queue"  # small items per fault-level stage (`quarantine/<fault key>`), and the analyzer's
    DRAINS = "drains"
    REPAIRS = "repairs"


MAINTENANCE = "maintenance"  # Azure nodes' Scheduled Events, relayed by their agents
STAGES = (Stage.QUARANTINE,)  # fault-level stages: each new open fault gets a queue item for each
WORK = ((Work.QUEUE, Stage.QUARANTINE), (Work.DRAINS, Stage.NODEDRAIN), (Work.REPAIRS, Stage.REMEDIATION),
        (Work.REPAIRS, Stage.JANITOR))  # fmt: skip
CODEC: CodecOptions[Any] = CodecOptions(tz_aware=True, tzinfo=dt.UTC)
Clock = Callable[[], dt.datetime]


def fresh(stage: Stage) -> dict[str, Any]:
    """The fields that make `stage` pending for new work: no attempts, back-off or error carried over
    (a hand-over from another stage, a drain started over)."""
    return {f"{stage}.state": State.PENDING, f"{stage}.attempts": 0, f"{stage}.retry_after": None,
            f"{stage}.error": None}  # fmt: skip


def utcnow() -> dt.datetime:
    """Now, aware UTC, cut to milliseconds (BSON's precision) so comparisons round-trip."""
    return utc(dt.datetime.now(dt.UTC))


def utc(t: dt.datetime) -> dt.datetime:
    """`t` as aware UTC at millisecond precision; a naive `t` is taken to be UTC already."""
    t = t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


class Signer(Protocol):
    """Signs a fault's stored fields (`faultline.evidence.NodeKey` or `ClusterKey`)."""

    def sign(self, key: str, fields: Mapping[str, Any]) -> dict[str, str]: ...


class Base:
    """The handles every operation module uses (set by `Store.__init__`)."""

    db: Database[Any]
    clock: Clock
    events: Collection[Any]
    faults: Collection[Any]
    nodes: Collection[Any]
    leases: Collection[Any]
    drains: Collection[Any]
    gpu_pods: Collection[Any]
    gpu_ids: Collection[Any]
    episodes: Collection[Any]
    exports: Collection[Any]
    rma: Collection[Any]
    bug_report_files: Collection[Any]
    queue: Collection[Any]
    repairs: Collection[Any]
    maintenance: Collection[Any]
    signer: Signer | None = None  # signs the faults this store writes (`faultline.evidence`)

    def now(self) -> dt.datetime:
        return utc(self.clock())

    @staticmethod
    def upsert(collection: Collection[Any], flt: dict[str, Any], update: dict[str, Any]) -> None:
        """update_one with upsert, where two concurrent upserts of one _id may race: FerretDB inserts
        for both and one fails on the unique _id; the loser then finds the document and updates it."""
        try:
            collection.update_one(flt, update, upsert=True)
        except DuplicateKeyError:
            collection.update_one(flt, update)
