"""The cluster analyzer's progress (`analyzer`): one checkpoint document per partition of its windows.

A checkpoint holds the partition's windows and `upto`, the feed position (`feed` number times 2**16)
its windows have taken in: the analyzer that starts next (a restart, or another replica taking over)
restores each partition and reads the feed after the lowest `upto`, and a partition ignores what it
has taken in already, so no record is counted twice or skipped. A partition writes its checkpoint after
the derived faults its records made (same sink, in order): a crash in between makes them again, with
the same revisions, which the store ignores.

One analyzer is active at a time: it holds the work item `analyzer/cluster` of stage `analyzer` in
`queue` by a claim (`claims`: numbered lease documents, so two replicas cannot both hold it), renews it,
and gives it back when it stops; a standby takes it when it is given back or its lease runs out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from pymongo.collection import Collection

from faultline.store.base import Base

ANALYZER = "analyzer"  # the stage of the analyzer's lease item (`queue`), and the checkpoints' collection
ANALYZER_ITEM = "cluster"  # the lease item's key: `analyzer/cluster`


def checkpoint_id(partition: int) -> str:
    return f"partition/{partition}"


class Analyzer(Base):
    @property
    def checkpoints(self) -> Collection[Any]:
        return self.db[ANALYZER]

    def analyzer_checkpoints(self) -> dict[int, dict[str, Any]]:
        """Every partition's last checkpoint (its `state`: `patterns.cluster.Windows.state()`)."""
        return {int(d["partition"]): dict(d.get("state") or {}) for d in self.checkpoints.find({})}

    def save_checkpoint(self, partition: int, state: Mapping[str, Any], owner: str) -> None:
        """Replace partition `partition`'s checkpoint (by `_id`: the filter every server indexes)."""
        doc = {"partition": partition, "state": dict(state), "owner": owner, "updated_at": self.now()}
        self.upsert(self.checkpoints, {"_id": checkpoint_id(partition)}, {"$set": doc})

    def analyzer_position(self, partitions: int) -> int:
        """The feed number every one of the `partitions` has taken in (0: one has no checkpoint yet)."""
        saved = self.analyzer_checkpoints()
        return min(int(saved.get(p, {}).get("upto") or 0) for p in range(partitions)) >> 16

    def analyzer_updated(self) -> dt.datetime | None:
        """When a checkpoint was last written (`faultline status`)."""
        doc = self.checkpoints.find_one({}, {"updated_at": 1}, sort=[("updated_at", -1)])
        return None if doc is None else doc.get("updated_at")
