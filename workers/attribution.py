"""Which stored faults a worker may act on: those whose writer `faultline.evidence` proves.

The quarantine and remediation workers hold an `Attribution` when `require_evidence` is on (the chart's
default). A fault document that is not signed by its own node's agent or a cluster component is
*refused*: never a reason to cordon, drain or repair, counted in
`faultline_<worker>_evidence_refused_total{why}`, logged once per revision; and while a node is held,
such a document (whatever it says) keeps it held, so a forged resolution cannot release it either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from prometheus_client import Counter

from faultline import evidence, kube, store
from faultline.errors import NotFoundError
from workers import common

log = logging.getLogger(__name__)
LOGGED_MAX = 10_000  # (fault, revision) pairs remembered as logged; then forgotten at once


def why_label(verdict: evidence.Verdict) -> str:
    """A bounded label for the metric."""
    reason = verdict.reason
    if reason == "not signed":
        return "unsigned"
    if reason.startswith("written for node"):
        return "other-node"
    if verdict.retry or "agent key" in reason:
        return "no-node-key"
    if reason.startswith("an unknown signer"):
        return "unknown-signer"
    return "bad-signature"


def node_key_reader(api: kube.ApiClient) -> Callable[[str], str | None]:
    """Reads a Node's published agent key (None: no such Node, or none published)."""

    def read(node: str) -> str | None:
        try:
            obj = kube.nodes.read(api, node)
        except NotFoundError:
            return evidence.NO_NODE  # refused, not waited for: no agent will ever publish a key there
        return ((obj.get("metadata") or {}).get("annotations") or {}).get(evidence.KEY_ANNOTATION)

    return read


class Attribution:
    def __init__(self, verifier: evidence.Verifier, metrics: common.WorkerMetrics) -> None:
        self.verifier = verifier
        self.worker = metrics.worker
        what = "Fault documents refused: their writer is not proven"
        self.refused = Counter(
            f"faultline_{metrics.worker}_evidence_refused", what, ["why"], registry=metrics.registry
        )
        self._logged: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def learn(self, node: str, annotations: dict[str, str]) -> None:
        """The node's annotations as just read (its agent key, without another read)."""
        self.verifier.learn(node, annotations.get(evidence.KEY_ANNOTATION))

    def check(self, doc: store.FaultRecord) -> evidence.Verdict:
        """Whether the worker may act on `doc`; a refusal is counted and logged (once per revision)."""
        verdict = self.verifier.verify(doc.id, doc.model_dump(by_alias=False))
        if verdict.ok:
            return verdict
        self.refused.labels(why=why_label(verdict)).inc()
        with self._lock:
            first = (doc.id, doc.revision) not in self._logged
            if first:
                if len(self._logged) >= LOGGED_MAX:
                    self._logged.clear()
                self._logged.add((doc.id, doc.revision))
        if first:
            log.warning("fault refused: its writer is not proven",
                        extra={"node": doc.node, "fault_key": doc.id, "code": doc.code, "by": verdict.signer,
                               "reason": verdict.reason, "worker": self.worker})  # fmt: skip
        return verdict

    def split(
        self, docs: Iterable[store.FaultRecord]
    ) -> tuple[list[store.FaultRecord], list[tuple[store.FaultRecord, evidence.Verdict]]]:
        """The documents that may be acted on, and those refused with why."""
        ok: list[store.FaultRecord] = []
        refused: list[tuple[store.FaultRecord, evidence.Verdict]] = []
        for doc in docs:
            verdict = self.check(doc)
            if verdict.ok:
                ok.append(doc)
            else:
                refused.append((doc, verdict))
        return ok, refused
