"""The quarantine worker (`faultline worker quarantine`): cordon, taint and label nodes with open faults;
release them when every fault is resolved.

Level-triggered: a claimed fault (its work item `quarantine/<fault key>` in the store's `queue`) only
says "look at this node". The worker reads the node's open faults
from the store and the Node from the API server, computes what faultline wants on it (`workers.rules`),
and applies the difference in one merge patch guarded by the Node's resourceVersion. What faultline added
is recorded in the annotation `faultline.io/quarantine` so that exactly that is removed later, including
after restarts and rule changes; a node cordoned by an operator stays cordoned.

A resync pass (every `resync_interval`) revisits the nodes faultline holds and the faults the breaker
held back: that is where nodes are released (after `hold_down` since their last fault resolved, and
not while the janitor is still carrying out or validating a repair of the node) and
where held-back quarantines go ahead once a person resets the breaker. The circuit breaker (`workers.breaker`)
lives in the store's `nodes` collection (document `breaker:quarantine`), next to one document per node
faultline holds (`quarantined`, `quarantined_at`, the faults, what it owns). Faults whose last sighting
is older than `max_fault_age` when a worker first sees them are recorded (their work item turns
`quarantine.state: stale`) and never acted on: a worker back from an outage does not replay old faults.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from pydantic import SkipValidation

from faultline import bounds, conditions, config, evidence, kube, liveness, store
from faultline.errors import ConflictError, NotFoundError, TransientError
from faultline.models import Action, Component, FaultState
from workers import attribution, breaker, common, fleet_state, overrides, rules, suppression

log = logging.getLogger(__name__)
STAGE = store.Stage.QUARANTINE
WORKER = "quarantine"
OWNED_ANNOTATION = "faultline.io/quarantine"
BREAKER_ID = store.BREAKER_ID
BREAKER_REFRESH_S = 1.0
BREAKER_TRIES = 3  # decisions made again when the stored breaker changed under this replica
STALE_VIEW = dt.datetime.min.replace(tzinfo=dt.UTC)  # a view's read time that forces the next read
# a node this replica admitted counts against the breaker until a read of the store shows its record (its
# patch and record may still be under way: a slow API server, a conflict), for this long at most
ADMITTED_CARRY_S = 30.0
FULL_RESYNC_S = 60.0
# Work items are taken fatal faults first, then in first-seen order: after an outage every open fault's
# item waits (non-fatal ones too, which the default rules act on by doing nothing), and the nodes to
# cordon must not queue behind hundreds of those (the chaos suite's 10-minute store outage). Newer work
# mostly sorts after a list already read, so reading the list again before it runs out only drops items
# other replicas took (a failed claim shows that too); each read is three whole-collection scans on
# FerretDB (~150 ms of its CPU at 500 items). A fatal fault that comes while a long list of others is
# worked waits for the next read, CANDIDATES_REFRESH_S at most.
CANDIDATES_REFRESH_S = 5.0
STALE, BLOCKED, PAUSED_ITEM = store.State.STALE, store.State.BLOCKED, store.State.PAUSED  # items' own states
REFUSED = store.State.REFUSED
KEY_WAIT_S = 5.0  # a fault whose node has not published its agent key yet is looked at again after this
DRY_RUN, GONE = "dry-run", "node-missing"
OPTED_OUT = overrides.OPTED_OUT
PAUSED, CANCELLED, FORCED = overrides.PAUSED, overrides.CANCELLED, overrides.FORCED


_Rules = tuple[rules.Rule, ...]
_Breaker = breaker.BreakerConfig


class Settings(config.QuarantineTuning):
    """The worker's tunables (defined once, in `QuarantineConfig`) and what is loaded from the rest of it."""

    rules: SkipValidation[_Rules] = rules.DEFAULT_RULES
    breaker: SkipValidation[_Breaker] = breaker.DEFAULT

    @classmethod
    def from_config(cls, cfg: config.QuarantineConfig) -> Settings:
        limits = breaker.BreakerConfig(
            window=cfg.breaker_window, max_share=cfg.breaker_max_share, max_count=cfg.breaker_max_count,
            max_held_share=cfg.breaker_max_held_share, max_held=cfg.breaker_max_held or None,
        )  # fmt: skip
        return config.part(cfg, cls, rules=rules.load_rules(cfg.rules), breaker=limits)


