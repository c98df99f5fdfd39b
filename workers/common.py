"""What every worker shares: the claim loop, a client-side rate limit on API writes, Events, metrics.

Errors drive the claim loop: a handler's `PermanentError` parks the item after that one try (its reason
recorded, a Warning Event on its Node, `faultline_<worker>_parked_total`); a `TransientError` gives it
back, not to be claimed before its `delay` nor before the capped exponential back-off of its attempts
(`store.retry_delay`); any other exception counts as transient. An item out of attempts is parked; a
TransientError itself gets at least TRANSIENT_ATTEMPTS (an outage must not park work).
Every claim's outcome is logged with `node`, `item`, `fault_key`, `worker`, `attempt` and `claim_owner`.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from faultline import bounds, kube, liveness, renewal, store
from faultline.errors import LeaseLostError, PermanentError, TransientError

log = logging.getLogger(__name__)
CANDIDATES = 256  # pending documents read at once for all of a worker's claimers
CANDIDATES_MAX_AGE_S = 1.0  # read again after this, so new and others' work shows
IDLE_MAX_S = 1.0  # the longest a claimer waits between turns (idle, or after a failed claim)
READ_PAUSE_S = 1.0  # after a failed read of the candidates, the claimers idle this long before the next
# A transient failure (the API server or the store away, throttling) parks its item only after this many
# tries, once the back-off has reached its cap: about 14 minutes of failing, whatever the stage's own
# cap, so an API server restart never leaves work parked for a person once it is back. (The chaos suite's
# apiserver-restart: the janitor's 5 tries went in 8 s of a 12 s restart, and the repair stayed parked.)
TRANSIENT_ATTEMPTS = 12


def attempt_cap(exc: Exception, max_attempts: int) -> int:
    """The tries an item failing with `exc` gets before it is parked: the stage's `max_attempts`, and at
    least TRANSIENT_ATTEMPTS for a transient failure."""
    return max(max_attempts, TRANSIENT_ATTEMPTS) if isinstance(exc, TransientError) else max_attempts


def default_owner(worker: str) -> str:
    """A replica's identity in leases: worker name, host (the pod name in a Deployment), pid."""
    return f"{worker}/{socket.gethostname()}/{os.getpid()}"


class RateLimiter:
    """A token bucket: `qps` sustained, `burst` at once (the client's QPS/burst, as client-go has them)."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = burst
        self.tokens = float(burst)
        self.at = time.monotonic()
        self.lock = threading.Lock()

    def take(self) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.at) * self.qps)
                self.at = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                wait = (1 - self.tokens) / self.qps
            time.sleep(wait)


class WorkerMetrics:
    """Claims, actions by result, lease losses, queue depth and action latency, per worker."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.registry = CollectorRegistry()
        r = self.registry
        parked = "Work items parked (a permanent error, or out of attempts)"
        self.parked = Counter(f"faultline_{worker}_parked", parked, registry=r)
        self.claims = Counter(f"faultline_{worker}_claims", "Claims taken", registry=r)
        self.actions = Counter(f"faultline_{worker}_actions", "Actions by result", ["result"], registry=r)
        self.lease_losses = Counter(f"faultline_{worker}_lease_losses", "Claims lost to others", registry=r)
        self.queue = Gauge(f"faultline_{worker}_queue_depth", "Pending work items", registry=r)
        held_back = "Work held back by a limit: the breaker tripping, or a cap on repairs in flight reached"
        self.limited = Counter(f"faultline_{worker}_limit_reached", held_back, ["limit"], registry=r)
        parked_now = "Work items parked now, waiting for a person (faultline status)"
        self.parked_items = Gauge(f"faultline_{worker}_parked_items", parked_now, registry=r)
        reachable = "1 when the last maintenance pass reached the store, else 0"
        self.store_reachable = Gauge("faultline_store_reachable", reachable, registry=r)
        self.latency = Histogram(
            f"faultline_{worker}_action_latency_seconds", "Fault first seen -> action applied", registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
        )  # fmt: skip


