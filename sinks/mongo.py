"""Bytewax sink writing node updates to the MongoDB store, with a bounded on-disk spool.

Fault writes carry a revision, so writing one twice is harmless. While MongoDB is unreachable, writes
are appended to the spool (`sinks.spool`: append-only segments, bounded in bytes; once full, health
events are refused first and fault writes last, each counted in `faultline_spool_dropped_total{kind}`
and logged); once MongoDB answers again the spool is drained in order, one segment at a time, before
new writes. A spooled write that is later superseded is simply ignored by the store (its revision is
older).

Bytewax calls the sink only with new items, so a node that stays quiet after an outage would keep its
spool until its next event or the detector's resend a minute later (the chaos suite's store-outage: the
last spooled events arrived 58 s after the store came back). A thread of the partition therefore tries
the spool every DRAIN_RETRY_S while it holds writes and no batch came meanwhile.

A drain keeps its progress: the spool's cursor records what was written (a segment's events once they are
in, then every DRAIN_CHUNK fault writes) and a written segment is removed, so a store that times out a
call mid-drain (the chaos suite's 10-minute outage on FerretDB's SQLite: 52 agents draining at once,
calls timing out after 10 s) costs the agent one call, not its whole spool written again from the start.
In a segment, fatal faults' writes go first (each fault's own writes stay in order): a node to cordon
does not wait behind a segment's worth of minor ones.

A store that cannot be reached is given `timeout` (2 s) before the writes are spooled, but a call to a
store that was reached may take `call_timeout` (15 s): a loaded store finishes a write it has begun
even when the client stops waiting, so giving up after 2 s made every agent send it again while the
first was still being done (measured in the chaos suite's 10-minute outage on FerretDB's SQLite: 52
agents catching up at once, their fault writes timing out at 2 s about two thousand times, the store
busy with abandoned writes for minutes).

`agent_store` makes the agent process's one store client (its sink, spool drain, repair reads and pollers
share it): at most AGENT_STORE_POOL connections for calls and one for monitoring, which checks the server
every AGENT_HEARTBEAT_S (pymongo's default is 10 s: at 10,000 nodes, 1,000 checks a second on the store
for nothing; a failed call still has the client look again at once).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from bytewax.outputs import DynamicSink, StatelessSinkPartition

from faultline import metrics, store
from faultline.errors import TransientError
from faultline.models import Fault, HealthEvent, NodeUpdate
from sinks import spool

log = logging.getLogger(__name__)
DRAIN_RETRY_S = 2.0
DRAIN_CHUNK = 10  # fault writes between two moves of the spool's cursor while it drains
CALL_TIMEOUT_S = 15.0  # the longest a call to a store that was reached may take (see the module's doc)
DROP_LOG_S = 60.0  # a full spool logs what it refused at most this often (the counter has every one)
STORE_REACH_S = 2.0  # the agent waits this long for an unreachable store, then its sink spools the writes
AGENT_STORE_POOL = 2  # the agent's connections for calls at most: its writes and the pollers' reads
AGENT_HEARTBEAT_S = 60.0  # between the agent's client's checks of the server (its monitoring connection)


def agent_store(uri: str, database: str) -> store.Store:
    """The agent process's one store client (see the module's doc): 2 s to reach the store before the sink
    spools, 15 s a call, AGENT_STORE_POOL + 1 connections at most."""
    return store.connect(uri, database, timeout=STORE_REACH_S, call_timeout=CALL_TIMEOUT_S,
                         pool=AGENT_STORE_POOL, heartbeat=AGENT_HEARTBEAT_S)  # fmt: skip


def write(st: store.Store, events: list[HealthEvent], writes: list[tuple[Fault, int]], feed: bool) -> None:
    """Store events and fault writes; with `feed`, also the cluster analyzer's feed (`record_batch`)."""
    if feed:
        st.record_batch(events, writes)
        return
    st.record_events(events)
    for fault, revision in writes:
        st.write_fault(fault, revision)


def drain(queue: spool.Spool, st: store.Store, feed: bool = False) -> None:
    """Write the spool to the store one segment at a time, oldest first, keeping progress in its cursor
    as it goes (see the module's doc): memory holds one segment, whatever the spool's size, and a
    failure leaves exactly what was not written yet (the chunk under way is sent again: harmless)."""
    if not queue.size:
        return
    for n in queue.segments():
        events, writes = queue.read(n)
        pending = spool.plan(writes)
        events_done, done = queue.progress(n)
        if events and not events_done:
            write(st, events, [], feed)
            queue.advance(n, True, 0)  # the events are in: a retry does not send them again
        for start in range(done, len(pending), DRAIN_CHUNK):
            write(st, [], pending[start : start + DRAIN_CHUNK], feed)
            queue.advance(n, True, start + DRAIN_CHUNK)
        queue.remove(n)


