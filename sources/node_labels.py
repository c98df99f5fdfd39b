"""Every node's labels, for the cluster analyzer's `label:` keys and label matches: read from the
Kubernetes API at start and every `refresh` seconds in a thread, so the dataflow never waits on it. An
API that cannot be read keeps the labels read last (logged); a node not known yet has none. The job
holding a node's GPUs (`sources.pod_jobs`) comes with them, read from the pods."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from faultline.errors import FaultlineError
from sources import pod_jobs

log = logging.getLogger(__name__)
NONE: Mapping[str, str] = {}


class NodeLabels:
    """`read()` returns {node: labels}; `get(node)` answers from the last successful read."""

    def __init__(self, read: Callable[[], dict[str, dict[str, str]]], refresh: float) -> None:
        self.read = read
        self.refresh = refresh
        self.labels: dict[str, dict[str, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> NodeLabels:
        self._update()
        self._thread = threading.Thread(target=self._loop, name="node-labels", daemon=True)
        self._thread.start()
        return self

    def _update(self) -> None:
        try:
            self.labels = self.read()  # one assignment: readers see the old map or the new one
        except FaultlineError as exc:
            log.warning("node labels not read: keeping the last", extra={"reason": str(exc)})

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh):
            self._update()

    def get(self, node: str) -> Mapping[str, str]:
        return self.labels.get(node, NONE)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def from_api(kubeconfig: str | None, *, jobs: bool = True) -> Callable[[], dict[str, dict[str, str]]]:
    """Every node's labels through the Kubernetes API (nodes list); with `jobs`, plus the job holding
    the node's GPUs under `pod_jobs.JOB_KEY` (pods list, `sources.pod_jobs`). Pods that cannot be read
    (no RBAC to list them) leave the jobs out, logged once, and the labels are still read."""
    from faultline import kube  # noqa: PLC0415 - the Kubernetes client only where labels are read

    api = kube.api_client(kubeconfig)
    warned: list[str] = []

    def read() -> dict[str, dict[str, str]]:
        nodes = kube.nodes.list_all(api)
        out = {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {}) for n in nodes}
        if not jobs:
            return out
        try:
            pods = kube.pods.list_all(
                api, field_selector="status.phase!=Succeeded,status.phase!=Failed", what="pods holding GPUs"
            )
        except FaultlineError as exc:
            if str(exc) not in warned:
                warned[:] = [str(exc)]
                log.warning("pods not read: events get no job from them", extra={"reason": str(exc)})
            return out
        warned.clear()
        for node, job in pod_jobs.node_jobs(pods).items():
            if node in out:
                out[node][pod_jobs.JOB_KEY] = job
        return out

    return read
