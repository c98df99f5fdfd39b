"""Bytewax sink writing node updates to the MongoDB store, with a bounded on-disk spool.

Fault writes carry a revision, so writing one twice is harmless. While MongoDB is unreachable, writes
are appended to a spool file (JSON lines, bounded: the oldest are dropped, and counted, when it is full);
once MongoDB answers again the spool is drained in order before new writes. A spooled write that is
later superseded is simply ignored by the store (its revision is older).

Bytewax calls the sink only with new items, so a node that stays quiet after an outage would keep its
spool until its next event or the detector's resend a minute later (the chaos suite's store-outage: the
last spooled events arrived 58 s after the store came back). A thread of the partition therefore tries
the spool every DRAIN_RETRY_S while it holds writes and no batch came meanwhile.

A drain keeps its progress: the spool is rewritten without what was written (the events once they are in,
then every DRAIN_CHUNK fault writes), so a store that times out a call mid-drain (the chaos suite's
10-minute outage on FerretDB's SQLite: 52 agents draining at once, calls timing out after 10 s) costs the
agent one call, not its whole spool written again from the start. Fatal faults' writes go first (each
fault's own writes stay in order): a node to cordon does not wait behind an outage's worth of minor ones.

A store that cannot be reached is given `timeout` (2 s) before the writes are spooled, but a call to a
store that was reached may take `call_timeout` (15 s): a loaded store finishes a write it has begun
even when the client stops waiting, so giving up after 2 s made every agent send it again while the
first was still being done (measured in the chaos suite's 10-minute outage on FerretDB's SQLite: 52
agents catching up at once, their fault writes timing out at 2 s about two thousand times, the store
busy with abandoned writes for minutes).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from bytewax.outputs import DynamicSink, StatelessSinkPartition

from faultline import metrics, store
from faultline.errors import TransientError
from faultline.models import Fault, HealthEvent, NodeUpdate

SPOOL_MAX_ITEMS = 100_000
DRAIN_RETRY_S = 2.0
DRAIN_CHUNK = 10  # fault writes between two rewrites of the spool while it drains
CALL_TIMEOUT_S = 15.0  # the longest a call to a store that was reached may take (see the module's doc)


class Spool:
    """An append-only JSON-lines file of (fault, revision) writes waiting for MongoDB."""

    def __init__(self, path: Path, max_items: int = SPOOL_MAX_ITEMS) -> None:
        self.path = path
        self.max_items = max_items
        self.dropped = 0
        path.parent.mkdir(parents=True, exist_ok=True)

    def __len__(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as fh:
            return sum(1 for _ in fh)

    def append(self, writes: list[tuple[Fault, int]], events: list[HealthEvent] | None = None) -> None:
        lines = [json.dumps({"event": e.model_dump(mode="json")}) for e in events or []]
        lines += [json.dumps({"revision": rev, "fault": f.model_dump(mode="json")}) for f, rev in writes]
        pending = self.read_lines() + lines
        if len(pending) > self.max_items:
            self.dropped += len(pending) - self.max_items
            pending = pending[-self.max_items :]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in pending))
        tmp.replace(self.path)  # atomic: a crash leaves the old or the new spool, never half of one

    def read_lines(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []

    def items(self) -> list[tuple[Fault, int]]:
        return [
            (Fault.model_validate(r["fault"]), int(r["revision"])) for r in self._records() if "fault" in r
        ]

    def events(self) -> list[HealthEvent]:
        return [HealthEvent.model_validate(r["event"]) for r in self._records() if "event" in r]

    def _records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.read_lines()]

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def rewrite(self, writes: list[tuple[Fault, int]]) -> None:
        """The spool as only these fault writes (what a drain has not written yet); none: cleared."""
        if not writes:
            self.clear()
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps({"revision": rev, "fault": f.model_dump(mode="json")}) + "\n"
                               for f, rev in writes))  # fmt: skip
        tmp.replace(self.path)


def coalesced(writes: list[tuple[Fault, int]]) -> list[tuple[Fault, int]]:
    """The spooled fault writes that matter, in order: of consecutive writes of one fault in the same
    state only the newest (the store keeps the newest revision anyway; a count that rose fifty times in
    an outage is one write, not fifty, when the store is back and every agent catches up at once); a
    change of state is kept, as it makes or removes the fault's work items."""
    out: list[tuple[Fault, int]] = []
    last: dict[str, int] = {}  # fault id -> where its last kept write is in `out`
    for fault, revision in writes:
        i = last.get(fault.id)
        if i is not None and out[i][0].state == fault.state and out[i][1] <= revision:
            out[i] = (fault, revision)
        else:
            last[fault.id] = len(out)
            out.append((fault, revision))
    return out


