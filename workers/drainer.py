"""The drainer (`faultline worker drain`): empties the nodes faultline quarantined, per namespace mode.

Work items are nodes, not faults: a node the quarantine worker holds cordoned (its `nodes` document says
`quarantined` and owns the cordon, or the node is cordoned with faultline's taint) gets a document in
`drains` for that quarantine (its `episode` is the quarantine time), whose `drain` stage is claimed like
a fault's stage. Nodes with fatal faults sort first. The claim holder drains the node until nothing
evictable is left, renewing its lease; a replica that dies mid-drain loses its lease and another takes
the node over, continuing from the pods that are left (level-triggered: it lists them again) and from the
per-pod record in the drain document (when a pod was first evicted, for DeleteAfterTimeout).

Per-namespace mode, the namespace label `faultline.io/drain-mode` (default `--default-mode`):
- `Immediate`: the Eviction API; a 429 (a PodDisruptionBudget says not now) is retried with back-off,
  and the pod is never deleted around the budget.
- `AllowCompletion`: nothing is evicted; the drain waits for the pods to finish.
- `DeleteAfterTimeout`: evicted like Immediate, and deleted once `delete_after` has passed since the
  first eviction attempt.
DaemonSet pods, mirror (static) pods, finished pods and the janitor's repair pods (label
`faultline.io/repair`: the chaos suite's store outage saw a drain evict one) are left alone; with
`gpu_only`, so are pods that request no `nvidia.com/gpu`; pods of `system_namespaces` are never evicted
(recorded as skipped, with the reason). With `partial_gpu_drain`, a node whose faults are each on one GPU
and need at most a reset of it loses only the pods of those GPUs (`workers.drain_scope`: when, and how the
node agent's GPU -> pod mapping is trusted); the drain's `scope` records which. A node released while
draining ends its drain.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from typing import Any

from faultline import config, kube, liveness, store
from faultline.errors import NotFoundError, ThrottledError
from workers import common, drain_scope

log = logging.getLogger(__name__)
WORKER = "drain"
STAGE = store.Stage.NODEDRAIN
MODE_LABEL = "faultline.io/drain-mode"
MODES = ("Immediate", "AllowCompletion", "DeleteAfterTimeout")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
REPAIR_LABEL = "faultline.io/repair"  # the janitor's repair pods (a drain that evicted one would undo it)


class Settings(config.DrainTuning):
    """The drainer's tunables, defined once in `DrainConfig`."""

    @classmethod
    def from_config(cls, cfg: config.DrainConfig) -> Settings:
        return config.part(cfg, cls)


def evictable(pod: dict[str, Any], gpu_only: bool) -> bool:
    """Pods a drain moves: not DaemonSet-owned, not mirror pods, not finished, not faultline's own repair
    pods; with `gpu_only`, only pods that request GPUs."""
    meta, status = pod["metadata"], pod.get("status", {})
    if status.get("phase") in ("Succeeded", "Failed"):
        return False
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return False
    if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
        return False
    if REPAIR_LABEL in (meta.get("labels") or {}):  # the janitor's repair of this node, whatever namespace
        return False
    return requests_gpus(pod) if gpu_only else True


def _resources(pod: dict[str, Any]) -> set[str]:
    spec = pod.get("spec", {})
    names: set[str] = set()
    for c in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        names.update(c.get("resources", {}).get("limits") or {})
        names.update(c.get("resources", {}).get("requests") or {})
    return names


def requests_gpus(pod: dict[str, Any]) -> bool:
    """The pod requests `nvidia.com/gpu`."""
    return "nvidia.com/gpu" in _resources(pod)


def asks_gpus(pod: dict[str, Any]) -> bool:
    """The pod may hold a GPU: it requests an `nvidia.com/` resource (GPUs, shared GPUs, MIG devices) or
    has resource claims (DRA). A partial drain evicts such a pod when the mapping does not name it."""
    if pod.get("spec", {}).get("resourceClaims"):
        return True
    return any(name.startswith("nvidia.com/") for name in _resources(pod))


