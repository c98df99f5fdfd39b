"""The cluster analyzer's progress (`analyzer`): one checkpoint document per partition of its windows.

A checkpoint holds the partition's windows, `upto`, the position in the analyzer's merged reading of
the feed (its batch count times 2**16) its windows have taken in, and `feed`, the same place as one
number per feed writer (`faultline.store.feed`): the analyzer that starts next (a restart, or another
replica taking over) restores each partition and reads the feed after the lowest checkpoint's `feed`,
handing on again, up to each higher checkpoint's `feed`, what the partitions there have taken in, with
positions up to their `upto` (see `sources.feed`); so a partition ignores what it has taken in
already, and no record is counted twice or skipped. A partition writes its checkpoint after the
derived faults its records made (same sink, in order): a crash in between makes them again, which the
store keeps as one fault.

One analyzer is active at a time: it holds the work item `analyzer/cluster` of stage `analyzer` in
`queue` by a claim (`claims`: numbered lease documents, so two replicas cannot both hold it), renews it,
and gives it back when it stops; a standby takes it when it is given back or its lease runs out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import bson
from pymongo.collection import Collection

from faultline.store.base import CODEC, Base, Stage, State, Work
from faultline.store.feed import FEED_HEADS, position_from

ANALYZER = "analyzer"  # the checkpoints' collection (the lease item's stage is `Stage.ANALYZER`)
ANALYZER_ITEM = "cluster"  # the lease item's key: `analyzer/cluster`


def _state(saved: Any) -> dict[str, Any]:
    """A checkpoint's state as saved: BSON binary (a document before that format)."""
    if isinstance(saved, bytes):
        return dict(bson.decode(saved, codec_options=CODEC))
    return dict(saved or {})


def checkpoint_id(partition: int) -> str:
    return f"partition/{partition}"


@dataclass(frozen=True)
class AnalyzerStatus:
    """For `faultline status`: who holds the analyzer's lease (None: no replica is active) and until
    when, how far into the feed every partition is and the feed's head (feed documents, summed over the
    writers), and the last checkpoint's time."""

    owner: str | None
    until: dt.datetime | None
    position: int
    head: int
    checkpointed_at: dt.datetime | None


class Analyzer(Base):
    @property
    def checkpoints(self) -> Collection[Any]:
        return self.db[ANALYZER]

    def analyzer_checkpoints(self) -> dict[int, dict[str, Any]]:
        """Every partition's last checkpoint (its `state`: `patterns.cluster.Windows.state()`)."""
        return {int(d["partition"]): _state(d.get("state")) for d in self.checkpoints.find({})}

    def save_checkpoint(self, partition: int, state: Mapping[str, Any], owner: str) -> None:
        """Replace partition `partition`'s checkpoint (by `_id`: the filter every server indexes). The
        state is one BSON binary: FerretDB converts one field, not every field of every window (its
        checkpoints were 40 % of the analyzer's time as documents, measured with 5,000 windows)."""
        doc = {"partition": partition, "state": bson.Binary(bson.encode(dict(state), codec_options=CODEC)),
               "owner": owner, "updated_at": self.now()}  # fmt: skip
        self.upsert(self.checkpoints, {"_id": checkpoint_id(partition)}, {"$set": doc})

    def analyzer_positions(self, partitions: int) -> list[tuple[int, dict[str, int]]]:
        """Each of the `partitions`' `upto` and feed position (`(0, {})`: no checkpoint yet), lowest
        first: every partition is handed on the same ticks, so each position is past the one before."""
        saved = self.analyzer_checkpoints()
        out = [(int(saved.get(p, {}).get("upto") or 0), position_from(saved.get(p, {}).get("feed")))
               for p in range(partitions)]  # fmt: skip
        return sorted(out, key=lambda u: u[0])

    def analyzer_position(self, partitions: int) -> dict[str, int]:
        """The feed position (a number per writer) every one of the `partitions` has taken in."""
        return self.analyzer_positions(partitions)[0][1] if partitions else {}

    def analyzer_lease(self, item: Mapping[str, Any] | None = None) -> tuple[str, dt.datetime] | None:
        """Who holds the analyzer's lease and until when (None: nobody, or it ran out); `item`: the lease's
        work item when already read."""
        item_id = f"{Stage.ANALYZER}/{ANALYZER_ITEM}"
        if item is None:
            item = self.db[Work.QUEUE].find_one({"_id": item_id})
        stage = (item or {}).get(Stage.ANALYZER) or {}
        if stage.get("state") != State.CLAIMED:
            return None
        lease = self.leases.find_one({"_id": f"{Stage.ANALYZER}/{item_id}/{stage.get('seq', 0)}"}) or {}
        if lease.get("until") is None or lease["until"] < self.now():
            return None
        return str(stage.get("lease_owner")), lease["until"]

    def analyzer_status(self, partitions: int) -> AnalyzerStatus | None:
        """None when no analyzer ever ran here."""
        item_id = f"{Stage.ANALYZER}/{ANALYZER_ITEM}"
        item = self.db[Work.QUEUE].find_one({"_id": item_id})
        saved = list(self.checkpoints.find({}, {"updated_at": 1}))
        if item is None and not saved:
            return None
        held = self.analyzer_lease(item or {})
        owner, until = held if held is not None else (None, None)
        times = [d["updated_at"] for d in saved if d.get("updated_at") is not None]
        return AnalyzerStatus(owner, until, sum(self.analyzer_position(partitions).values()),
                              sum(int(d.get("n") or 0) for d in self.db[FEED_HEADS].find({}, {"n": 1})),
                              max(times, default=None))  # fmt: skip
