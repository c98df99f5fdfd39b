"""The cluster analyzer's dataflow: the store's feed -> cluster patterns' windows -> derived faults.

    feed (sources.feed: records, then a tick per read) ── route (each record to the windows of the
      patterns that count it, keyed by partition; a tick to every partition) ── windows (one
      patterns.cluster.Windows per partition) ── derived faults, checkpoints ── sinks.analyzer

Partitions: each window (pattern, key) lives in one of `patterns.cluster.PARTITIONS`, so Bytewax's
workers and processes share them by key (`-w`, or processes in cluster mode). Items crossing the
exchange are small tuples. Step ids are constants (a recovery contract).

Exactly once across restarts, without Bytewax's recovery store (a Deployment has no volume of its own,
and another replica may take over): a partition's checkpoint (`faultline.store.analyzer`) holds its
windows and `upto`, the feed position they have taken in (and `feed`, the same place as a number per
feed writer); it is emitted at a tick, after the derived faults of the records before it, at most every
`checkpoint_interval`. A restart reads the feed after the lowest checkpoint (`sources.feed` hands on
again what the partitions ahead took in, numbered up to their `upto`), and each partition ignores the
records and ticks it has taken in already. Derived faults made again after a crash are the same
faults, so the store keeps one of each.

One replica is active (`Leadership`: the claim of `analyzer/cluster`); the others wait for it. Why not
every replica, each with its own partitions: the feed is one sequence every partition needs to read in
order, and a partition taken over must be read again from its own checkpoint; one reader that Bytewax's
workers share keeps that simple, and the work it does per record is small (the scale-out path is
Bytewax's cluster mode inside the active replica, and a sharded MongoDB under it).
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

from faultline import store
from faultline.errors import LeaseLostError, TransientError
from patterns import anomaly
from patterns.cluster import PARTITIONS, ClusterPacks, Routed, Windows, field_value, partition
from sources.feed import Item

log = logging.getLogger(__name__)

FLOW_ID = "cluster"
STEP_INPUT = "feed"
STEP_ROUTE = "route"
STEP_WINDOWS = "windows"
STEP_OUTPUT = "analyzer_out"

Routed_ = tuple[
    str, int, Any
]  # ("w", partition, Routed as a tuple) | ("t", partition, (position, watermark, feed))
# ... | ("a", partition, patterns.anomaly.Sample): a GPU's health sample, to its anomaly models
Out = tuple[str, Any]


def router(
    packs: ClusterPacks, scores: anomaly.Settings | None = None
) -> Callable[[Item], list[tuple[str, Routed_]]]:
    fields = scores.enabled() if scores is not None else {}

    def route(item: Item) -> list[tuple[str, Routed_]]:
        record, extra = item
        if record is None:  # a tick: every partition learns how far the feed has been handed on
            return [(str(p), ("t", p, extra)) for p in range(PARTITIONS)]
        out = []
        for r in packs.route(record, extra):
            p = partition(r.pattern, r.key)
            out.append((str(p), ("w", p, dataclasses.astuple(r))))
        if fields and record.kind == "events":  # a GPU's health sample: to the partition of its models
            gpu = field_value(record, "gpu")
            s = anomaly.sample(gpu, record.position, record.t, record.node, record.id, record.metadata,
                               fields)  # fmt: skip
            if s is not None:
                p = partition(anomaly.PATTERN, s[0])
                out.append((str(p), ("a", p, s)))
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
        w = self.windows
        if kind == "a":
            if payload[1] <= w.upto or self.models is None:
                return [], op.StatefulLogic.RETAIN  # taken in before the checkpoint this run started from
            return [("fault", f) for f in self.models.add(payload)], op.StatefulLogic.RETAIN
        if kind == "w":
            routed = Routed(*payload)
            if routed.position <= w.upto:
                return [], op.StatefulLogic.RETAIN  # taken in before the checkpoint this run started from
            return [("fault", d) for d in w.add(routed)], op.StatefulLogic.RETAIN
        position, watermark, *fed = payload
        if position <= w.upto:
            return [], op.StatefulLogic.RETAIN
        w.upto = position
        self.fed = fed[0] if fed else self.fed  # the same place as a number per feed writer
        w.watermark = max(w.watermark, watermark)
        if self.clock() - self.saved_at >= self.interval:
            return [self._checkpoint()], op.StatefulLogic.RETAIN
        return [], op.StatefulLogic.RETAIN

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
    scores: anomaly.Settings | None = None,
) -> Dataflow:  # fmt: skip
    """The analyzer's flow. `source` gives `sources.feed.Item`s (the store's feed: `FeedSource`) from the
    position `checkpoints` give (`Store.analyzer_position`). `scores`: the GPUs' anomaly scores (None:
    off), whose models live beside the windows in the partitions (`patterns.anomaly`)."""
    flow = Dataflow(FLOW_ID)
    items = op.input(STEP_INPUT, flow, source)
    keyed = op.flat_map(STEP_ROUTE, items, router(packs, scores))
    outs = op.stateful(
        STEP_WINDOWS, keyed,
        lambda _resume: PartitionLogic(packs, checkpoints, checkpoint_interval, scores=scores),
    )  # fmt: skip
    op.output(STEP_OUTPUT, op.key_rm("unkey", outs), sink)
    return flow


class Leadership:
    """The analyzer's lease: the claim of the work item `analyzer/cluster` (stage `analyzer`), so one
    replica is active. `acquire` waits for it; `keep` renews it in a thread at a third of the lease and
    sets `lost` (and calls `on_lost`) when it cannot; `release` gives it back for a standby to take."""

    def __init__(self, st: store.Store, owner: str, lease: dt.timedelta) -> None:
        self.store = st
        self.owner = owner
        self.lease = lease
        self.claim: store.Claim | None = None
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def try_acquire(self) -> bool:
        with store.unreachable_is_transient("taking the analyzer's lease"):
            self.store.enqueue(store.ANALYZER, store.ANALYZER_ITEM, {})
            self.store.reap(store.ANALYZER, 2**31, collection=store.QUEUE)  # an expired holder's lease
            self.claim = self.store.claim(store.ANALYZER, self.owner, self.lease, collection=store.QUEUE)
        return self.claim is not None

    def acquire(self, stop: threading.Event, poll: float = 1.0) -> bool:
        """Wait until this replica holds the lease (True) or `stop` is set (False)."""
        while not stop.is_set():
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
        def renew() -> None:
            interval = self.lease.total_seconds() / 3
            deadline = time.monotonic() + self.lease.total_seconds()
            while not self._stop.wait(interval):
                assert self.claim is not None
                try:
                    with store.unreachable_is_transient("renewing the analyzer's lease"):
                        self.claim = self.store.renew(self.claim, self.lease)
                    deadline = time.monotonic() + self.lease.total_seconds()
                except LeaseLostError:
                    break
                except TransientError as exc:
                    log.warning("store unreachable: analyzer lease not renewed", extra={"reason": str(exc)})
                    if time.monotonic() < deadline - interval:
                        continue  # still ours for a while: try again
                    break
            else:
                return
            log.error("analyzer lease lost: stopping", extra={"worker": self.owner})
            self.lost.set()
            on_lost()

        self._thread = threading.Thread(target=renew, name="analyzer-lease", daemon=True)
        self._thread.start()

    def holding(self) -> bool:
        return self.claim is not None and not self.lost.is_set()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.claim is None or self.lost.is_set():
            return
        try:
            with store.unreachable_is_transient("giving the analyzer's lease back"):
                self.store.complete(self.claim, store.PENDING)
        except (LeaseLostError, TransientError) as exc:
            log.warning("analyzer lease not given back (it runs out by itself)", extra={"reason": str(exc)})
