"""The cluster analyzer's output: derived faults into `faults` (as every other fault, so quarantine and
remediation act on them) and the windows' checkpoints, in the order the partitions emitted them.

A derived fault's revision is the feed position of the record that made it, so a partition that
restarts from an older checkpoint and makes it again writes nothing new. Of several writes of one fault
in a batch only the newest goes out. Derived faults are written, not fed: the analyzer never reads its
own conclusions back.

The store away is waited for (nothing can progress without it); `guard()` is asked before each batch
and says whether this replica still holds the analyzer's lease: a replica that lost it writes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from bytewax.outputs import DynamicSink, StatelessSinkPartition

from faultline import store
from faultline.errors import TransientError
from patterns.cluster import Derived

log = logging.getLogger(__name__)
Out = tuple[str, Any]  # ("fault", Derived) | ("checkpoint", (partition, state))


class _Partition(StatelessSinkPartition[Out]):
    def __init__(self, sink: AnalyzerSink) -> None:
        self.sink = sink
        self.store = sink.connect()

    def write_batch(self, items: list[Out]) -> None:
        if not self.sink.guard():
            log.warning("analyzer output dropped: this replica no longer holds the lease",
                        extra={"items": len(items)})  # fmt: skip
            return
        pending: list[Out] = []
        newest: dict[str, int] = {}  # fault id -> where its newest write is in `pending`
        for kind, value in items:
            if kind == "fault":
                fault = value.fault()
                if fault.id in newest:
                    pending[newest[fault.id]] = ("skip", None)
                newest[fault.id] = len(pending)
            pending.append((kind, value))
        for kind, value in pending:
            if kind != "skip":
                self._write(kind, value)

    def _write(self, kind: str, value: Any) -> None:
        delay = 0.5
        while True:
            try:
                with store.unreachable_is_transient("writing the analyzer's output"):
                    if kind == "fault":
                        derived: Derived = value
                        if self.store.write_fault(derived.fault(), derived.revision):
                            self.sink.on_fault(derived)
                    else:
                        partition, state = value
                        self.store.save_checkpoint(partition, state, self.sink.owner)
                return
            except TransientError as exc:
                log.warning("store unreachable: analyzer output waits", extra={"reason": str(exc)})
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def close(self) -> None:
        self.store.close()


class AnalyzerSink(DynamicSink[Out]):
    def __init__(
        self, connect: Callable[[], store.Store], owner: str, *, guard: Callable[[], bool] = lambda: True,
        on_fault: Callable[[Derived], None] = lambda _d: None,
    ) -> None:  # fmt: skip
        self.connect = connect
        self.owner = owner
        self.guard = guard
        self.on_fault = on_fault

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        return _Partition(self)
