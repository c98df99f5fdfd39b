"""Bytewax sink writing node updates to the MongoDB store (idempotent: faults carry a revision)."""

from __future__ import annotations

from typing import Any

from bytewax.outputs import DynamicSink, StatelessSinkPartition

from faultline import store


class _Partition(StatelessSinkPartition[Any]):
    def __init__(self, uri: str, database: str) -> None:
        self.store = store.connect(uri, database)
        self.store.ensure_indexes()

    def write_batch(self, items: list[Any]) -> None:
        for update in items:
            for fault, revision in update.changed:
                self.store.write_fault(fault, revision)

    def close(self) -> None:
        self.store.db.client.close()


class MongoSink(DynamicSink[Any]):
    def __init__(self, uri: str, database: str = "faultline") -> None:
        self.uri = uri
        self.database = database

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        return _Partition(self.uri, self.database)
