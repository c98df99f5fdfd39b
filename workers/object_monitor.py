"""The object monitor (`faultline object-monitor`, a Deployment of one replica): faults only the Kubernetes
API shows, read from objects by the object rules (`patterns.object_rules`: a node advertising fewer GPUs
than it has, a node NotReady for long, GPU pods that cannot get their GPUs, and the operator's own).

One `faultline.kube.watch.Informer` per distinct watch of the rules (list, then watch with bookmarks;
list again after 410 Gone) hands its changes over a bounded queue to the monitor's loop, which applies
them to `workers.object_faults.ObjectFaults` (pure: which faults the rules hold open) and writes what
differs from what the store holds open:

- an opening: the fault (`Store.write_fault`, as the node agents write theirs, so the quarantine worker
  and everything after it act on it), a health event, and an Event on the Node;
- a resolution: the fault resolved, a healthy health event, an Event.

The health event is written before the fault, as the agents write theirs: whoever reads a fault's state
finds the event of that change in the history (a write of the fault that fails after its event is tried
again with a new event, so a change may be recorded twice, never lost). With `analyzer_feed` both go
into the cluster analyzer's feed too (`Store.record_batch`, writer `object-monitor`), so cluster
patterns count these faults like the agents'.

Faults carry `metadata.source` `kube` (with the rule and the object behind them) and a revision of the
write's time in microseconds, above any revision stored for the fault. The monitor's open faults are read
back from the store at start and every `resync_interval`: its memory across restarts (nothing opened is
resolved before every watch has listed), and a fault someone else resolved while its condition holds is
opened again then. A store that cannot be written is tried again (capped back-off): the loop computes the
difference anew each time, so nothing waits in a queue to be lost.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import SkipValidation

from faultline import bounds, config, kube, liveness, store
from faultline.errors import TransientError
from faultline.models import Action, Component, Entity, Fault, FaultState, HealthEvent, event_id
from patterns import object_rules
from patterns.object_rules import RuleSet, Watch
from workers import object_faults, preflight_findings

log = logging.getLogger(__name__)
SOURCE = "kube"  # Fault.metadata["source"] and the health events' source
AGENT = "faultline-object-monitor"
CONTROLLER = "faultline.io/object-monitor"
QUEUE_MAX = 10_000  # changes waiting for the loop (a watch blocks while it is full)
BATCH = 500  # changes applied before the store is written
FEED_WRITER = "object-monitor"  # its sequence in the analyzer's feed (`analyzer_feed`)
LOOP = "object-monitor"  # the main loop's name in its liveness
TURN_WAIT_S = 1.0  # the longest a turn of the loop waits for changes
WATCH_GRACE_S = 30.0  # a watch's read timeout beyond the server's own `timeoutSeconds`


class Settings(config.ObjectMonitorTuning):
    """The monitor's tunables (defined once, in `ObjectMonitorConfig`) and its loaded rules."""

    rules: SkipValidation[RuleSet]

    @classmethod
    def from_config(cls, cfg: config.ObjectMonitorConfig) -> Settings:
        rules = object_rules.load(list(cfg.rules), builtin=cfg.builtin_rules)
        return config.part(cfg, cls, rules=rules)


def target(watch: Watch) -> kube.watch.Target:
    return kube.watch.Target(
        api_version=watch.api_version, kind=watch.kind, resource=watch.plural, namespace=watch.namespace,
        label_selector=watch.label_selector, field_selector=watch.field_selector,
    )  # fmt: skip


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        name = "faultline_object_monitor"
        self.opened = Counter(f"{name}_opened", "Faults opened, by rule", ["rule"], registry=r)
        self.resolved = Counter(f"{name}_resolved", "Faults resolved, by rule", ["rule"], registry=r)
        self.open = Gauge(f"{name}_faults_open", "Faults the monitor holds open", registry=r)
        self.rule_errors = Gauge(f"{name}_rule_errors", "Failed evaluations, by rule", ["rule"], registry=r)
        self.lists = Gauge(f"{name}_watch_lists", "Complete lists, by watch", ["watch"], registry=r)
        expired = "Lists after a watch's resourceVersion expired (410 Gone), by watch"
        self.expired = Gauge(f"{name}_watch_expired", expired, ["watch"], registry=r)
        self.watch_errors = Gauge(f"{name}_watch_errors", "Failed lists and watches, by watch", ["watch"],
                                  registry=r)  # fmt: skip
        self.store_errors = Counter(f"{name}_store_errors", "Store reads or writes that failed", registry=r)


