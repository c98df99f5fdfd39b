"""The cluster analyzer's dataflow: the store's feed -> cluster patterns' windows -> derived faults.

    feed (sources.feed: a read's documents in chunks, then its tick) ── redistribute (each chunk to a
      worker at random) ── route (decode a chunk's documents into records, each to the windows of the
      patterns that count it, keyed by partition, then "chunk done" to every partition; a tick to every
      partition) ── windows (one patterns.cluster.Windows per partition) ── derived faults, checkpoints
      ── sinks.analyzer

Decoding and routing are most of the work (measured on the benchmark's traffic: 40 us an event against
1 us for the windows), so they run on every worker of every process (`-w`, and processes in Bytewax's
cluster mode: `faultline analyzer --processes`); the one reader only reads. Partitions: each window
(pattern, key) lives in one of `patterns.cluster.PARTITIONS`, so the workers share them by key. Items
crossing the exchange are small tuples. Step ids are constants (a recovery contract).

A partition holds what it is sent until every chunk of its read has said it is done there (each
chunk's records come before its own "done": one list, one exchange path) and the read's tick has come,
then takes the read in, reads in their order: its records sorted by feed position, so the windows see
the one order of the feed whichever worker decoded what and whenever, and derived faults are those of a
single reading; then `upto` moves to the tick.

Exactly once across restarts, without Bytewax's recovery store (a Deployment has no volume of its own,
and another replica may take over): a partition's checkpoint (`faultline.store.analyzer`) holds its
windows and `upto`, the feed position they have taken in (and `feed`, the same place as a number per
feed writer); it is emitted when a tick is taken in, after the derived faults of the records before it,
at most every `checkpoint_interval`. A restart reads the feed after the lowest checkpoint (`sources.feed`
hands on again what the partitions ahead took in, numbered up to their `upto`), and each partition
ignores the records and ticks it has taken in already. Derived faults made again after a crash are the
same faults, so the store keeps one of each.

One replica is active (`Leadership`: the claim of `analyzer/cluster`); the others wait for it. Why not
every replica, each with its own partitions: the feed is one sequence every partition needs to read in
order, and a partition taken over must be read again from its own checkpoint; one reader whose reads
every worker of the active replica decodes keeps that simple (more machines: Bytewax's cluster mode
across them, and a sharded MongoDB under it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource
from bytewax.outputs import DynamicSink

from faultline import renewal, store
from faultline.errors import LeaseLostError, TransientError
from patterns import anomaly
from patterns.cluster import PARTITIONS, ClusterPacks, Routed, Windows, field_value, partition
from sources.feed import NO_LABELS, Item, Tick, chunk_records

log = logging.getLogger(__name__)

FLOW_ID = "cluster"
STEP_INPUT = "feed"
STEP_SPREAD = "spread"
STEP_ROUTE = "route"
STEP_WINDOWS = "windows"
STEP_OUTPUT = "analyzer_out"
ACQUIRE_POLL_S = 1.0  # a standby replica tries to take the lease this often

Routed_ = tuple[str, int, Any]  # ("w", partition, Routed as a tuple) | ("d", partition, read): a chunk
# of that read is done | ("t", partition, (read, chunks, position, watermark, feed)): a read's tick
# | ("a", partition, patterns.anomaly.Sample): a GPU's health sample, to its anomaly models
Out = tuple[str, Any]


def router(
    packs: ClusterPacks, scores: anomaly.Settings | None = None,
    labels: Callable[[str], Mapping[str, str]] = lambda _n: NO_LABELS,
) -> Callable[[Item], list[tuple[str, Routed_]]]:  # fmt: skip
    fields = scores.enabled() if scores is not None else {}

    def route(item: Item) -> list[tuple[str, Routed_]]:
        if isinstance(item, Tick):  # every partition learns how far the feed has been handed on
            tick = (item.read, item.chunks, item.position, item.watermark, item.feed)
            return [(str(p), ("t", p, tick)) for p in range(PARTITIONS)]
        out: list[tuple[str, Routed_]] = []
        for record, watermark in chunk_records(item, labels):
            for r in packs.route(record, watermark):
                p = partition(r.pattern, r.key)
                out.append((str(p), ("w", p, dataclasses.astuple(r))))
            if fields and record.kind == "events":  # a GPU's health sample: to the partition of its models
                gpu = field_value(record, "gpu")
                s = anomaly.sample(gpu, record.position, record.t, record.node, record.id, record.metadata,
                                   fields)  # fmt: skip
                if s is not None:
                    p = partition(anomaly.PATTERN, s[0])
                    out.append((str(p), ("a", p, s)))
        out += [(str(p), ("d", p, item.read)) for p in range(PARTITIONS)]  # after its records, on one path
        return out

    return route


class PartitionLogic(op.StatefulLogic[Routed_, Out, None]):
    """One partition's windows. Built before its first item says which partition it is; then restored
    from that partition's checkpoint. Emits derived faults, and a checkpoint of what the ticks moved on
    once `interval` seconds passed since the last one (at a tick, or at the timer when the feed went
    quiet), and at the end of the input."""

    def __init__(
        self, packs: ClusterPacks, checkpoints: Mapping[int, Mapping[str, Any]], interval: float,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        scores: anomaly.Settings | None = None,
    ) -> None:  # fmt: skip
        self.packs = packs
        self.scores = scores
        self.models: anomaly.Models | None = None  # the GPUs' anomaly models (scores on), in the checkpoint
        self.checkpoints = checkpoints
        self.interval = dt.timedelta(seconds=interval)
        self.clock = clock
        self.partition = -1
        self.windows: Windows | None = None
        self.saved_at = clock()
        self.saved_upto = -1
        self.fed: list[Any] = []  # the feed position of `upto`: {writer, n} per feed writer
        self.next_read = 0  # the read whose tick is taken in next (this run's reads: `sources.feed.Tick`)
        self.ticks: dict[int, tuple[Any, ...]] = {}  # ticks come, not taken in yet, by read
        self.done: dict[int, int] = {}  # chunks done here, by read
        self.held: list[tuple[int, str, Any]] = []  # (position, kind, payload): records of reads not taken in

    def on_item(self, value: Routed_) -> tuple[list[Out], bool]:
        kind, part, payload = value
        if self.windows is None:
            self.partition = part
            self.windows = Windows.restore(self.packs, self.checkpoints.get(part))
            self.saved_upto = self.windows.upto
            self.fed = list((self.checkpoints.get(part) or {}).get("feed") or [])
            if self.scores is not None:
                saved = (self.checkpoints.get(part) or {}).get("anomaly")
                self.models = anomaly.Models.restore(self.scores, saved)
        if kind in ("w", "a"):  # held until its read is taken in
            # (its position: a Routed's third field, a Sample's second)
            self.held.append((payload[2] if kind == "w" else payload[1], kind, payload))
            return [], op.StatefulLogic.RETAIN
        if kind == "d":
            self.done[payload] = self.done.get(payload, 0) + 1
        else:
            self.ticks[payload[0]] = payload
        out: list[Out] = []
        while (tick := self.ticks.get(self.next_read)) is not None and self.done.get(tick[0], 0) >= tick[1]:
            del self.ticks[tick[0]]
            self.done.pop(tick[0], None)
            self.next_read += 1
            out += self._take(*tick[2:])
        return out, op.StatefulLogic.RETAIN

    def _take(self, position: int, watermark: float, fed: list[Any]) -> list[Out]:
        """A read handed on whole: its records in the feed's order, then `upto` moves to its position
        (and a checkpoint, if it is time)."""
        assert self.windows is not None
        w = self.windows
        # sorted by position; stable, so what one record was routed to stays in its order
        ready = sorted((h for h in self.held if h[0] <= position), key=lambda h: h[0])
        self.held = [h for h in self.held if h[0] > position]
        out: list[Out] = []
        for at, kind, payload in ready:
            if at <= w.upto:
                continue  # taken in before the checkpoint this run started from
            if kind == "w":
                out += [("fault", d) for d in w.add(Routed(*payload))]
            elif self.models is not None:
                out += [("fault", f) for f in self.models.add(payload)]
        if position <= w.upto:
            return out  # taken in before the checkpoint this run started from
        w.upto = position
        self.fed = fed  # the same place as a number per feed writer
        w.watermark = max(w.watermark, watermark)
        if self.clock() - self.saved_at >= self.interval:
            out.append(self._checkpoint())
        return out

    def notify_at(self) -> dt.datetime | None:
        if self.windows is None or self.saved_upto == self.windows.upto:
            return None
        return self.saved_at + self.interval

    def on_notify(self) -> tuple[list[Out], bool]:
        return self.on_eof()

    def _checkpoint(self) -> Out:
        assert self.windows is not None
        self.windows.expire(self.windows.watermark)  # here, not at every tick: a pass over every window
        self.saved_at = self.clock()
        self.saved_upto = self.windows.upto
        state = self.windows.state()
        state["feed"] = self.fed
        if self.models is not None:
            self.models.expire(self.windows.watermark)
            state["anomaly"] = self.models.state()
        return ("checkpoint", (self.partition, state))

    def on_eof(self) -> tuple[list[Out], bool]:
        if self.windows is None or self.saved_upto == self.windows.upto:
            return [], op.StatefulLogic.RETAIN
        return [self._checkpoint()], op.StatefulLogic.RETAIN

    def snapshot(self) -> None:
        return None  # progress is the checkpoints in the store (see the module docstring)


def build(
    packs: ClusterPacks, source: FixedPartitionedSource[Item, Any], sink: DynamicSink[Out], *,
    checkpoints: Mapping[int, Mapping[str, Any]], checkpoint_interval: float = 5.0,
    scores: anomaly.Settings | None = None, labels: Callable[[str], Mapping[str, str]] = lambda _n: NO_LABELS,
) -> Dataflow:  # fmt: skip
    """The analyzer's flow. `source` gives `sources.feed.Item`s (the store's feed: `FeedSource`) from the
    position `checkpoints` give (`Store.analyzer_position`). `scores`: the GPUs' anomaly scores (None:
    off), whose models live beside the windows in the partitions (`patterns.anomaly`). `labels(node)`:
    a node's labels, asked in every worker that decodes."""
    flow = Dataflow(FLOW_ID)
    items = op.input(STEP_INPUT, flow, source)
    spread = op.redistribute(STEP_SPREAD, items)
    keyed = op.flat_map(STEP_ROUTE, spread, router(packs, scores, labels))
    outs = op.stateful(
        STEP_WINDOWS, keyed,
        lambda _resume: PartitionLogic(packs, checkpoints, checkpoint_interval, scores=scores),
    )  # fmt: skip
    op.output(STEP_OUTPUT, op.key_rm("unkey", outs), sink)
    return flow