class QuarantineWorker:
    def __init__(
        self, st: store.Store, api: kube.ApiClient, settings: Settings, owner: str, *,
        stall: float = liveness.DEFAULT_LIMIT_S, verifier: evidence.Verifier | None = None,
    ) -> None:  # fmt: skip
        """`verifier`: act only on faults whose writer it proves (`workers.attribution`); None: on any."""
        self.alive = liveness.Liveness()  # what its /healthz answers: `stall` s without progress fails it
        self.store = st
        self.api = api
        self.settings = settings
        self.owner = owner
        self.metrics = common.WorkerMetrics(WORKER)
        self.attribution = None if verifier is None else attribution.Attribution(verifier, self.metrics)
        self.limiter = common.RateLimiter(settings.qps, settings.burst)
        self.node_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self.locks_lock = threading.Lock()
        self.breaker_lock = threading.Lock()
        self.gpu_nodes: tuple[float, int] = (-1e9, 0)
        self.breaker_view: _BreakerView | None = None
        self.full_resync_at = 0.0
        # when the candidates' nodes' faults were read (time.monotonic(), taken before the read) and what
        # was read (node -> its faults): one tuple, replaced whole once a read is done (see `_prefetch`)
        self.prefetched: tuple[float, dict[str, list[store.FaultRecord]]] = (0.0, {})
        self.reconciled_at: dict[str, float] = {}  # node -> when its last reconcile ended (monotonic)
        self.state = fleet_state.QuarantineState(st, self.metrics.registry)
        self.loop = common.ClaimLoop(
            st,
            STAGE,
            owner,
            self._handle,
            lease=settings.lease,
            threads=settings.threads,
            metrics=self.metrics,
            resync=self.resync,
            observe=self._observe,
            every=settings.resync_interval.total_seconds(),
            prefetch=self._prefetch,
            collection=store.Work.QUEUE,
            order=("-fatal", "first_seen"),
            refresh=CANDIDATES_REFRESH_S,
            api=api,
            alive=self.alive,
            stall=stall,
        )
        self.stop = self.loop.stop

    # -- running -------------------------------------------------------------------------------------
    def start(self) -> list[threading.Thread]:
        return self.loop.start()

    def halt(self, timeout: float = 30.0) -> bool:
        return self.loop.halt(timeout)

    def resync(self) -> None:
        """Revisit the held nodes that may be released (a fault behind the hold resolved, whatever other
        faults the node has open) and the faults the breaker held back; every FULL_RESYNC_S, every held
        node (to put back what someone else changed). Found with a few queries, whatever the number of
        nodes."""
        held = self.store.held_node_names()
        blocked = self.store.nodes_in_state(STAGE, BLOCKED) | self.store.nodes_in_state(STAGE, PAUSED_ITEM)
        if self.attribution is not None:  # a refused fault counts once its own agent writes it again
            blocked |= self.store.nodes_in_state(STAGE, REFUSED)
        forced = {
            n["metadata"]["name"] for n in kube.nodes.list_all(self.api, label_selector=overrides.FORCE_LABEL)
        }
        due = blocked | forced
        if time.monotonic() - self.full_resync_at >= FULL_RESYNC_S:
            self.full_resync_at = time.monotonic()
            self.mark_silent_agents()
            due |= held
        elif held:
            due |= self.store.holds_with_faults_gone()
        read_at = time.monotonic()
        docs = self.store.faults_of(due, STAGE)
        for node in sorted(due):
            self.reconcile(node, record_unchanged=False, docs=docs.get(node, []), read_at=read_at)

    def mark_silent_agents(self) -> list[str]:
        """Set Unknown the faultline conditions of every node whose agent has not reported for
        `agent_stale_after` (faultline.conditions.stale); the nodes changed. The count of GPU nodes is
        taken from the same read."""
        now, marked = self.store.clock(), []
        nodes = kube.nodes.list_all(self.api)
        # the same read counts the GPU nodes (the breaker's denominator): one read of every Node a minute
        # fewer per replica (at 10,000 Nodes one read is some 15 MB)
        self.gpu_nodes = (now.timestamp(), sum(_gpus(n) > 0 for n in nodes))
        for obj in nodes:
            name = obj["metadata"]["name"]
            patches = conditions.stale(kube.bodies.node_conditions(obj), now, self.settings.agent_stale_after)
            if not patches:
                continue
            kube.nodes.write_conditions(self.api, name, patches, [])
            log.warning("the node's agent is not reporting: its conditions set Unknown",
                        extra={"node": name, "item": [p["type"] for p in patches]})  # fmt: skip
            marked.append(name)
        return marked

    def _prefetch(self, candidates: list[dict[str, Any]]) -> None:
        """The candidates' nodes' faults, read right after the candidates themselves, so each is at least
        as new as the claimed fault. A fault that changes after this read has its own claim or resync
        pass to come, which reads again: the node still converges. The read's time and its documents are
        replaced together, once the read is done: other threads handle claims meanwhile, and a claim that
        took the new time with the documents of the read before (long before, after an outage) would
        count them as newer than the node's last reconcile and cordon a released node again (the chaos
        suite's store outage on a loaded machine: one node cordoned twice)."""
        at = time.monotonic()  # before the read: its documents are at least this new
        self.prefetched = (at, self.store.faults_of({str(d["node"]) for d in candidates}, STAGE))

    def _handle(self, claim: store.Claim) -> store.State:
        item = store.WorkItem.from_doc(claim.doc)  # the fault's work item in `queue`
        node = item.node
        read_at, prefetched = self.prefetched  # the two of one read (see `_prefetch`)
        docs = prefetched.get(node)
        if docs is None or not any(d.id == item.key for d in docs):
            read_at = time.monotonic()
            docs = self.store.faults_of({node}, STAGE)[node]  # not read with the candidates: read it now
        doc = next((d for d in docs if d.id == item.key), None)
        now = self.store.clock()
        last_seen = item.last_seen if doc is None else doc.last_seen
        if last_seen is not None and now - last_seen > self.settings.max_fault_age:
            self.metrics.actions.labels(result=STALE).inc()
            return STALE  # recorded, not acted on
        if self.attribution is not None and doc is not None and doc.state == FaultState.OPEN:
            verdict = self.attribution.check(doc)
            if verdict.retry:  # its agent's key is not on the Node yet (the agent just started)
                raise TransientError(f"fault {doc.id}: {verdict.reason}", delay=KEY_WAIT_S)
            if not verdict.ok:
                self.metrics.actions.labels(result=REFUSED).inc()
                return REFUSED  # recorded, not acted on (the resync pass looks again)
        result = self.reconcile(node, docs=docs, read_at=read_at)
        still_open = doc is not None and doc.state == FaultState.OPEN
        return store.State(result) if result in (BLOCKED, PAUSED) and still_open else store.State.DONE

    # -- one node --------------------------------------------------------------------------------------
    def _lock(self, node: str) -> threading.Lock:
        with self.locks_lock:
            return self.node_locks[node]

    def reconcile(
        self,
        node: str,
        *,
        record_unchanged: bool = True,
        docs: list[store.FaultRecord] | None = None,
        read_at: float | None = None,
    ) -> str:
        """Bring one node to what its open faults call for; returns what happened. `record_unchanged`:
        write the node's record even when nothing changed (a claim does: its node may have been patched
        by a worker that died before recording it; the resync pass does not). `docs`: the node's fault
        documents as read at `read_at` (time.monotonic(); None: read them now). Documents read before
        another reconcile of the node ended are read again: a thread that waited for the node's lock
        with an older view must not undo what a newer one did (the chaos suite on a slow store: a node
        released on its faults resolved, then cordoned again by a claim holding a read from before the
        resolution, then released: a duplicate cordon)."""
        with self._lock(node):
            if docs is not None and (read_at is None or self.reconciled_at.get(node, -1.0) >= read_at):
                docs = None
            try:
                return self._reconcile_locked(node, record_unchanged, docs)
            finally:
                self.reconciled_at[node] = time.monotonic()

    def _reconcile_locked(
        self, node: str, record_unchanged: bool, docs: list[store.FaultRecord] | None
    ) -> str:
        for _ in range(5):
            try:
                result = self._reconcile(node, record_unchanged, docs)
            except ConflictError:
                docs = None  # the Node changed under us: read it, and the faults, again
                continue
            self.metrics.actions.labels(result=result).inc()
            return result
        raise TransientError(f"node {node}: five conflicting updates in a row", delay=1.0)

    def _open_faults(
        self, node: str, docs: list[store.FaultRecord] | None
    ) -> tuple[list[rules.OpenFault], dt.datetime | None, list[store.FaultRecord]]:
        """The node's open faults that count (not stale, not suppressed by a derived fault of the node:
        `workers.suppression`, written by a proven writer where that is required), when its last resolved
        fault resolved, and its documents refused (`workers.attribution`)."""
        faults, last_resolved = [], None
        docs = self.store.faults_of({node}, STAGE)[node] if docs is None else docs
        refused: list[store.FaultRecord] = []
        if self.attribution is not None:
            docs, unproven = self.attribution.split(docs)
            refused = [doc for doc, _ in unproven]
        held_back = suppression.suppressed(d for d in docs if d.state != FaultState.RESOLVED)
        for doc in docs:
            if doc.state == FaultState.RESOLVED:
                resolved = doc.resolved_at
                if resolved is not None and (last_resolved is None or resolved > last_resolved):
                    last_resolved = resolved
                continue
            if doc.work is not None and doc.work.state == STALE:
                continue
            if doc.id in held_back:
                log.debug(
                    "fault suppressed", extra={"node": node, "fault_key": doc.id, "by": held_back[doc.id]}
                )
                continue
            faults.append(_open_fault(doc))
        return faults, last_resolved, refused

    def _reconcile(self, node: str, record_unchanged: bool, docs: list[store.FaultRecord] | None) -> str:
        now = self.store.clock()
        try:
            obj = kube.nodes.read(self.api, node)
        except NotFoundError:
            self.store.node_gone(node)
            self.store.close_episode(node, now)
            return GONE
        meta, spec = obj.get("metadata", {}), obj.get("spec", {})
        labels = dict(meta.get("labels") or {})
        annotations = dict(meta.get("annotations") or {})
        owned = owned_record(annotations.get(OWNED_ANNOTATION), node)
        taints = tuple(sorted((t["key"], t.get("value", ""), t["effect"]) for t in spec.get("taints") or ()))
        state = rules.NodeState(bool(spec.get("unschedulable")), taints, labels, owned, annotations)
        if self.attribution is not None:
            self.attribution.learn(node, annotations)
        faults, last_resolved, refused = self._open_faults(node, docs)
        holds = owned != rules.Owned()
        d = overrides.decide(self.settings.rules, faults, state, annotations, meta.get("managedFields"), now)
        want, outcome, cancelled = d.want, d.outcome, d.cancelled
        if want.quarantined and self.settings.hold_annotations:  # other systems leave it alone meanwhile
            want = dataclasses.replace(
                want, annotations=tuple(sorted(self.settings.hold_annotations.items()))
            )
        if d.bad_pause:
            common.post_event(self.api, node, reason="FaultlineBadAnnotation", note=d.bad_pause,
                              action="Quarantine", warning=True, worker=WORKER, owner=self.owner)  # fmt: skip
        if outcome == PAUSED:
            self._park(faults, d.paused, PAUSED_ITEM)  # the resync pass looks again when the pause is over
        if want.quarantined and not holds and outcome != FORCED:
            admitted = self._admit(node, now)
            if not admitted:
                self._park(faults, want, BLOCKED)
                return BLOCKED
        releasing = not want.quarantined and holds and outcome not in (OPTED_OUT, PAUSED, CANCELLED)
        if releasing and last_resolved is not None and now - last_resolved < self.settings.hold_down:
            return "holding"  # the resync pass releases it once the hold-down is over
        if releasing and self.store.repair_in_progress(node):
            return "holding"  # the janitor has not validated its repair yet
        held_for = set(filter(None, annotations.get(rules.FAULTS_ANNOTATION, "").split(",")))
        if releasing and any(d.state != FaultState.RESOLVED or d.id in held_for for d in refused):
            return "holding"  # a document whose writer is not proven may not release it either
        p = rules.plan(state, want)
        cancelled_raw = None if cancelled is None else cancelled.as_json()
        if (
            not p.changed and annotations.get(rules.FAULTS_ANNOTATION, "") == ",".join(want.faults)
            and annotations.get(overrides.CANCELLED_ANNOTATION) == cancelled_raw
        ):  # fmt: skip
            if record_unchanged:
                self._record(node, want, p, now, faults, newly=False)
            return PAUSED if outcome == PAUSED else "unchanged"
        if self.settings.dry_run:
            self.store.record_dry_run(node, now, _describe(p, want))
            return DRY_RUN
        self._patch(obj, p, want, cancelled_raw)
        newly = want.quarantined and not holds
        if holds and not want.quarantined:  # released: how long the node was out of service
            self.state.released(self.store.hold(node), now)
        self._announce(node, d, p, newly=newly)
        self._record(node, want, p, now, faults, newly=newly, released=not want.quarantined)
        if newly:
            firsts = [f.first_seen or now for f in faults if f.key in want.faults]
            self.metrics.latency.observe(max(0.0, (now - min(firsts, default=now)).total_seconds()))
        if outcome == PAUSED:
            return PAUSED
        return outcome if want.quarantined or holds else "unchanged"

    def _announce(self, node: str, d: overrides.Decision, p: rules.Plan, *, newly: bool) -> None:
        """The Event (and log line) of a change faultline made to a node."""
        want, cancelled = d.want, d.cancelled
        reason, note = "FaultlineReleased", _describe(p, want)
        if want.quarantined:  # a new quarantine, or one whose taints or labels changed with its faults
            reason = "FaultlineQuarantined" if newly else "FaultlineQuarantineUpdated"
            if d.outcome == FORCED:
                note = bounds.clip(
                    f"forced by label {overrides.FORCE_LABEL}={d.force}; {note}", bounds.EVENT_NOTE
                )
        elif d.overridden and cancelled is not None:
            reason = "FaultlineQuarantineCancelled"
            note = bounds.clip(
                f"faultline's cordon or taint was taken back by {cancelled.by}"
                f"{' at ' + cancelled.at if cancelled.at else ''}: faults {', '.join(cancelled.faults)} "
                "will not quarantine this node again; a new fault will",
                bounds.EVENT_NOTE,
            )
        elif d.outcome == PAUSED and d.until is not None:
            reason, note = "FaultlinePaused", f"paused until {d.until:%Y-%m-%dT%H:%M:%SZ} ({note})"
        if p.changed or reason != "FaultlineReleased":
            common.post_event(
                self.api, node, reason=reason, note=note,
                action="Quarantine" if want.quarantined else "Release", warning=want.quarantined,
                worker=WORKER, owner=self.owner,
            )  # fmt: skip

    def _patch(self, obj: dict[str, Any], p: rules.Plan, want: rules.Desired, cancelled: str | None) -> None:
        labels: dict[str, str | None] = {**p.set_labels, **dict.fromkeys(p.remove_labels)}
        held = p.owned != rules.Owned()
        body = {
            "metadata": {
                "labels": labels,
                "annotations": {
                    **p.set_annotations,
                    **dict.fromkeys(p.remove_annotations),
                    OWNED_ANNOTATION: json.dumps(p.owned.as_json(), separators=(",", ":")) if held else None,
                    rules.FAULTS_ANNOTATION: ",".join(want.faults) if held else None,
                    overrides.CANCELLED_ANNOTATION: cancelled,
                },
            },
            "spec": {
                "unschedulable": p.unschedulable or None,
                "taints": [{"key": k, "value": v, "effect": e} for k, v, e in p.taints] or None,
            },
        }
        self.limiter.take()
        meta = obj["metadata"]  # guarded: a concurrent change is a ConflictError, and the node is read again
        kube.nodes.patch(self.api, meta["name"], body, resource_version=meta["resourceVersion"])

    def _record(
        self, node: str, want: rules.Desired, p: rules.Plan, now: dt.datetime, faults: list[rules.OpenFault],
        *, newly: bool, released: bool = False,
    ) -> None:  # fmt: skip
        held = p.owned != rules.Owned()
        if held and not newly:  # the node was patched by a claim whose record never got written (the
            hold = self.store.hold(node)  # store went away): the episode starts with this record
            newly = hold is None or not hold.quarantined or hold.quarantined_at is None
        # `newly`: the breaker's window counts the first quarantine of the episode only; the drainer and
        # remediation act on an episode, so a hold recorded without one would never be drained
        # the episode's history, for reports (`faultline report`): opened before the hold's record (a retry
        # after a failure between the two finds the hold and would not open it), closed whenever the node is
        # not held (idempotent: a release whose record was lost still ends it)
        if newly and held:
            behind = [f for f in faults if f.key in want.faults]
            firsts = [f.first_seen for f in behind if isinstance(f.first_seen, dt.datetime)]
            self.store.open_episode(
                node, now, want.faults, [f.code for f in behind], min(firsts, default=None)
            )
        elif not held:
            self.store.close_episode(node, now)
        self.store.record_hold(
            node, faults=want.faults, owned=p.owned.as_json(), at=now, newly=newly, released=released
        )
        if held:
            for fault in faults:
                if fault.stage in (BLOCKED, PAUSED, REFUSED) and fault.key in want.faults:
                    self.store.move_item(STAGE, fault.key, store.State(fault.stage), store.State.DONE)

    def _park(self, faults: list[rules.OpenFault], want: rules.Desired, state: store.State) -> None:
        """The faults held back (by the breaker, or a pause) wait for the resync pass in `state` (the
        claim's own fault is set by its completion)."""
        for fault in faults:
            if fault.key in want.faults and fault.stage and fault.stage not in (state, STALE):
                self.store.move_item(STAGE, fault.key, store.State(fault.stage), state)

    # -- the breaker -------------------------------------------------------------------------------------
    def _gpu_node_count(self) -> int:
        at, count = self.gpu_nodes
        now = self.store.clock().timestamp()
        if now - at > self.settings.gpu_count_ttl.total_seconds():
            nodes = kube.nodes.list_all(self.api)
            count = sum(_gpus(n) > 0 for n in nodes)
            self.gpu_nodes = (now, count)
        return count

    def _observe(self) -> None:
        """The state metrics (the maintenance pass): the store's view, then the GPU node count (at most
        every `gpu_count_ttl`; the API server away: the last count stays)."""
        self.state.refresh()
        try:
            self.state.gpu_nodes.set(self._gpu_node_count())
        except Exception as exc:  # noqa: BLE001 - a metric, never a reason to fail the pass
            log.warning("quarantine: counting the GPU nodes failed: %s", exc)

    def _admit(self, node: str, now: dt.datetime) -> bool:
        """May this node be newly quarantined? The breaker's view (its stored state, and the nodes
        quarantined since it counts, and the nodes held now) is read from MongoDB at most every
        BREAKER_REFRESH_S (a person's reset shows within that time); in between, this replica counts its
        own admissions (until a read shows their records), so it alone never passes a limit, and other
        replicas' admissions show within that time. No database call is made while the decision's lock
        is held, except the refresh itself. A change of the stored state is made only from the revision
        this replica read: when another replica or a person changed it meanwhile (a reset), the view is
        read again and the decision made again on it."""
        for _ in range(BREAKER_TRIES):
            admitted, changed = self._decide(node, now)
            if changed is None:
                return admitted
            state, revision = changed
            if self.store.save_breaker(state.state, state.since, state.reason, revision=revision):
                if state.state == breaker.OPEN:
                    self.metrics.limited.labels(limit="breaker").inc()
                    self.state.trips.inc()
                    self.state.breaker_open.set(1)
                    log.warning("circuit breaker tripped: it stays open until `faultline breaker reset`: %s",
                                state.reason, extra={"node": node, "worker": WORKER})  # fmt: skip
                return admitted  # other replicas count it once its record (quarantined_at) is written
            with self.breaker_lock:  # changed meanwhile: read it again, and decide again on it
                view = self.breaker_view
                if view is not None:
                    view.read_at = STALE_VIEW
                    view.admitted.pop(node, None)
        return False  # the breaker keeps changing under this replica: held back, tried again by the resync

    def _decide(self, node: str, now: dt.datetime) -> tuple[bool, tuple[breaker.BreakerState, int] | None]:
        """The admission on this replica's view, and the stored state's change it needs (with the
        revision it was read at), if any."""
        cfg = self.settings.breaker
        with self.breaker_lock:
            view = self.breaker_view
            if view is None or (now - view.read_at).total_seconds() > BREAKER_REFRESH_S:
                # this replica's recent admissions whose records are not written yet are carried over
                pending = {n: at for n, at in (view.admitted if view else {}).items()
                           if (now - at).total_seconds() < ADMITTED_CARRY_S}  # fmt: skip
                view = self._read_breaker(now)
                if pending:
                    recorded = self.store.quarantined_since(min(pending.values()))
                    view.admitted.update({n: at for n, at in pending.items() if n not in recorded})
            start = breaker.counting_from(view.state, cfg, now)
            mine = {n for n, at in view.admitted.items() if at >= start}
            recent = len(view.counted | mine) - (node in view.counted or node in mine)
            held = len(view.held | set(view.admitted)) - (node in view.held or node in view.admitted)
            admitted, new = breaker.admit(view.state, cfg, now, recent, view.gpu_nodes, held)
            changed = (new, view.revision) if new != view.stored else None
            if admitted:
                view.admitted[node] = now
            if changed is None:
                view.state = new
            else:
                view.state = view.stored = new
                view.revision += 1
            self.breaker_view = view
        return admitted, changed

    def _read_breaker(self, now: dt.datetime) -> _BreakerView:
        doc = self.store.breaker()
        stored = breaker.BreakerState(doc.state, doc.since, doc.reason)
        state = breaker.current(stored)
        since = breaker.counting_from(state, self.settings.breaker, now)
        counted: set[str] = set()
        held: set[str] = set()
        if self.settings.breaker.rate_limited:  # with no limit there is nothing to count against
            counted = self.store.quarantined_since(since)
        if self.settings.breaker.capped:
            held = self.store.held_node_names()
        gpu_nodes = self._gpu_node_count() if self.settings.breaker.limited else 0
        return _BreakerView(now, stored, state, counted, held, {}, gpu_nodes, doc.revision)


