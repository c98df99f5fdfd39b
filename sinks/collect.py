"""A Bytewax sink that hands every batch to a callback (used by the CLI to gather replay results)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from bytewax.outputs import DynamicSink, StatelessSinkPartition

T = TypeVar("T")


class _Partition(StatelessSinkPartition[T], Generic[T]):
    def __init__(self, fn: Callable[[list[T]], None], lock: threading.Lock) -> None:
        self.fn = fn
        self.lock = lock

    def write_batch(self, items: list[T]) -> None:
        with self.lock:
            self.fn(items)


class CallbackSink(DynamicSink[T], Generic[T]):
    """Calls `fn(items)` for every batch, serialised across workers by one lock."""

    def __init__(self, fn: Callable[[list[T]], None]) -> None:
        self.fn = fn
        self.lock = threading.Lock()

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition[T]:
        return _Partition(self.fn, self.lock)