def post_event(
    api: kube.ApiClient, node: str, *, reason: str, note: str, action: str, warning: bool, worker: str,
    owner: str,
) -> None:  # fmt: skip
    """The one record of an action a worker took on a node: a log line (`node action`, with node, reason,
    action, worker and note fields) and the matching Event on the Node (failures to post are logged, not
    raised)."""
    fields = {"node": node, "reason": reason, "action": action, "worker": worker, "owner": owner,
              "note": note}  # fmt: skip
    log.log(logging.WARNING if warning else logging.INFO, "node action", extra=fields)
    try:
        kube.events.post_node(
            api, node, reason=reason, note=note, action=action, warning=warning,
            controller=f"faultline.io/{worker}", instance=owner,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - an Event is a record, never a reason to fail the action
        log.warning("could not post Event", extra={**fields, "error": str(exc)})


@dataclass(frozen=True)
class Wait:
    """A handler's "not yet" (a node still rebooting, a Job still running): the claim stays held (its
    lease renewed with every other waiting claim's, by one thread) and the handler looks again after
    `seconds` on whichever claimer thread is free, with the document re-read; `also`: what the look
    found, recorded on it now (`Store.record_look`). A wait holds no thread, so a worker's threads
    bound the looks it makes at once, not the waits it has open; and a look costs one read, not a claim
    and a completion (the chaos suite's 10-minute store outage released 26 repairs at once onto a store
    catching up). A stopping loop gives its waiting claims back (pending, for any replica); a dead one's
    run out and are reaped."""

    seconds: float
    also: store.RoundLook | None = None


# what a handler makes of its claim: the stage's final state; that with a back-off or the next stage's
# hand-over, written in the same update (`store.Completion`); or a wait
Outcome = store.State | store.Completion | Wait


class ClaimLoop:
    """`threads` workers each claim the next pending item of `stage` in `collection`, call `handle(claim)`
    (which returns the stage's final state, or a `store.Completion` with a hand-over or a back-off) while
    a renewer keeps the lease, and complete it; a `Wait` gives it back to be looked at again later. Idle
    claimers back off from 50 ms to 1 s. A lost lease drops the result: whoever took over redoes it
    (actions are idempotent). A handler's error parks the item (permanent, or its `max_attempts`-th
    claim failed) or gives it back with a `retry_after` (see the module docstring); `api`: where the
    Warning Event of a parked item is posted (None: no Event)."""

    def __init__(
        self, st: store.Store, stage: store.Stage, owner: str, handle: Callable[[store.Claim], Outcome], *,
        lease: dt.timedelta, threads: int, metrics: WorkerMetrics, collection: store.Work,
        order: tuple[str, ...] = ("first_seen",), resync: Callable[[], None] | None = None,
        observe: Callable[[], None] | None = None,
        every: float = 5.0, max_attempts: int = 10,
        prefetch: Callable[[list[dict[str, Any]]], None] | None = None,
        refresh: float = CANDIDATES_MAX_AGE_S, api: kube.ApiClient | None = None,
        alive: liveness.Liveness | None = None, stall: float = liveness.DEFAULT_LIMIT_S,
    ) -> None:  # fmt: skip
        self.store = st
        self.api = api
        self.stage = stage
        self.owner = owner
        self.handle = handle
        self.lease = lease
        self.threads = threads
        self.metrics = metrics
        self.collection = collection
        self.order = order
        self.resync = resync
        self.observe = observe  # the worker's state metrics, read in the maintenance pass
        self.every = every
        self.max_attempts = max_attempts
        self.prefetch = prefetch  # called with each new list of candidates, before any is handled
        self.refresh = refresh  # seconds a list of candidates is used before it is read again
        self.stop = threading.Event()
        self.candidates: list[dict[str, Any]] = []
        self.candidates_lock = threading.Lock()
        self.candidates_at = 0.0
        self.read_paused_until = 0.0  # after a failed read of the candidates (monotonic)
        self.running: list[threading.Thread] = []
        self.waiting: list[tuple[float, int, store.Claim]] = []  # a heap: (when to look again, n, claim)
        self.waiting_lock = threading.Lock()
        self.waiting_n = itertools.count()
        # liveness: every claimer turn, maintenance pass and renewal pass beats; one silent for `stall`
        # seconds beyond its own wait (a handler hung in a call) fails the worker's /healthz
        self.alive = alive if alive is not None else liveness.Liveness()
        self.stall = stall
        # one thread renews every claim this loop holds, in hand or waiting, every third of the lease
        period = lease.total_seconds() / 3
        self.leases = renewal.Renewer(f"{stage}-leases", period,
                                      beat=self.alive.loop(f"{stage}-leases", stall + period))  # fmt: skip

    def start(self) -> list[threading.Thread]:
        """The claimers and one thread for the maintenance pass (the lease renewer is `leases`)."""
        out = [
            threading.Thread(
                target=self._run, args=(f"{self.stage}-{i}",), name=f"{self.stage}-{i}", daemon=True
            )
            for i in range(self.threads)
        ]
        for thread in out:  # a claimer idles (or waits after a failure) 1 s at most between turns
            self.alive.loop(thread.name, self.stall + IDLE_MAX_S)
        maintain = threading.Thread(target=self._maintain, name=f"{self.stage}-maintain", daemon=True)
        self.alive.loop(maintain.name, self.stall + self.every)
        out.append(maintain)
        for thread in out:
            thread.start()
        self.leases.start()
        self.running.extend(out)
        return out

    def halt(self, timeout: float = 30.0) -> bool:
        """Stop claiming and wait up to `timeout` seconds in all for the threads to finish the claim in
        hand (and record it), so nothing writes after the caller closes the store; then give the waiting
        claims back and stop renewing. True when all ended."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self.running:
            thread.join(max(0.0, deadline - time.monotonic()))
            if not thread.is_alive():
                self.alive.forget(thread.name)
        with self.waiting_lock:
            waiting, self.waiting = [c for _, _, c in self.waiting], []
        for claim in waiting:  # given back: another replica (or this one, restarted) looks next
            self.leases.drop(claim.id)
            try:
                self.store.complete(claim, store.State.PENDING)
            except Exception as exc:  # noqa: BLE001 - its lease runs out and the reaper takes it back
                log.warning("%s: giving %s back failed: %s", self.stage, claim.id, exc)
        ended = self.leases.stop(max(0.0, deadline - time.monotonic()))
        if ended:
            self.alive.forget(self.leases.name)
        return ended and not any(t.is_alive() for t in self.running)

    def beat(self) -> None:
        """A handler that works in passes (a drain) says it is making progress: its claimer's loop beats."""
        self.alive.beat(threading.current_thread().name)

    def _lost_waiting(self, entry: tuple[float, int, store.Claim]) -> None:
        """A waiting claim someone else took over (its renewal failed): forgotten."""
        self.metrics.lease_losses.inc()
        log.warning("claim lost", extra={**self._fields(entry[2]), "outcome": "lease-lost"})
        with self.waiting_lock:
            if entry in self.waiting:
                self.waiting.remove(entry)
                heapq.heapify(self.waiting)

    def _due(self) -> store.Claim | None:
        """A waiting claim whose time to look again has come, re-read (None: none due)."""
        with self.waiting_lock:
            if not self.waiting or self.waiting[0][0] > time.monotonic():
                return None
            claim = heapq.heappop(self.waiting)[2]
        try:
            found = self.store.reread(claim)  # None: the document went; its lease is left to run out
            if found is None:
                self.leases.drop(claim.id)
            return found
        except Exception as exc:  # noqa: BLE001 - the store away: look again in a second
            log.warning("%s: re-reading %s failed: %s", self.stage, claim.id, exc)
            self._hold(claim, 1.0)
            return None

    def _hold(self, claim: store.Claim, seconds: float) -> None:
        """Keep `claim` (its lease renewed) until its next look, in `seconds`."""
        entry = (time.monotonic() + seconds, next(self.waiting_n), claim)
        with self.waiting_lock:
            heapq.heappush(self.waiting, entry)
        self.leases.hold(claim.id, lambda: self._renew(claim), lambda: self._lost_waiting(entry))

    def _renew(self, claim: store.Claim) -> None:
        self.store.renew(claim, self.lease)

    def _maintain(self) -> None:
        """Every `every` seconds: the worker's resync pass, expired claims back to pending (parked past
        `max_attempts`), the queue depth and the state metrics."""
        beat = f"{self.stage}-maintain"
        while True:
            self.alive.beat(beat)
            try:
                if self.resync is not None:
                    self.resync()
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                log.warning("%s: resync pass failed: %s", self.stage, exc)
            try:  # the store alone: whether it answered is a metric (`faultline_store_reachable`)
                _, parked = self.store.reap(self.stage, self.max_attempts, collection=self.collection)
                if parked:  # claims that expired `max_attempts` times (their holders died or hung)
                    self.metrics.parked.inc(parked)
                    fields = {"stage": self.stage, "worker": self.metrics.worker, "parked": parked}
                    log.warning("%s: %d expired claims parked", self.stage, parked, extra=fields)
                self.metrics.queue.set(self.store.count_pending(self.stage, collection=self.collection))
                self.metrics.parked_items.set(self.store.count_parked(self.stage, collection=self.collection))
                if self.observe is not None:
                    self.observe()
                self.metrics.store_reachable.set(1)
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                self.metrics.store_reachable.set(0)
                log.warning("%s: maintenance pass failed: %s", self.stage, exc)
            if self.stop.wait(self.every):
                return

    def _next(self) -> store.Claim | None:
        """Claim from a shared list of candidates, read with one query for all the claimers and read
        again only when it runs out (each read is a scan and sort on servers like FerretDB). A stale
        candidate fails its claim (fencing) and is dropped. A read that failed is not tried again by the
        other claimers for READ_PAUSE_S: they idle (and beat) instead of queueing on the lock behind one
        failing read after another while the store is away. One call reads the list at most once: when
        it would read again (nothing it took from the list could be claimed: others took them, or an
        item's orphaned lease has not run out yet), it returns None, so its claimer idles, beats and
        looks at its waiting claims instead of reading and trying the same items again at once for as
        long as they stay unclaimable."""
        read = False
        while True:
            with self.candidates_lock:
                if not self.candidates or time.monotonic() - self.candidates_at > self.refresh:
                    if read or time.monotonic() < self.read_paused_until:
                        return None
                    read = True
                    try:
                        self.candidates = self.store.pending(
                            self.stage, CANDIDATES, collection=self.collection, order=self.order
                        )
                    except Exception:
                        self.read_paused_until = time.monotonic() + READ_PAUSE_S
                        raise
                    self.candidates.reverse()  # popped from the end: first in `order` first
                    self.candidates_at = time.monotonic()
                    if not self.candidates:
                        return None
                    if self.prefetch is not None:
                        self.prefetch(self.candidates)
                doc = self.candidates.pop()  # one list for all claimers: they never race for one document
            claim = self.store.try_claim(self.stage, doc, self.owner, self.lease, collection=self.collection)
            if claim is not None:
                return claim

    def _run(self, name: str) -> None:
        idle = 0.05
        while not self.stop.is_set():
            self.alive.beat(name)
            held = self._due()
            if held is not None:
                self._work(held)
                continue
            try:
                claim = self._next()
            except Exception as exc:  # noqa: BLE001 - a broken round must not end the worker thread
                log.warning("%s: claim failed: %s", self.stage, exc)
                self.stop.wait(IDLE_MAX_S)
                continue
            if claim is None:
                self.stop.wait(idle)
                idle = min(IDLE_MAX_S, idle * 2)
                continue
            idle = 0.05
            self.metrics.claims.inc()
            self._work(claim)

    def _work(self, claim: store.Claim) -> None:
        lost = threading.Event()
        current = [claim]

        def renew() -> None:
            current[0] = self.store.renew(current[0], self.lease)

        self.leases.hold(claim.id, renew, lost.set)  # until recorded; `drop` waits out a renewal under way
        error: str | None = None
        fields = self._fields(claim)
        outcome: Outcome | None = None
        try:
            outcome = self.handle(claim)
            done = self._settled(outcome)
        except Exception as exc:  # noqa: BLE001 - recorded on the item: parked, or back to pending
            self.metrics.actions.labels(result="error").inc()
            state, error, retry_after = self._failed(claim, exc)
            done = store.Completion(state, retry_after=retry_after)
        finally:
            self.leases.drop(claim.id)
        if lost.is_set():
            self.metrics.lease_losses.inc()
            log.warning("claim lost", extra={**fields, "outcome": "lease-lost"})
            return
        if isinstance(outcome, Wait):  # a look that found nothing new yet: held, and looked at again later
            self._wait(current[0], outcome, fields)
            return
        try:
            self.store.complete(current[0], done, error)
        except LeaseLostError:
            self.metrics.lease_losses.inc()
            log.warning("claim lost", extra={**fields, "outcome": "lease-lost"})
            return
        except Exception as exc:  # noqa: BLE001 - the store unreachable: the lease runs out, the reaper requeues
            log.warning("%s: recording %s failed (redone after its lease): %s", self.stage, claim.id, exc,
                        extra={**fields, "outcome": "unrecorded"})  # fmt: skip
            self.stop.wait(1.0)
            return
        if done.state == store.State.PARKED and error is not None:
            self._parked(claim, error)
        level = logging.WARNING if error is not None else logging.INFO
        log.log(level, "claim %s", done.state, extra={**fields, "outcome": done.state, "error": error,
                                                      "retry_after": done.retry_after})  # fmt: skip

    def _settled(self, outcome: Outcome) -> store.Completion:
        """How a handler's outcome closes its claim; a wait keeps it claimed (see `_wait`)."""
        if isinstance(outcome, Wait):
            return store.Completion(store.State.CLAIMED)
        if isinstance(outcome, store.Completion):
            return outcome
        return store.Completion(outcome)

    def _wait(self, claim: store.Claim, wait: Wait, fields: dict[str, Any]) -> None:
        """Hold the claim for its next look; what the look found is recorded on the document now."""
        if wait.also is not None:
            try:
                self.store.record_look(claim, wait.also)
            except Exception as exc:  # noqa: BLE001 - the store away: the next look finds it again
                log.warning("%s: recording a look at %s failed: %s", self.stage, claim.id, exc)
        self._hold(claim, wait.seconds)
        log.debug("claim waits", extra={**fields, "outcome": "wait", "seconds": wait.seconds})

    def _fields(self, claim: store.Claim) -> dict[str, Any]:
        """The log fields of a claim."""
        return {
            "node": claim.node, "item": claim.id, "fault_key": claim.doc.get("key"), "stage": self.stage,
            "worker": self.metrics.worker, "attempt": claim.status.attempts, "claim_owner": self.owner,
        }  # fmt: skip

    def _failed(self, claim: store.Claim, exc: Exception) -> tuple[store.State, str, dt.datetime | None]:
        """What a handler's error makes of its item: (state, reason, not to be claimed before)."""
        reason = bounds.clip(f"{type(exc).__name__}: {exc}", bounds.STORED_TEXT)
        attempts = claim.status.attempts
        if isinstance(exc, PermanentError):
            return store.State.PARKED, reason, None
        if attempts >= attempt_cap(exc, self.max_attempts):
            last = f"{attempts} attempts, the last: {reason}"
            return store.State.PARKED, bounds.clip(last, bounds.STORED_TEXT), None
        delay = store.retry_delay(attempts, exc.delay if isinstance(exc, TransientError) else 0.0)
        return store.State.PENDING, reason, self.store.clock() + dt.timedelta(seconds=delay)

    def _parked(self, claim: store.Claim, reason: str) -> None:
        """A parked item: counted, and a Warning Event on its Node."""
        self.metrics.parked.inc()
        node = claim.node
        if self.api is not None and node is not None:
            post_event(
                self.api, node, reason="FaultlineWorkParked",
                note=f"{self.stage} {claim.id} parked: {reason}", action="Park", warning=True,
                worker=self.metrics.worker, owner=self.owner,
            )  # fmt: skip
