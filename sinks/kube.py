"""Bytewax sink keeping a node's conditions in line with its faults and posting Events on changes.

Speaks to the API server through `faultline.kube.lite` (the agent's footprint). The conditions faultline
owns are cached from the last Node read or patch answer, so a batch that changes nothing costs no call;
the cache is re-read from the API server every `RESYNC_S` and after any failed call, so a condition
someone else edited is put back.

The calls run on the sink's own thread, so a slow or absent API server never holds up detection or the
MongoDB sink. Updates wait in a backlog while the API server cannot be reached, throttles, fails or
refuses (RBAC, a missing Node: logged, retried too), with back-off from RETRY_MIN_S to RETRY_MAX_S; only
the latest conditions per node matter, so the backlog applies the last update of each node plus the
Events of every change. The detector re-sends the node's whole state every RESEND_S and after a restart
(`dataflows.node.DetectLogic`), so conditions catch up even on a node that stays quiet.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from pathlib import Path

from bytewax.outputs import DynamicSink, StatelessSinkPartition

from faultline import conditions
from faultline.errors import ApiError
from faultline.kube import bodies, lite
from faultline.models import Fault, NodeUpdate

CONTROLLER = "faultline.io/agent"
RESYNC_S = 60.0
RETRY_MIN_S, RETRY_MAX_S = 1.0, 30.0
BACKLOG_MAX = 1000  # updates; past it the oldest go (their Events; newer updates carry the conditions)
log = logging.getLogger(__name__)


class _Partition(StatelessSinkPartition[NodeUpdate]):
    def __init__(
        self, kubeconfig: Path | None, gpu_names: dict[str, str], types: list[str], *,
        background: bool = True, annotations: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.client = lite.Client.connect(kubeconfig)
        self.gpu_names = gpu_names
        self.types = types
        self.annotations = dict(annotations or {})  # kept on the node (the agent's published key)
        self.limiter = conditions.EventLimiter()
        self.current: dict[str, dict[str, dict[str, str]]] = {}  # node -> its conditions as last seen
        self.read_at: dict[str, float] = {}
        self.backlog: list[tuple[NodeUpdate, int]] = []  # (update, how many of its Events were posted)
        self.failures = 0
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.closed = False
        self.thread: threading.Thread | None = None
        if background:
            self.thread = threading.Thread(target=self._run, name="kube-sink", daemon=True)
            self.thread.start()

    def _apply(self, node: str, wanted: dict[str, conditions.Condition]) -> None:
        current = self.current.get(node)
        if current is None or time.monotonic() - self.read_at.get(node, 0.0) > RESYNC_S:
            obj = lite.read_node_status(self.client, node)
            have = (obj.get("metadata") or {}).get("annotations") or {}
            if any(have.get(k) != v for k, v in self.annotations.items()):
                lite.annotate_node(self.client, node, self.annotations)
            current = bodies.node_conditions(obj)
            self.current[node], self.read_at[node] = current, time.monotonic()
        patches, stale = conditions.changes(current, wanted, dt.datetime.now(dt.UTC))
        try:
            patched = lite.patch_node_conditions(self.client, node, patches, stale)
        except Exception:
            self.current.pop(node, None)  # unknown now: read again next time
            raise
        if patched is not None:
            self.current[node] = bodies.node_conditions(patched)

    def write_batch(self, items: list[NodeUpdate]) -> None:
        """Queue the updates for the sink's thread: API calls never hold up the dataflow."""
        with self.lock:
            self.backlog = [*self.backlog, *((update, 0) for update in items)][-BACKLOG_MAX:]
        self.wake.set()

    def _run(self) -> None:
        delay = RETRY_MIN_S
        while not self.closed:
            self.wake.wait(None if not self.backlog else delay)
            self.wake.clear()
            if self.closed:
                return
            delay = RETRY_MIN_S if self.drain() else min(RETRY_MAX_S, delay * 2)

    def drain(self) -> bool:
        """Apply what waits; False when the API server failed us (the rest waits for the next try)."""
        with self.lock:
            pending, self.backlog = self.backlog, []
        for position, (update, posted) in enumerate(pending):
            later = any(u.node == update.node for u, _ in pending[position + 1 :])
            done = posted
            try:
                if not later:  # a later update of the same node supersedes these conditions
                    self._apply(update.node, conditions.desired(update.faults, self.gpu_names, self.types))
                for fault, _revision in update.changed[posted:]:
                    self._post(update.node, fault)
                    done += 1
            except ApiError as exc:  # unreachable, throttled, failed, refused: all wait
                with self.lock:
                    self.backlog = [(update, done), *pending[position + 1 :], *self.backlog][-BACKLOG_MAX:]
                self.failures += 1
                if self.failures in (1, 10) or self.failures % 100 == 0:
                    log.warning("Kubernetes API call failed (%d tries), %d updates wait: %s",
                                self.failures, len(self.backlog), exc)  # fmt: skip
                return False
        self.failures = 0
        return True

    def _post(self, node: str, fault: Fault) -> None:
        resolved = fault.resolved_at is not None
        reason = f"{fault.code}Resolved" if resolved else fault.code
        if not self.limiter.would_allow(node, reason, time.monotonic()):
            return
        lite.post_node_event(
            self.client, node, reason=reason,
            note=f"{fault.code} on {fault.entity.type} {fault.entity.id}: {fault.description}"
            + ("" if not resolved else " (resolved)"),
            action="Resolved" if resolved else "Detected", warning=fault.fatal and not resolved,
            controller=CONTROLLER, instance=f"agent-{node}",
        )  # fmt: skip
        self.limiter.allow(node, reason, time.monotonic())  # counted once it was posted

    def close(self) -> None:
        self.closed = True
        self.wake.set()
        if self.thread is not None:
            self.thread.join(5.0)
        self.client.close()


class KubeSink(DynamicSink[NodeUpdate]):
    """`annotations`: kept on the node, set again whenever a read finds them changed (the agent's
    `faultline.io/agent-key`, which the workers verify its faults with)."""

    def __init__(
        self, kubeconfig: Path | None, gpu_names: dict[str, str], types: list[str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.kubeconfig = kubeconfig
        self.gpu_names = gpu_names
        self.types = types or sorted(conditions.OWNED_TYPES)
        self.annotations = annotations

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        return _Partition(self.kubeconfig, self.gpu_names, self.types, annotations=self.annotations)
