"""Bytewax sink keeping a node's conditions in line with its faults and posting Events on changes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bytewax.outputs import DynamicSink, StatelessSinkPartition

from faultline import conditions, kube

CONTROLLER = "faultline.io/agent"


class _Partition(StatelessSinkPartition[Any]):
    def __init__(self, kubeconfig: Path | None, gpu_names: dict[str, str], types: list[str]) -> None:
        self.api = kube.api_client(kubeconfig)
        self.gpu_names = gpu_names
        self.types = types
        self.limiter = conditions.EventLimiter()

    def write_batch(self, items: list[Any]) -> None:
        for update in items:
            wanted = conditions.desired(update.faults, self.gpu_names, self.types)
            kube.apply_node_conditions(self.api, update.node, wanted)
            for fault, _revision in update.changed:
                resolved = fault.resolved_at is not None
                reason = f"{fault.code}Resolved" if resolved else fault.code
                if self.limiter.allow(update.node, reason, time.monotonic()):
                    kube.post_node_event(
                        self.api, update.node, reason=reason,
                        note=f"{fault.code} on {fault.entity.type} {fault.entity.id}: {fault.description}"
                        + ("" if not resolved else " (resolved)"),
                        action="Resolved" if resolved else "Detected", warning=fault.fatal and not resolved,
                        controller=CONTROLLER, instance=f"agent-{update.node}",
                    )  # fmt: skip

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]


class KubeSink(DynamicSink[Any]):
    def __init__(
        self, kubeconfig: Path | None, gpu_names: dict[str, str], types: list[str] | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.gpu_names = gpu_names
        self.types = types or sorted(conditions.OWNED_TYPES)

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        return _Partition(self.kubeconfig, self.gpu_names, self.types)
