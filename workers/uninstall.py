"""`faultline uninstall`: take back from the cluster what faultline's components put there, when the release
is removed (the chart runs it as a post-delete hook Job, `cleanup.enabled`).

While they run, the components keep node marks alive on purpose: the agent's node conditions
(`GpuHealthy`, ...), quarantine's cordon, taints, labels and annotations, the remediation worker's
RemediationRequests and the janitor's repair Jobs. None of them removes its marks when it stops, since a
pod restart or an upgrade must not flap a node. So the chart removes them once, after every component is
gone:

1. wait until no pod of the release's components remains (a stopping agent could write its conditions
   again after they were removed);
2. on every Node: release exactly what faultline's ownership annotation (`faultline.io/quarantine`) says
   it added (the cordon only if faultline cordoned, its taints and labels, never anyone else's; a node an
   operator cordoned stays cordoned) and the janitor's cordon for a person's request
   (`faultline.io/cordoned-for`), drop its annotations and delete the condition types the agent owns;
3. delete the RemediationRequests the remediation worker made (label `faultline.io/node`; a request a
   person created is theirs and stays) and the repair Jobs in the release's namespace (label
   `faultline.io/repair`; the janitor's `namespace` when it was another) with their pods.

The store is left as it is: it is data (faults, repairs, history), kept like the embedded store's volume.
Every step is idempotent, so the Job can be retried or run by hand (`faultline uninstall --namespace NS
--instance RELEASE`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faultline import evidence, kube
from faultline.conditions import OWNED_TYPES
from faultline.errors import ConflictError, NotFoundError, TransientError
from workers import gpu_clients, overrides, quarantine, rules, user_requests

log = logging.getLogger(__name__)

COMPONENTS = ("agent", "quarantine", "drain", "remediation", "janitor")
REQUEST_LABEL = "faultline.io/node"  # set on every RemediationRequest the remediation worker creates
JOB_LABEL = "faultline.io/repair"  # set on every repair Job the janitor creates
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


@dataclass
class Report:
    nodes_released: list[str] = field(default_factory=list)
    conditions_removed: dict[str, list[str]] = field(default_factory=dict)
    requests_deleted: list[str] = field(default_factory=list)
    jobs_deleted: list[str] = field(default_factory=list)


def wait_for_components(
    api: kube.ApiClient, namespace: str, instance: str, timeout: float, *,
    sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
) -> None:  # fmt: skip
    """Until no pod of the release's components is left in `namespace`; TransientError at `timeout`."""
    selector = (
        f"app.kubernetes.io/instance={instance},app.kubernetes.io/component in ({','.join(COMPONENTS)})"
    )
    deadline = clock() + timeout
    while True:
        left = kube.pods.list_all(api, namespace=namespace, label_selector=selector)
        if not left:
            return
        if clock() >= deadline:
            names = ", ".join(sorted(p["metadata"]["name"] for p in left))
            raise TransientError(f"pods of release {instance} still running after {timeout:.0f}s: {names}")
        log.info("waiting for the release's pods to stop", extra={"item": len(left)})
        sleep(1.0)


def release_node(api: kube.ApiClient, node: dict[str, Any]) -> bool:
    """Remove faultline's quarantine marks from one Node (what its ownership annotation records, and the
    annotations); True when something was changed."""
    meta, spec = node["metadata"], node["spec"]
    annotations = meta.get("annotations") or {}
    owned = quarantine.owned_record(annotations.get(quarantine.OWNED_ANNOTATION), meta["name"])
    state = rules.NodeState(
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple((t["key"], t.get("value", ""), t["effect"]) for t in spec.get("taints") or []),
        labels=meta.get("labels") or {},
        owned=owned,
        annotations=annotations,
    )
    p = rules.plan(state, rules.Desired())
    marks = (quarantine.OWNED_ANNOTATION, rules.FAULTS_ANNOTATION, overrides.CANCELLED_ANNOTATION,
             user_requests.CORDONED_FOR, evidence.KEY_ANNOTATION)  # fmt: skip
    ours = [k for k in marks if k in annotations]
    # a GPU reset cut short: its GPU clients (the GPU Operator's operands, the agent) come back
    resumed = gpu_clients.resume(meta.get("labels") or {})
    if not p.changed and not ours and not resumed:
        return False
    # the janitor's cordon for a person's RemediationRequest (it cordoned only a node that was not)
    unschedulable = p.unschedulable and user_requests.CORDONED_FOR not in annotations
    # the node lifecycle controller's mirror of a cordon goes with it (it would remove it a moment later)
    taints = [t for t in p.taints if unschedulable or t[0] != UNSCHEDULABLE_TAINT]
    body = {
        "metadata": {
            "labels": {**dict.fromkeys(p.remove_labels), **resumed},
            "annotations": dict.fromkeys([*ours, *p.remove_annotations]),
        },
        "spec": {
            "unschedulable": unschedulable or None,
            "taints": [_taint(k, v, e) for k, v, e in taints] or None,
        },
    }
    kube.nodes.patch(api, meta["name"], body, resource_version=meta["resourceVersion"])
    return True


def _taint(key: str, value: str, effect: str) -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}


def run(
    api: kube.ApiClient, *, namespace: str, instance: str, wait: float, repair_namespace: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Report:  # fmt: skip
    """The whole clean-up (module docstring); safe to run again."""
    report = Report()
    wait_for_components(api, namespace, instance, wait, sleep=sleep)
    for listed in kube.nodes.list_all(api):
        name, current = listed["metadata"]["name"], listed
        for _ in range(5):  # a concurrent change of the Node: read it again
            try:
                if release_node(api, current):
                    report.nodes_released.append(name)
                break
            except ConflictError:
                current = kube.nodes.read(api, name)
            except NotFoundError:
                break
        owned = sorted(t for t in kube.nodes.conditions(api, name) if t in OWNED_TYPES)
        if owned:
            kube.nodes.write_conditions(api, name, [], owned)
            report.conditions_removed[name] = owned
    for request in kube.resources.list_requests(api, label_selector=REQUEST_LABEL):
        report.requests_deleted.append(request["metadata"]["name"])
    if report.requests_deleted:
        kube.resources.delete_requests(api, label_selector=REQUEST_LABEL)
    jobs = repair_namespace or namespace
    for job in kube.jobs.list_all(api, jobs, label_selector=JOB_LABEL):
        name = job["metadata"]["name"]
        try:
            kube.jobs.delete(api, jobs, name)
        except NotFoundError:
            continue
        report.jobs_deleted.append(name)
    for name in report.nodes_released:
        log.info("node released at uninstall", extra={"node": name})
    return report