@dataclass
class _BreakerView:
    read_at: dt.datetime
    stored: breaker.BreakerState  # as in MongoDB
    state: breaker.BreakerState  # as of now
    counted: set[str]  # nodes quarantined since the breaker counts, as read
    held: set[str]  # nodes held now, as read (the cap)
    admitted: dict[str, dt.datetime]  # admitted by this replica since the read (and ADMITTED_CARRY_S before)
    gpu_nodes: int
    revision: int  # the stored state's, as read (see `Store.save_breaker`)


def _gpus(node: dict[str, Any]) -> int:
    try:
        return int((node.get("status", {}).get("capacity") or {}).get("nvidia.com/gpu", "0"))
    except ValueError:
        return 0


def _open_fault(doc: store.FaultRecord) -> rules.OpenFault:
    """What the rules look at in a stored fault."""
    stage = "" if doc.work is None else doc.work.state
    return rules.OpenFault(doc.id, doc.code, Component(doc.component), Action(doc.action), doc.fatal,
                           doc.count, doc.first_seen, stage)  # fmt: skip


def owned_record(raw: str | None, node: str) -> rules.Owned:
    """faultline's ownership record; a damaged one is reported and treated as owning nothing (so nothing
    of anyone else's is removed)."""
    if not raw:
        return rules.Owned()
    try:
        return rules.Owned.from_json(json.loads(raw))
    except (ValueError, TypeError) as exc:
        log.warning(
            "node %s: annotation %s is not faultline's record (%s); ignoring it", node, OWNED_ANNOTATION, exc
        )
        return rules.Owned()


def _describe(p: rules.Plan, want: rules.Desired) -> str:
    if not want.quarantined:
        return "released: every fault resolved" + ("; uncordoned" if not p.unschedulable else "")
    taints = ", ".join(f"{k}={v}:{e}" for k, v, e in want.taints)
    return bounds.clip(
        f"{'cordoned' if want.cordon else 'not cordoned'}; taints {taints or 'none'}; "
        f"faults {', '.join(want.faults)}",
        bounds.EVENT_NOTE,
    )
