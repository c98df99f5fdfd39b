"""The quarantine worker (`faultline worker quarantine`): cordon, taint and label nodes with open faults;
release them when every fault is resolved.

Level-triggered: a claimed fault only says "look at this node". The worker reads the node's open faults
from the store and the Node from the API server, computes what faultline wants on it (`workers.rules`),
and applies the difference in one merge patch guarded by the Node's resourceVersion. What faultline added
is recorded in the annotation `faultline.io/quarantine` so that exactly that is removed later, including
after restarts and rule changes; a node cordoned by an operator stays cordoned.

A resync pass (every `resync_interval`) revisits the nodes faultline holds and the faults the breaker
held back: that is where nodes are released (after `hold_down` since their last fault resolved) and
where held-back quarantines go ahead once the breaker half-opens. The circuit breaker (`workers.breaker`)
lives in the store's `nodes` collection (document `breaker:quarantine`), next to one document per node
faultline holds (`quarantined`, `quarantined_at`, the faults, what it owns). Faults whose last sighting
is older than `max_fault_age` when a worker first sees them are recorded (`quarantine.state: stale`)
and never acted on: a worker back from an outage does not replay old faults.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from faultline import kube, store
from faultline.errors import PermanentError
from faultline.models import FaultState
from workers import breaker, common, rules

log = logging.getLogger("faultline.workers.quarantine")
STAGE = "quarantine"
WORKER = "quarantine"
OWNED_ANNOTATION = "faultline.io/quarantine"
BREAKER_ID = "breaker:quarantine"
STALE, BLOCKED, OPTED_OUT, DRY_RUN, GONE = "stale", "blocked", "opted-out", "dry-run", "node-missing"


@dataclass(frozen=True)
class Settings:
    rules: tuple[rules.Rule, ...] = rules.DEFAULT_RULES
    breaker: breaker.BreakerConfig = breaker.DEFAULT
    hold_down: dt.timedelta = dt.timedelta(seconds=60)
    max_fault_age: dt.timedelta = dt.timedelta(hours=1)
    dry_run: bool = False
    lease: dt.timedelta = dt.timedelta(seconds=30)
    threads: int = 16
    resync_interval: float = 5.0
    gpu_count_ttl: float = 30.0
    qps: float = 200.0
    burst: int = 400


class QuarantineWorker:
    def __init__(self, st: store.Store, api: kube.ApiClient, settings: Settings, owner: str) -> None:
        self.store = st
        self.api = api
        self.core = kube.core(api)
        self.settings = settings
        self.owner = owner
        self.metrics = common.WorkerMetrics(WORKER)
        self.limiter = common.RateLimiter(settings.qps, settings.burst)
        self.node_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self.locks_lock = threading.Lock()
        self.breaker_lock = threading.Lock()
        self.gpu_nodes: tuple[float, int] = (-1e9, 0)
        self.loop = common.ClaimLoop(
            st,
            STAGE,
            owner,
            self._handle,
            lease=settings.lease,
            threads=settings.threads,
            metrics=self.metrics,
        )
        self.stop = self.loop.stop

    # -- running -------------------------------------------------------------------------------------
    def start(self) -> list[threading.Thread]:
        threads = self.loop.start()
        resync = threading.Thread(target=self._resync_forever, name="quarantine-resync", daemon=True)
        resync.start()
        return [*threads, resync]

    def _resync_forever(self) -> None:
        while not self.stop.wait(self.settings.resync_interval):
            try:
                self.resync()
                self.store.reap(STAGE, max_attempts=10)
                self.metrics.queue.set(self.store.faults.count_documents({f"{STAGE}.state": store.PENDING}))
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                log.warning("resync failed: %s", exc)

    def resync(self) -> None:
        """Revisit nodes faultline holds and faults the breaker held back."""
        nodes = {d["_id"] for d in self.store.nodes.find({"quarantined": True}, {"_id": 1})}
        nodes |= {d["node"] for d in self.store.faults.find({f"{STAGE}.state": BLOCKED}, {"node": 1})}
        for node in sorted(nodes):
            self.reconcile(node)

    def _handle(self, claim: store.Claim) -> str:
        doc = claim.doc
        now = self.store.clock()
        last_seen = common.as_utc(doc.get("last_seen"))
        if last_seen is not None and now - last_seen > self.settings.max_fault_age:
            self.metrics.actions.labels(result=STALE).inc()
            return STALE  # recorded, not acted on
        result = self.reconcile(str(doc["node"]))
        return BLOCKED if result == BLOCKED and doc.get("state") == FaultState.OPEN else store.DONE

    # -- one node --------------------------------------------------------------------------------------
    def _lock(self, node: str) -> threading.Lock:
        with self.locks_lock:
            return self.node_locks[node]

    def reconcile(self, node: str) -> str:
        """Bring one node to what its open faults call for; returns what happened."""
        with self._lock(node):
            for _ in range(5):
                try:
                    result = self._reconcile(node)
                except kube.ApiException as exc:
                    if exc.status == 409:
                        continue  # the Node changed under us: read it again
                    raise
                self.metrics.actions.labels(result=result).inc()
                return result
        raise PermanentError(f"node {node}: five conflicting updates in a row")

    def _open_faults(self, node: str) -> tuple[list[rules.OpenFault], dt.datetime | None]:
        """The node's open faults that count (not stale), and when its last resolved fault resolved."""
        faults, last_resolved = [], None
        for doc in self.store.faults.find({"node": node}):
            if doc.get("state") == FaultState.RESOLVED:
                resolved = common.as_utc(doc.get("resolved_at"))
                if resolved is not None and (last_resolved is None or resolved > last_resolved):
                    last_resolved = resolved
                continue
            if doc.get(STAGE, {}).get("state") == STALE:
                continue
            faults.append(rules.OpenFault.from_doc(doc))
        return faults, last_resolved

    def _reconcile(self, node: str) -> str:
        now = self.store.clock()
        try:
            obj = kube.read_json(self.api, self.core.read_node, node)
        except kube.ApiException as exc:
            if exc.status == 404:
                self.store.nodes.update_one({"_id": node}, {"$set": {"quarantined": False, "gone": True}})
                return GONE
            raise
        meta, spec = obj.get("metadata", {}), obj.get("spec", {})
        labels = dict(meta.get("labels") or {})
        annotations = dict(meta.get("annotations") or {})
        owned = _owned(annotations.get(OWNED_ANNOTATION), node)
        taints = tuple(sorted((t["key"], t.get("value", ""), t["effect"]) for t in spec.get("taints") or ()))
        state = rules.NodeState(bool(spec.get("unschedulable")), taints, labels, owned)
        faults, last_resolved = self._open_faults(node)
        if labels.get(rules.MANAGED_LABEL) == "false":
            want = rules.Desired()  # opted out: only take back what faultline put there before
            outcome = OPTED_OUT
        else:
            want = rules.desired(self.settings.rules, faults, labels)
            outcome = "quarantined" if want.quarantined else "released"
        holds = owned != rules.Owned()
        if want.quarantined and not holds:
            admitted = self._admit(node, now)
            if not admitted:
                self._record_blocked(node, want)
                return BLOCKED
        releasing = not want.quarantined and holds and outcome != OPTED_OUT
        if releasing and last_resolved is not None and now - last_resolved < self.settings.hold_down:
            return "holding"  # the resync pass releases it once the hold-down is over
        p = rules.plan(state, want)
        if not p.changed and annotations.get(rules.FAULTS_ANNOTATION, "") == ",".join(want.faults):
            self._record(node, want, p, now, changed=False)
            return "unchanged"
        if self.settings.dry_run:
            self.store.upsert(
                self.store.nodes, {"_id": f"dry-run:{node}"},
                {"$set": {"node": node, "at": now, "would": _describe(p, want)}},
            )  # fmt: skip
            return DRY_RUN
        self._patch(obj, p, want)
        common.post_event(
            self.api, node, reason="FaultlineQuarantined" if want.quarantined else "FaultlineReleased",
            note=_describe(p, want), action="Quarantine" if want.quarantined else "Release",
            warning=want.quarantined, worker=WORKER, owner=self.owner,
        )  # fmt: skip
        self._record(node, want, p, now, changed=True)
        if want.quarantined and not holds:
            first = min((common.as_utc(d.get("first_seen")) or now for d in self.store.faults.find(
                {"_id": {"$in": list(want.faults)}}, {"first_seen": 1})), default=now)  # fmt: skip
            self.metrics.latency.observe(max(0.0, (now - first).total_seconds()))
        return outcome if want.quarantined or holds else "unchanged"

    def _patch(self, obj: dict[str, Any], p: rules.Plan, want: rules.Desired) -> None:
        labels: dict[str, str | None] = {**p.set_labels, **dict.fromkeys(p.remove_labels)}
        held = p.owned != rules.Owned()
        body = {
            "metadata": {
                "resourceVersion": obj["metadata"]["resourceVersion"],  # a concurrent change: 409, re-read
                "labels": labels,
                "annotations": {
                    OWNED_ANNOTATION: json.dumps(p.owned.as_json(), separators=(",", ":")) if held else None,
                    rules.FAULTS_ANNOTATION: ",".join(want.faults) if held else None,
                },
            },
            "spec": {
                "unschedulable": p.unschedulable or None,
                "taints": [{"key": k, "value": v, "effect": e} for k, v, e in p.taints] or None,
            },
        }
        self.limiter.take()
        self.core.patch_node(obj["metadata"]["name"], body, _content_type="application/merge-patch+json")

    def _record(
        self, node: str, want: rules.Desired, p: rules.Plan, now: dt.datetime, *, changed: bool
    ) -> None:
        held = p.owned != rules.Owned()
        fields: dict[str, Any] = {
            "quarantined": held, "faults": list(want.faults), "owned": p.owned.as_json(), "checked_at": now,
        }  # fmt: skip
        if changed:
            fields["quarantined_at" if held else "released_at"] = now
        update: dict[str, Any] = {"$set": fields}
        if changed and held:
            previous = self.store.nodes.find_one({"_id": node}, {"quarantined": 1}) or {}
            if previous.get("quarantined"):
                del fields["quarantined_at"]  # still held: the window counts the first quarantine only
        self.store.upsert(self.store.nodes, {"_id": node}, update)
        if held and want.faults:
            self.store.faults.update_many(
                {"_id": {"$in": list(want.faults)}, f"{STAGE}.state": BLOCKED},
                {"$set": {f"{STAGE}.state": store.DONE}},
            )

    def _record_blocked(self, node: str, want: rules.Desired) -> None:
        self.store.faults.update_many(
            {"_id": {"$in": list(want.faults)}, f"{STAGE}.state": {"$ne": STALE}},
            {"$set": {f"{STAGE}.state": BLOCKED}},
        )  # the claim's completion sets its own fault; the others wait for the resync too

    # -- the breaker -------------------------------------------------------------------------------------
    def _gpu_node_count(self) -> int:
        at, count = self.gpu_nodes
        now = self.store.clock().timestamp()
        if now - at > self.settings.gpu_count_ttl:
            nodes = kube.read_json(self.api, self.core.list_node)["items"]
            count = sum(_gpus(n) > 0 for n in nodes)
            self.gpu_nodes = (now, count)
        return count

    def breaker_state(self, now: dt.datetime) -> breaker.BreakerState:
        doc = self.store.nodes.find_one({"_id": BREAKER_ID}) or {}
        stored = breaker.BreakerState(doc.get("state", breaker.CLOSED), common.as_utc(doc.get("since")),
                                      doc.get("reason", ""))  # fmt: skip
        return breaker.current(stored, self.settings.breaker, now)

    def _admit(self, node: str, now: dt.datetime) -> bool:
        with self.breaker_lock:
            state = self.breaker_state(now)
            since = breaker.counting_from(state, self.settings.breaker, now)
            recent = self.store.nodes.count_documents(
                {"quarantined_at": {"$gte": _naive(since)}, "_id": {"$ne": node}}
            )  # a retry after a conflict must not count the node's own reservation
            admitted, new = breaker.admit(state, self.settings.breaker, now, recent, self._gpu_node_count())
            stored = (self.store.nodes.find_one({"_id": BREAKER_ID}) or {}).get("state", breaker.CLOSED)
            if new != state or new.state != stored:
                self.store.upsert(
                    self.store.nodes, {"_id": BREAKER_ID},
                    {"$set": {"state": new.state, "since": new.since, "reason": new.reason}},
                )  # fmt: skip
                if new.state == breaker.OPEN and state.state != breaker.OPEN:
                    log.warning("circuit breaker open: %s", new.reason)
            if admitted:  # reserve the slot now: concurrent quarantines count it
                self.store.upsert(self.store.nodes, {"_id": node}, {"$set": {"quarantined_at": now}})
            return admitted


def _gpus(node: dict[str, Any]) -> int:
    try:
        return int((node.get("status", {}).get("capacity") or {}).get("nvidia.com/gpu", "0"))
    except ValueError:
        return 0


def _naive(t: dt.datetime) -> dt.datetime:
    return t.astimezone(dt.UTC).replace(tzinfo=None)


def _owned(raw: str | None, node: str) -> rules.Owned:
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
    return (f"{'cordoned' if want.cordon else 'not cordoned'}; taints {taints or 'none'}; "
            f"faults {', '.join(want.faults)}")[:1024]  # fmt: skip