class _Partition(StatelessSinkPartition[NodeUpdate]):
    def __init__(
        self,
        uri: str,
        database: str,
        queue: spool.Spool,
        timeouts: tuple[float, float],
        retry: float,
        feed: bool,
        shared: store.Store | None = None,
    ) -> None:
        self.owned = shared is None  # a store given is its owner's to close
        self.store = shared or store.connect(uri, database, timeout=timeouts[0], call_timeout=timeouts[1])
        self.spool = queue
        self.feed = feed
        self.indexed = False
        self.retry = retry
        self.lock = threading.Lock()  # the spool and the store's order: one writer at a time
        self.last_try = time.monotonic()
        self.unlogged: dict[str, int] = {}  # refused writes not yet logged, by kind
        self.logged_at = -DROP_LOG_S
        if queue.migrated:
            log.info("older spool file taken in", extra={"records": queue.migrated})
        self._gauges()
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
                self._dropped(self.spool.append(writes, events))  # the next try takes what it holds
            self._gauges()

    def _gauges(self) -> None:
        metrics.SPOOL_DEPTH.set(self.spool.depth)
        metrics.SPOOL_BYTES.set(self.spool.size)

    def _dropped(self, refused: dict[spool.Kind, int]) -> None:
        """Count what a full spool refused; log it, at most every DROP_LOG_S."""
        for kind, count in refused.items():
            metrics.SPOOL_DROPPED.labels(kind=kind).inc(count)
            self.unlogged[kind] = self.unlogged.get(kind, 0) + count
        now = time.monotonic()
        if self.unlogged and now - self.logged_at >= DROP_LOG_S:
            log.warning("store spool full: writes dropped", extra={
                "events": self.unlogged.get("event", 0), "faults": self.unlogged.get("fault", 0),
                "spool_bytes": self.spool.size, "max_bytes": self.spool.max_bytes,
            })  # fmt: skip
            self.unlogged, self.logged_at = {}, now

    def _drain(self) -> None:
        if not self.indexed:
            self.store.ensure_indexes()
            self.indexed = True
        drain(self.spool, self.store, self.feed)

    def _drain_quietly(self) -> None:
        """The spool tried every `retry` seconds while it holds writes and no batch came meanwhile."""
        while not self.stop.wait(self.retry):
            if not self.spool.size or time.monotonic() - self.last_try < self.retry:
                continue
            with self.lock:
                self.last_try = time.monotonic()
                try:
                    with store.unreachable_is_transient("writing spooled faults"):
                        self._drain()
                except TransientError:
                    continue  # still away
                finally:
                    self._gauges()

    def close(self) -> None:
        self.stop.set()
        self.drainer.join()
        if self.owned:
            self.store.close()


class MongoSink(DynamicSink[NodeUpdate]):
    def __init__(
        self, uri: str, database: str = "faultline", *, spool: Path, timeout: float = 2.0,
        call_timeout: float = CALL_TIMEOUT_S, retry: float = DRAIN_RETRY_S, feed: bool = False,
        shared: store.Store | None = None, spool_max_bytes: int = spool.MAX_BYTES,
    ) -> None:  # fmt: skip
        """`timeout`: how long a store that cannot be reached is waited for before the writes are
        spooled; `call_timeout`: how long a call to a store that was reached may take (see the module's
        doc). `feed`: also write the cluster analyzer's feed (only where an analyzer reads it), in this
        node's own numbered sequence (the node of each batch's first record), so agents do not race.
        `shared`: the process's one store client, made with those timeouts by its owner (who closes it);
        without it the sink makes its own from `uri`. `spool`: the spool's directory (an older agent's
        single file `<spool>.jsonl` is taken in); `spool_max_bytes`: its bound (see `sinks.spool`)."""
        self.uri = uri
        self.database = database
        self.spool_path = spool
        self.spool_max_bytes = spool_max_bytes
        self.timeout = timeout
        self.call_timeout = call_timeout
        self.retry = retry
        self.feed = feed
        self.shared = shared

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        queue = spool.Spool(self.spool_path, max_bytes=self.spool_max_bytes)
        return _Partition(self.uri, self.database, queue, (self.timeout, self.call_timeout), self.retry,
                          self.feed, self.shared)  # fmt: skip
