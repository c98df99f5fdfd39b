"""What every part of the store shares: stage states, stage and collection names, the clock, and the
database handles the operation modules work on.

Time: every date the store writes and returns is an aware UTC datetime. The client decodes BSON dates
as aware UTC (`CODEC`), and the clock is cut to milliseconds (BSON's precision), so a date written and
read back compares equal to the one the caller holds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from bson.codec_options import CodecOptions
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError

# The states of a stage's status (`StageStatus.state`). Workers add their own final states (the
# quarantine's `stale`, `blocked`); `idle` is a stage nobody has handed work to yet.
PENDING, CLAIMED, DONE, PARKED, IDLE = "pending", "claimed", "done", "parked", "idle"
# Stages, and where their work documents live.
QUARANTINE, NODEDRAIN, REMEDIATION, JANITOR = "quarantine", "nodedrain", "remediation", "janitor"
QUEUE, DRAINS, REPAIRS = "queue", "drains", "repairs"
MAINTENANCE = "maintenance"  # Azure nodes' Scheduled Events, relayed by their agents
STAGES = (QUARANTINE,)  # fault-level stages: each new open fault gets a queue item for each
WORK = ((QUEUE, QUARANTINE), (DRAINS, NODEDRAIN), (REPAIRS, REMEDIATION), (REPAIRS, JANITOR))
CODEC: CodecOptions[Any] = CodecOptions(tz_aware=True, tzinfo=dt.UTC)
Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    """Now, aware UTC, cut to milliseconds (BSON's precision) so comparisons round-trip."""
    return utc(dt.datetime.now(dt.UTC))


def utc(t: dt.datetime) -> dt.datetime:
    """`t` as aware UTC at millisecond precision; a naive `t` is taken to be UTC already."""
    t = t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


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
    queue: Collection[Any]
    repairs: Collection[Any]
    maintenance: Collection[Any]

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