class Leadership:
    """The analyzer's lease: the claim of the work item `analyzer/cluster` (stage `analyzer`), so one
    replica is active. `acquire` waits for it; `keep` renews it (`faultline.renewal`, a third of the
    lease) and sets `lost` (and calls `on_lost`) when it cannot: taken over, or not renewed while the
    lease ran out; `release` gives it back for a standby to take. `beat`: the renewal's liveness."""

    def __init__(
        self, st: store.Store, owner: str, lease: dt.timedelta, *, beat: Callable[[], None] = lambda: None
    ) -> None:
        self.store = st
        self.owner = owner
        self.lease = lease
        self.claim: store.Claim | None = None
        self.lost = threading.Event()
        self._renewer = renewal.Renewer("analyzer-lease", lease.total_seconds() / 3, beat=beat)

    def try_acquire(self) -> bool:
        with store.unreachable_is_transient("taking the analyzer's lease"):
            stage, work = store.Stage.ANALYZER, store.Work.QUEUE
            self.store.enqueue(stage, store.ANALYZER_ITEM, {})
            self.store.reap(stage, 2**31, collection=work)  # an expired holder's lease
            self.claim = self.store.claim(stage, self.owner, self.lease, collection=work)
        return self.claim is not None

    def acquire(
        self, stop: threading.Event, poll: float = ACQUIRE_POLL_S, beat: Callable[[], None] = lambda: None
    ) -> bool:
        """Wait until this replica holds the lease (True) or `stop` is set (False); `beat` every turn."""
        while not stop.is_set():
            beat()
            try:
                if self.try_acquire():
                    log.info("analyzer lease taken", extra={"worker": self.owner})
                    return True
            except TransientError as exc:
                log.warning(
                    "store unreachable: waiting to take the analyzer's lease", extra={"reason": str(exc)}
                )
            stop.wait(poll)
        return False

    def keep(self, on_lost: Callable[[], None]) -> None:
        deadline = [time.monotonic() + self.lease.total_seconds()]

        def renew() -> None:
            assert self.claim is not None
            try:
                with store.unreachable_is_transient("renewing the analyzer's lease"):
                    self.claim = self.store.renew(self.claim, self.lease)
            except TransientError as exc:
                log.warning("store unreachable: analyzer lease not renewed", extra={"reason": str(exc)})
                if time.monotonic() >= deadline[0] - self._renewer.period:
                    raise LeaseLostError("the analyzer's lease ran out while the store was away") from exc
                return  # still ours for a while: tried again at the next period
            deadline[0] = time.monotonic() + self.lease.total_seconds()

        def lost() -> None:
            log.error("analyzer lease lost: stopping", extra={"worker": self.owner})
            self.lost.set()
            on_lost()

        self._renewer.hold("analyzer", renew, lost)
        self._renewer.start()

    def holding(self) -> bool:
        return self.claim is not None and not self.lost.is_set()

    def release(self) -> None:
        self._renewer.stop()
        if self.claim is None or self.lost.is_set():
            return
        try:
            with store.unreachable_is_transient("giving the analyzer's lease back"):
                self.store.complete(self.claim, store.State.PENDING)
        except (LeaseLostError, TransientError) as exc:
            log.warning("analyzer lease not given back (it runs out by itself)", extra={"reason": str(exc)})