def drain_order(writes: list[tuple[Fault, int]]) -> list[tuple[Fault, int]]:
    """The writes of fatal faults first, then the others; each fault's own writes in their order."""
    fatal = {fault.id for fault, _ in writes if fault.fatal}
    return [w for w in writes if w[0].id in fatal] + [w for w in writes if w[0].id not in fatal]


def write(st: store.Store, events: list[HealthEvent], writes: list[tuple[Fault, int]], feed: bool) -> None:
    """Store events and fault writes; with `feed`, also the cluster analyzer's feed (`record_batch`)."""
    if feed:
        st.record_batch(events, writes)
        return
    st.record_events(events)
    for fault, revision in writes:
        st.write_fault(fault, revision)


def drain(spool: Spool, st: store.Store, feed: bool = False) -> None:
    """Write the spool to the store, keeping progress in the spool as it goes (see the module's doc);
    a failure leaves exactly what was not written yet."""
    if not len(spool):
        return
    events = spool.events()
    pending = drain_order(coalesced(spool.items()))
    if events:
        write(st, events, [], feed)
        spool.rewrite(pending)  # the events are in: a retry does not send them again
    for start in range(0, len(pending), DRAIN_CHUNK):
        write(st, [], pending[start : start + DRAIN_CHUNK], feed)
        spool.rewrite(pending[start + DRAIN_CHUNK :])
    spool.clear()


class _Partition(StatelessSinkPartition[NodeUpdate]):
    def __init__(
        self,
        uri: str,
        database: str,
        spool: Spool,
        timeouts: tuple[float, float],
        retry: float,
        feed: bool,
        shared: store.Store | None = None,
    ) -> None:
        self.owned = shared is None  # a store given is its owner's to close
        self.store = shared or store.connect(uri, database, timeout=timeouts[0], call_timeout=timeouts[1])
        self.spool = spool
        self.feed = feed
        self.indexed = False
        self.retry = retry
        self.lock = threading.Lock()  # the spool and the store's order: one writer at a time
        self.last_try = time.monotonic()
        self.stop = threading.Event()
        self.drainer = threading.Thread(target=self._drain_quietly, name="mongo-spool", daemon=True)
        self.drainer.start()

    def write_batch(self, items: list[NodeUpdate]) -> None:
        writes = [(fault, revision) for update in items for fault, revision in update.changed]
        events = [event for update in items for event in update.events]
        with self.lock:
            self.last_try = time.monotonic()
            try:
                with store.unreachable_is_transient("writing faults"):
                    self._drain()  # what waited, in order, first
                    write(self.store, events, writes, self.feed)
            except TransientError:
                self.spool.append(writes, events)  # nothing is lost; the next try takes it
            metrics.SPOOL_DEPTH.set(len(self.spool))

    def _drain(self) -> None:
        if not self.indexed:
            self.store.ensure_indexes()
            self.indexed = True
        drain(self.spool, self.store, self.feed)

    def _drain_quietly(self) -> None:
        """The spool tried every `retry` seconds while it holds writes and no batch came meanwhile."""
        while not self.stop.wait(self.retry):
            if not self.spool.path.exists() or time.monotonic() - self.last_try < self.retry:
                continue
            with self.lock:
                self.last_try = time.monotonic()
                try:
                    with store.unreachable_is_transient("writing spooled faults"):
                        self._drain()
                except TransientError:
                    continue  # still away
                finally:
                    metrics.SPOOL_DEPTH.set(len(self.spool))

    def close(self) -> None:
        self.stop.set()
        self.drainer.join()
        if self.owned:
            self.store.close()


class MongoSink(DynamicSink[NodeUpdate]):
    def __init__(
        self, uri: str, database: str = "faultline", *, spool: Path, timeout: float = 2.0,
        call_timeout: float = CALL_TIMEOUT_S, retry: float = DRAIN_RETRY_S, feed: bool = False,
        shared: store.Store | None = None,
    ) -> None:  # fmt: skip
        """`timeout`: how long a store that cannot be reached is waited for before the writes are
        spooled; `call_timeout`: how long a call to a store that was reached may take (see the module's
        doc). `feed`: also write the cluster analyzer's feed (only where an analyzer reads it), in this
        node's own numbered sequence (the node of each batch's first record), so agents do not race.
        `shared`: the process's one store client, made with those timeouts by its owner (who closes it);
        without it the sink makes its own from `uri`."""
        self.uri = uri
        self.database = database
        self.spool_path = spool
        self.timeout = timeout
        self.call_timeout = call_timeout
        self.retry = retry
        self.feed = feed
        self.shared = shared

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        spool = Spool(self.spool_path)
        return _Partition(self.uri, self.database, spool, (self.timeout, self.call_timeout), self.retry,
                          self.feed, self.shared)  # fmt: skip