class Drainer:
    def __init__(
        self, st: store.Store, api: kube.ApiClient, settings: Settings, owner: str, *,
        stall: float = liveness.DEFAULT_LIMIT_S,
    ) -> None:  # fmt: skip
        self.alive = liveness.Liveness()  # what its /healthz answers: `stall` s without progress fails it
        self.store = st
        self.api = api
        self.settings = settings
        self.owner = owner
        self.metrics = common.WorkerMetrics(WORKER)
        self.limiter = common.RateLimiter(settings.qps, settings.burst)
        self.modes: dict[str, tuple[float, str]] = {}
        self.system_namespaces = frozenset(settings.system_namespaces)
        self.modes_lock = threading.Lock()
        self.loop = common.ClaimLoop(
            st, STAGE, owner, self._handle, lease=settings.lease, threads=settings.threads,
            metrics=self.metrics, collection=store.Work.DRAINS, order=("-fatal", "first_seen"),
            resync=self.resync, every=settings.resync_interval.total_seconds(), max_attempts=20, api=api,
            alive=self.alive, stall=stall,
        )  # fmt: skip
        self.stop = self.loop.stop

    def start(self) -> list[threading.Thread]:
        return self.loop.start()

    def halt(self, timeout: float = 30.0) -> bool:
        return self.loop.halt(timeout)

    def resync(self) -> None:
        """A drain document for each quarantine episode of each node faultline holds cordoned."""
        episodes = self.store.drain_episodes()
        for hold in self.store.held_nodes():
            if not hold.owned.cordoned or hold.quarantined_at is None:
                continue
            episode = hold.quarantined_at
            if episodes.get(hold.id, ...) == episode:
                continue
            fatal = self.store.any_fatal(hold.faults)
            if hold.id not in episodes:
                self.store.open_drain(hold.id, episode, fatal=fatal)
            else:  # a new quarantine of a node drained before: start over (the claim numbers go on)
                self.store.reopen_drain(hold.id, episode, fatal=fatal)

    # -- one node -----------------------------------------------------------------------------------------
    def _mode(self, namespace: str) -> str:
        with self.modes_lock:
            cached = self.modes.get(namespace)
        if cached is not None and time.monotonic() - cached[0] < self.settings.namespace_ttl.total_seconds():
            return cached[1]
        try:
            labels = kube.namespaces.read(self.api, namespace)["metadata"].get("labels") or {}
        except NotFoundError:
            labels = {}
        mode = str(labels.get(MODE_LABEL, self.settings.default_mode))
        if mode not in MODES:
            log.warning("namespace %s: %s=%r is not one of %s; using %s", namespace, MODE_LABEL, mode,
                        ", ".join(MODES), self.settings.default_mode)  # fmt: skip
            mode = self.settings.default_mode
        with self.modes_lock:
            self.modes[namespace] = (time.monotonic(), mode)
        return mode

    def _handle(self, claim: store.Claim) -> store.State:
        drain = store.Drain.from_doc(claim.doc)
        node, episode = drain.id, drain.episode
        self.store.start_drain(node, self.store.clock())
        pods: dict[str, dict[str, Any]] = {  # uid -> its record (a store.PodRecord), as this claim keeps it
            uid: r.model_dump(mode="python", exclude_none=True) for uid, r in drain.pods.items()
        }
        retry_at: dict[str, float] = {}
        started = drain.started_at or self.store.clock()
        recorded = (drain.scope, frozenset(drain.gpus), drain.scope_reason)
        while not self.stop.is_set():
            self.loop.beat()  # a drain is one claim of many passes: each pass is progress
            if not self.store.holds_episode(node, episode):
                self._finish(node, "released before the drain finished")
                return store.State.DONE
            scope = self._scope(node, episode, started, recorded)
            before = repr(pods)
            left = self._pass(node, pods, retry_at, scope)
            if not left and scope.kind == drain_scope.WAIT:
                scope = drain_scope.Scope(drain_scope.NODE, "nothing on the node to move")
            if (scope.kind, scope.gpus, scope.reason) != recorded:
                recorded = (scope.kind, scope.gpus, scope.reason)
                self.store.record_drain_scope(node, scope.kind, scope.gpus, scope.reason)
                log.info("drain scope", extra={"node": node, "scope": scope.kind, "gpu": sorted(scope.gpus),
                                               "reason": scope.reason, "worker": WORKER})  # fmt: skip
            if repr(pods) != before:  # a write only when a pod's record changed (the store is shared)
                self.store.record_drain_pods(node, pods)
            if not left:
                self._finish(node, store.DRAINED)
                common.post_event(
                    self.api, node, reason="FaultlineDrained", note=_summary(scope, pods),
                    action="Drain", warning=False, worker=WORKER, owner=self.owner,
                )  # fmt: skip
                return store.State.DONE
            self.stop.wait(self.settings.poll.total_seconds())
        return store.State.PENDING  # stopping: another replica (or this one, restarted) continues

    def _scope(self, node: str, episode: dt.datetime | None, started: dt.datetime,
               recorded: tuple[str | None, frozenset[str], str | None]) -> drain_scope.Scope:  # fmt: skip
        """The drain's scope now (`workers.drain_scope`), from the faults behind the node's quarantine
        and the agent's GPU -> pod mapping (read only for a partial drain)."""
        previous, _, reason = recorded
        if previous == drain_scope.NODE or not self.settings.partial_gpu_drain:
            return drain_scope.decide(partial=self.settings.partial_gpu_drain, faults=(), mapping=None,
                                      episode=episode, waited_out=True, previous=previous,
                                      previous_reason=reason)  # fmt: skip
        hold = self.store.hold(node)
        keys = set(hold.faults) if hold is not None else set()
        faults = [
            drain_scope.FaultView(f.code, f.entity.type, f.entity.id, f.action)
            for f in self.store.faults_of([node]).get(node, []) if f.id in keys
        ]  # fmt: skip
        doc = self.store.gpu_pods_of(node)
        mapping = None if doc is None else drain_scope.pod_map(
            doc.episode, ((a.gpu, a.namespace, a.pod) for a in doc.assignments), doc.unmapped
        )  # fmt: skip
        waited_out = self.store.clock() - started >= self.settings.partial_wait
        return drain_scope.decide(
            partial=True, faults=faults, mapping=mapping, episode=episode, waited_out=waited_out,
            previous=previous, previous_reason=reason,
        )  # fmt: skip

    def _finish(self, node: str, result: str) -> None:
        self.store.finish_drain(node, result, self.store.clock())
        self.metrics.actions.labels(result=result.split(maxsplit=1)[0]).inc()

    def _pass(
        self, node: str, pods: dict[str, dict[str, Any]], retry_at: dict[str, float], scope: drain_scope.Scope
    ) -> int:
        """One look at the node: act on each pod of the drain's scope by its namespace's mode (none while
        the scope waits for the agent's mapping), record the others as skipped with the reason; returns
        how many pods of the scope are still there."""
        listed = kube.pods.on_node(self.api, node)
        left = 0
        now = self.store.clock()
        for pod in listed:
            if not evictable(pod, self.settings.gpu_only):
                continue
            meta = pod["metadata"]
            uid, ns, name = meta["uid"], meta["namespace"], meta["name"]
            view = drain_scope.PodView(ns, name, asks_gpus(pod))
            skipped = drain_scope.skip_reason(view, scope, self.system_namespaces)
            if skipped is not None:
                pods.setdefault(uid, {"namespace": ns, "name": name})["skipped"] = skipped
                continue
            left += 1
            if scope.kind == drain_scope.WAIT:
                continue  # which pods are the drain's is not known yet
            record = pods.setdefault(uid, {"namespace": ns, "name": name})
            record.pop("skipped", None)
            if not record.get("mode"):
                record["mode"] = self._mode(ns)
            mode = record["mode"]
            if mode == "AllowCompletion":
                continue
            if meta.get("deletionTimestamp") and mode == "Immediate":
                continue  # on its way out
            if mode == "DeleteAfterTimeout" and record.get("evicted_at") is not None:
                first: dt.datetime = record["evicted_at"]
                if now - first >= self.settings.delete_after and not record.get("deleted_at"):
                    self.limiter.take()
                    with contextlib.suppress(NotFoundError):
                        kube.pods.delete(self.api, ns, name)
                    record["deleted_at"] = now
                    self.metrics.actions.labels(result="deleted").inc()
                    continue
            if meta.get("deletionTimestamp") or time.monotonic() < retry_at.get(uid, 0.0):
                continue
            self._evict(ns, name, uid, record, retry_at, now)
        return left

    def _evict(self, ns: str, name: str, uid: str, record: dict[str, Any], retry_at: dict[str, float],
               now: dt.datetime) -> None:  # fmt: skip
        self.limiter.take()
        record.setdefault("evicted_at", now)
        try:
            kube.pods.evict(self.api, ns, name)
        except NotFoundError:
            return  # gone already
        except ThrottledError:  # a PodDisruptionBudget says not now: back off, never delete around it
            tries = int(record.get("refused", 0)) + 1
            record["refused"] = tries
            retry_at[uid] = time.monotonic() + min(self.settings.backoff_max.total_seconds(), 0.5 * 2**tries)
            self.metrics.actions.labels(result="eviction-refused").inc()
            return
        record["evicted"] = True
        self.metrics.actions.labels(result="evicted").inc()


def _summary(scope: drain_scope.Scope, pods: dict[str, dict[str, Any]]) -> str:
    """The Drained Event's note: what moved, what was left and why."""
    moved = sum(1 for r in pods.values() if not r.get("skipped"))
    left = sum(1 for r in pods.values() if r.get("skipped"))
    what = f"GPU {', '.join(sorted(scope.gpus))}" if scope.kind == drain_scope.GPUS else "node"
    note = f"drained ({what}): {moved} pods moved"
    return f"{note}, {left} left (system namespaces, other GPUs)" if left else note
