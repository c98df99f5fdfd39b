"""Bytewax sink keeping a node's conditions in line with its faults and posting Events on changes.

Speaks to the API server through `faultline.kubelite` (the agent's footprint). The conditions faultline
owns are cached from the last Node read or patch answer, so a batch that changes nothing costs no call;
the cache is re-read from the API server every `RESYNC_S` and after any failed call, so a condition
someone else edited is put back.

While the API server cannot be reached (or throttles or fails), updates wait in a backlog and are applied
with the next batch; only the latest conditions per node matter, so the backlog keeps the last update of
each node plus the Events of every change. An API error that retrying cannot fix (RBAC, a missing Node)
stops the agent with that error.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

from bytewax.outputs import DynamicSink, StatelessSinkPartition

from faultline import conditions, kubelite
from faultline.models import Fault

CONTROLLER = "faultline.io/agent"
RESYNC_S = 60.0
BACKLOG_MAX = 1000  # updates; past it the oldest go (their Events; newer updates carry the conditions)
log = logging.getLogger("faultline.agent.kube")


class _Partition(StatelessSinkPartition[Any]):
    def __init__(self, kubeconfig: Path | None, gpu_names: dict[str, str], types: list[str]) -> None:
        self.client = kubelite.Client.connect(kubeconfig)
        self.gpu_names = gpu_names
        self.types = types
        self.limiter = conditions.EventLimiter()
        self.current: dict[str, dict[str, str]] | None = None
        self.read_at = 0.0
        self.backlog: list[tuple[Any, int]] = []  # (update, how many of its Events were posted)
        self.failures = 0

    def _apply(self, node: str, wanted: dict[str, conditions.Condition]) -> None:
        if self.current is None or time.monotonic() - self.read_at > RESYNC_S:
            self.current = kubelite.node_conditions(kubelite.read_node_status(self.client, node))
            self.read_at = time.monotonic()
        changed, stale = conditions.diff(self.current, wanted)
        now = dt.datetime.now(dt.UTC)
        patches = [c.as_patch(now, self.current.get(c.type, {}).get("status") != c.status) for c in changed]
        try:
            patched = kubelite.patch_node_conditions(self.client, node, patches, stale)
        except Exception:
            self.current = None  # unknown now: read again next time
            raise
        if patched is not None:
            self.current = kubelite.node_conditions(patched)

    def write_batch(self, items: list[Any]) -> None:
        pending = [*self.backlog, *((update, 0) for update in items)]
        self.backlog = []
        for position, (update, posted) in enumerate(pending):
            later = any(u.node == update.node for u, _ in pending[position + 1 :])
            done = posted
            try:
                if not later:  # a later update of the same node supersedes these conditions
                    self._apply(update.node, conditions.desired(update.faults, self.gpu_names, self.types))
                for fault, _revision in update.changed[posted:]:
                    self._post(update.node, fault)
                    done += 1
            except kubelite.ApiUnavailableError as exc:
                self.backlog = [(update, done), *pending[position + 1 :]][-BACKLOG_MAX:]
                self.failures += 1
                if self.failures in (1, 10) or self.failures % 100 == 0:
                    log.warning("Kubernetes API unavailable (%d tries), %d updates wait: %s",
                                self.failures, len(self.backlog), exc)  # fmt: skip
                return
        self.failures = 0

    def _post(self, node: str, fault: Fault) -> None:
        resolved = fault.resolved_at is not None
        reason = f"{fault.code}Resolved" if resolved else fault.code
        if not self.limiter.would_allow(node, reason, time.monotonic()):
            return
        kubelite.post_node_event(
            self.client, node, reason=reason,
            note=f"{fault.code} on {fault.entity.type} {fault.entity.id}: {fault.description}"
            + ("" if not resolved else " (resolved)"),
            action="Resolved" if resolved else "Detected", warning=fault.fatal and not resolved,
            controller=CONTROLLER, instance=f"agent-{node}",
        )  # fmt: skip
        self.limiter.allow(node, reason, time.monotonic())  # counted once it was posted

    def close(self) -> None:
        self.client.close()


class KubeSink(DynamicSink[Any]):
    def __init__(
        self, kubeconfig: Path | None, gpu_names: dict[str, str], types: list[str] | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.gpu_names = gpu_names
        self.types = types or sorted(conditions.OWNED_TYPES)

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        return _Partition(self.kubeconfig, self.gpu_names, self.types)