class ObjectMonitor:
    def __init__(
        self, st: store.Store, api: kube.ApiClient, settings: Settings, *,
        clock: Callable[[], dt.datetime] = store.utcnow, stall: float = liveness.DEFAULT_LIMIT_S,
        preflight_digests: frozenset[str] = frozenset(),
    ) -> None:  # fmt: skip
        """`preflight_digests`: read failed preflights' findings from containers of these image digests
        (`workers.preflight_findings`); empty: not at all."""
        self.store, self.api, self.settings, self.clock = st, api, settings, clock
        # the loop and each watch beat; one silent past its limit fails /healthz
        self.alive = liveness.Liveness()
        self.alive.loop(LOOP, stall + TURN_WAIT_S)
        self.rules = {r.id: r for r in settings.rules.enabled()}
        self.faults = object_faults.ObjectFaults(self.rules.values())
        self.metrics = Metrics()
        self.changes: queue.Queue[tuple[Watch, kube.watch.Change]] = queue.Queue(QUEUE_MAX)
        timeout, retry = settings.watch_timeout.total_seconds(), settings.retry_max.total_seconds()
        silent = timeout + WATCH_GRACE_S + stall  # a quiet watch still ends (and beats) every `timeout`
        self.informers = {
            w: kube.watch.Informer(api, target(w), self._deliver(w), timeout=timeout, retry_max=retry,
                                   beat=self.alive.loop(f"watch {target(w)}", silent))
            for w in self.faults.rules
        }  # fmt: skip
        self.findings = None
        if preflight_digests:
            beat = self.alive.loop("preflight-findings", stall + preflight_findings.POLL_S)
            registry = self.metrics.registry
            self.findings = preflight_findings.FindingsReader(st, api, preflight_digests, registry, beat=beat)
        self.open: dict[str, tuple[Fault, int]] = {}  # what the store holds open of ours, with its revision
        self.loaded = False
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> list[threading.Thread]:
        for informer in self.informers.values():
            informer.start()
        self._thread = threading.Thread(target=self.run, name="object-monitor", daemon=True)
        self._thread.start()
        if self.findings is not None:
            self.findings.start()
        fields = {"rules": sorted(self.rules), "watches": [str(i.target) for i in self.informers.values()]}
        log.info("object monitor started", extra=fields)
        return [self._thread]

    def halt(self, timeout: float = 10.0) -> bool:
        self.stop.set()
        if self.findings is not None:
            self.findings.halt(timeout)
        for informer in self.informers.values():
            informer.halt(timeout)
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _deliver(self, watch: Watch) -> Callable[[kube.watch.Change], None]:
        def deliver(change: kube.watch.Change) -> None:
            while not self.stop.is_set():
                try:
                    self.changes.put((watch, change), timeout=1.0)
                    return
                except queue.Full:
                    continue

        return deliver

    # -- the loop -----------------------------------------------------------------------------------------
    def run(self) -> None:
        evaluate_s = self.settings.evaluate_interval.total_seconds()
        resync_s = self.settings.resync_interval.total_seconds()
        next_tick = next_resync = time.monotonic()
        retry_at, delay = 0.0, 1.0
        while not self.stop.is_set():
            self.alive.beat(LOOP)
            wait = min(next_tick, next_resync, retry_at if retry_at else next_tick) - time.monotonic()
            due = self.faults.next_due(self.clock())
            if due is not None:
                wait = min(wait, (due - self.clock()).total_seconds())
            self._apply_changes(max(0.0, min(wait, TURN_WAIT_S)))
            now_m = time.monotonic()
            if now_m >= next_tick:
                self.faults.tick(self.clock())
                next_tick = now_m + evaluate_s
            if now_m < retry_at:
                continue
            try:
                with store.unreachable_is_transient("the object monitor's faults"):
                    if now_m >= next_resync or not self.loaded:
                        self._load_open()
                        next_resync = now_m + resync_s
                    self._sync(self.clock())
                retry_at, delay = 0.0, 1.0
            except TransientError as exc:
                self.metrics.store_errors.inc()
                log.warning(
                    "store not reachable; trying again",
                    extra={"delay": delay, "error": bounds.clip(str(exc), bounds.ERROR_TEXT)},
                )
                retry_at = time.monotonic() + delay
                delay = min(delay * 2, self.settings.retry_max.total_seconds())
            self._export()

    def _apply_changes(self, wait: float) -> None:
        """Apply what the watches handed over: wait up to `wait` s for the first change, then take what
        is there (at most BATCH)."""
        try:
            item = self.changes.get(timeout=wait) if wait > 0 else self.changes.get_nowait()
        except queue.Empty:
            return
        for _ in range(BATCH):
            watch, change = item
            now = self.clock()
            if change.kind == "replace":
                self.faults.replace(watch, change.objects, now)
            elif change.kind == "upsert":
                self.faults.upsert(watch, change.objects[0], now)
            else:
                self.faults.delete(watch, object_faults.object_key(change.objects[0]))
            try:
                item = self.changes.get_nowait()
            except queue.Empty:
                return

    def _load_open(self) -> None:
        """What the store holds open of ours: the monitor's memory across restarts."""
        found: dict[str, tuple[Fault, int]] = {}
        for record in self.store.open_faults_from(SOURCE):
            try:
                fault = _fault_of(record)
            except ValueError as exc:  # a component or action this version does not know
                log.warning(
                    "stored fault not readable",
                    extra={"fault_key": record.id, "error": bounds.clip(str(exc), bounds.ERROR_TEXT)},
                )
                continue
            found[record.id] = (fault, record.revision)
        self.open = found
        self.loaded = True

    def _sync(self, now: dt.datetime) -> None:
        """Open what the rules want open, resolve what they no longer do (leaving alone the faults of
        rules whose watch has not listed yet)."""
        rule_of = {fid: fault.metadata.get("rule", "") for fid, (fault, _rev) in self.open.items()}
        wanted = self.faults.wanted(now, rule_of)
        unknown = self.faults.unknown(rule_of)
        for fid, want in wanted.items():
            if fid not in self.open:
                self._open(want, now)
        for fid in [f for f in self.open if f not in wanted and f not in unknown]:
            self._resolve(fid, now)

    def _open(self, want: object_faults.Wanted, now: dt.datetime) -> None:
        spec = want.rule.fault
        fault = Fault(
            id=want.id, node=want.node, entity=want.entity, code=spec.code, component=spec.component, count=1,
            first_seen=want.since, last_seen=now, fatal=spec.fatal, action=spec.action, state=FaultState.OPEN,
            description=spec.description or want.rule.spec.description, message=want.message,
            pattern=want.rule.id, metadata={"source": SOURCE, "rule": want.rule.id, "object": want.object},
        )  # fmt: skip
        revision = self._write(fault, _revision(now), _event(fault, healthy=False, at=now))
        self.open[fault.id] = (fault, revision)
        self.metrics.opened.labels(want.rule.id).inc()
        self._record(fault, "Detected", "object fault opened")

    def _resolve(self, fid: str, now: dt.datetime) -> None:
        fault, revision = self.open[fid]
        rule = self.rules.get(fault.metadata.get("rule", ""))
        done = fault.model_copy(update={
            "state": FaultState.RESOLVED, "resolved_at": now, "last_seen": now,
            "description": rule.fault.description if rule else fault.description,
        })  # fmt: skip
        self._write(done, max(_revision(now), revision + 1), _event(done, healthy=True, at=now))
        del self.open[fid]
        self.metrics.resolved.labels(fault.metadata.get("rule", "")).inc()
        self._record(done, "Resolved", "object fault resolved")

    def _write(self, fault: Fault, revision: int, event: HealthEvent) -> int:
        """Write the change's health event, then the fault (with `analyzer_feed`: both fed to the cluster
        analyzer, as writer FEED_WRITER); a stored revision as new (a clock that went back) is passed by
        one. The revision written."""
        if self.settings.analyzer_feed:
            self.store.record_batch([event], [(fault, revision)], writer=FEED_WRITER)
            if self._stored_revision(fault) == revision:
                return revision
        else:
            self.store.record_events([event])
            if self.store.write_fault(fault, revision):
                return revision
        revision = max(revision, self._stored_revision(fault) or 0) + 1
        if self.settings.analyzer_feed:
            self.store.record_batch([], [(fault, revision)], writer=FEED_WRITER)
        else:
            self.store.write_fault(fault, revision)
        return revision

    def _stored_revision(self, fault: Fault) -> int | None:
        return self.store.fault_revision(fault.id)

    def _record(self, fault: Fault, action: str, what: str) -> None:
        rule, obj = fault.metadata.get("rule", ""), fault.metadata.get("object", "")
        fields = {"node": fault.node, "code": fault.code, "fault_key": fault.id, "rule": rule, "object": obj}
        log.info(what, extra=fields)
        if not self.settings.events:
            return
        resolved = fault.state == FaultState.RESOLVED
        try:
            kube.events.post_node(
                self.api, fault.node, reason=f"{fault.code}Resolved" if resolved else fault.code,
                note=(fault.message or fault.description) + (" (resolved)" if resolved else ""),
                action=action, warning=fault.fatal and not resolved, controller=CONTROLLER, instance=AGENT,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - an Event is a record, never a reason to fail the change
            log.warning(
                "could not post Event", extra={**fields, "error": bounds.clip(str(exc), bounds.ERROR_TEXT)}
            )

    def _export(self) -> None:
        self.metrics.open.set(len(self.open))
        for rule_id, count in self.faults.errors.items():
            self.metrics.rule_errors.labels(rule_id).set(count)
        for informer in self.informers.values():
            name = str(informer.target)
            self.metrics.lists.labels(name).set(informer.stats.lists)
            self.metrics.expired.labels(name).set(informer.stats.expired)
            self.metrics.watch_errors.labels(name).set(informer.stats.errors)

    def healthy(self) -> bool:
        """The loop and every watch made progress within their limits (see `alive`)."""
        return self.alive()


def _revision(now: dt.datetime) -> int:
    return int(now.timestamp() * 1_000_000)


def _fault_of(record: store.FaultRecord) -> Fault:
    return Fault(
        id=record.id, node=record.node, entity=Entity(type=record.entity.type, id=record.entity.id),
        code=record.code, component=Component(record.component), count=record.count,
        first_seen=record.first_seen, last_seen=record.last_seen, fatal=record.fatal,
        action=Action(record.action), state=FaultState.OPEN, message=record.message, pattern=record.pattern,
        metadata=record.metadata,
    )  # fmt: skip


def _event(fault: Fault, *, healthy: bool, at: dt.datetime) -> HealthEvent:
    entities = (fault.entity,) if fault.entity.id else ()
    return HealthEvent(
        id=event_id(fault.node, SOURCE, fault.entity.type, fault.entity.id, fault.code, at), node=fault.node,
        agent=AGENT, component=fault.component, check=fault.metadata.get("rule", ""), code=fault.code,
        entities=entities, healthy=healthy, fatal=fault.fatal and not healthy,
        action=Action.NONE if healthy else fault.action, message=fault.message, metadata=dict(fault.metadata),
        generated_at=at, observed_at=fault.first_seen if not healthy else at,
    )  # fmt: skip
