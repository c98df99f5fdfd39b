"""Failed preflights' findings into faults (part of the object monitor, `preflight_findings`).

The preflight init container reports nothing itself: it needs no socket, no host path and no store
credential, so it can run as a non-root user in a namespace whose Pod Security level is `restricted`
(except for what the `xid` check reads). A failed preflight ends with its findings on its termination
message's last line (`faultline.preflight.termination`), which the kubelet copies into the pod's status.
This reader lists the pods the webhook injected (label `faultline.io/preflight-injected`, a hint only) and
takes the findings of a `faultline-preflight` init container only when

- it terminated with exit code 1 (a tenant's process cannot make the checks fail on healthy GPUs), and
- the kubelet ran it from one of the trusted image digests (`status.initContainerStatuses[].imageID`,
  written by the kubelet, not the pod's owner): faultline's own image, the one this monitor runs unless
  `preflight_digests` names others; a pod that swapped the image, or brought its own container under the
  name, is ignored and counted.

Each finding becomes a fault of the pod's node (`metadata.source` `preflight`, signed as the object
monitor, so the quarantine worker acts on it like on an agent's), written once per container run
(`metadata.run`: the container's id), never again after it resolved. A finding is one observation, not a
state that lasts: the janitor resolves the round's preflight faults once its reset or reboot verifiably
happened, and the next pod's preflight looks again.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from faultline import bounds, kube, store
from faultline.errors import FaultlineError
from faultline.models import Action, Component, Entity, Fault, FaultState, HealthEvent, event_id, fault_id
from faultline.preflight import (
    CONTAINER,
    ENABLED,
    INJECTED_LABEL,
    NAMESPACE_LABEL,
    container_problem,
    read_findings,
)

log = logging.getLogger(__name__)
SOURCE = "preflight"  # Fault.metadata["source"]
AGENT = "faultline-object-monitor"
POLL_S = 10.0  # between two lists of the injected pods
# what a preflight finding may ask for (its checks never ask for a replacement)
TRUSTED_ACTIONS = frozenset(
    {Action.COMPONENT_RESET, Action.RESTART_VM, Action.RESTART_BM, Action.CONTACT_SUPPORT}
)


def digest_of(image_id: str) -> str:
    """The sha256 digest an imageID names ("" when it names none): `repo@sha256:...`,
    `docker-pullable://repo@sha256:...`, or a bare `sha256:...`."""
    tail = image_id.rsplit("@", 1)[-1]
    tail = tail.rsplit("://", 1)[-1]
    return tail if tail.startswith("sha256:") and len(tail) == 71 else ""


def runs(pod: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The failed runs of the pod's preflight container: (container id, image digest, finished at,
    message), from its current and its last state."""
    out = []
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") != CONTAINER:
            continue
        digest = digest_of(str(status.get("imageID") or ""))
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            done = state.get("terminated") or {}
            if done.get("exitCode") == 1 and done.get("containerID"):
                out.append((str(done["containerID"]), digest, str(done.get("finishedAt") or ""),
                            str(done.get("message") or "")))  # fmt: skip
    return out


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter("faultline_preflight_findings_runs", "Failed preflight runs read, by outcome",
                            ["outcome"], registry=registry)  # fmt: skip


class FindingsReader:
    """Lists the injected pods every `poll` seconds and writes the findings of new failed runs."""

    def __init__(
        self, st: store.Store, api: kube.ApiClient, digests: frozenset[str], registry: CollectorRegistry, *,
        poll: float = POLL_S, beat: Callable[[], None] = lambda: None,
    ) -> None:  # fmt: skip
        self.store = st
        self.api = api
        self.digests = digests
        self.poll = poll
        self.beat = beat
        self.metrics = Metrics(registry)
        self.seen: set[str] = set()  # container runs already written (or found written) by this process
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        self.thread = threading.Thread(target=self._run, name="preflight-findings", daemon=False)
        self.thread.start()
        return self.thread

    def halt(self, timeout: float = 10.0) -> bool:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.pass_once()
            except FaultlineError as exc:
                log.warning(
                    "preflight findings: a pass failed",
                    extra={"error": bounds.clip(str(exc), bounds.ERROR_TEXT)},
                )
            self.beat()
            self.stop.wait(self.poll)

    def pass_once(self) -> int:
        """One look at the injected pods of the namespaces with preflight on; how many faults were written."""
        written = 0
        enabled = {
            n["metadata"]["name"]
            for n in kube.namespaces.list_all(self.api, label_selector=f"{NAMESPACE_LABEL}={ENABLED}")
        }
        for pod in kube.pods.list_all(
            self.api, label_selector=f"{INJECTED_LABEL}=true", what="injected pods"
        ):
            if (pod.get("metadata") or {}).get("namespace") not in enabled:
                continue  # the webhook never saw it: whatever it runs, it is not faultline's preflight
            for run, digest, finished, message in runs(pod):
                if run in self.seen:
                    continue
                written += self._take(pod, run, digest, finished, message)
        return written

    def _take(self, pod: dict[str, Any], run: str, digest: str, finished: str, message: str) -> int:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        node = str(spec.get("nodeName") or "")
        if digest not in self.digests:
            self.seen.add(run)
            self.metrics.runs.labels(outcome="untrusted-image").inc()
            image = digest or "no image digest"
            log.warning("preflight findings ignored: not faultline's image",
                        extra={"item": where, "node": node, "reason": image})  # fmt: skip
            return 0
        inits: list[dict[str, Any]] = spec.get("initContainers") or []
        spec_of: dict[str, Any] = next((c for c in inits if c.get("name") == CONTAINER), {})
        if (why := container_problem(spec_of)) is not None:
            self.seen.add(run)
            self.metrics.runs.labels(outcome="not-injected").inc()
            log.warning("preflight findings ignored: not the webhook's container",
                        extra={"item": where, "node": node, "reason": why})  # fmt: skip
            return 0
        try:
            findings = read_findings(message)
            if any(f.action not in TRUSTED_ACTIONS for f in findings):
                raise ValueError("a finding asks for an action preflight never asks for")
        except ValueError as exc:
            self.seen.add(run)
            self.metrics.runs.labels(outcome="unreadable").inc()
            log.warning(
                "preflight findings unreadable", extra={"item": where, "node": node, "reason": str(exc)}
            )
            return 0
        if not node or not findings:
            self.seen.add(run)
            self.metrics.runs.labels(outcome="nothing").inc()
            return 0
        if self.store.preflight_run_written(run):
            self.seen.add(run)
            return 0
        at = _time(finished) or self.store.now()
        count = 0
        for f in findings:
            entity = Entity(type="GPU", id=f.gpu) if f.gpu else Entity(type="NODE", id="")
            fault = Fault(
                id=fault_id(node, entity.type, entity.id, f.code), node=node, entity=entity, code=f.code,
                component=Component.GPU if f.gpu else Component.NODE, count=1, first_seen=at, last_seen=at,
                fatal=f.action not in (Action.NONE, Action.RESTART_APP), action=f.action,
                state=FaultState.OPEN,
                description=f"preflight {f.check or 'check'} failed in pod {where}",
                metadata={"source": SOURCE, "run": bounds.clip(run, bounds.STORED_TEXT), "pod": where},
            )  # fmt: skip
            event = HealthEvent(
                id=event_id(node, SOURCE, entity.type, entity.id, f.code, at), node=node, agent=AGENT,
                component=fault.component, check="preflight", code=f.code, entities=(entity,), healthy=False,
                fatal=fault.fatal, action=f.action, message=fault.description, metadata=dict(fault.metadata),
                generated_at=at, observed_at=at,
            )  # fmt: skip
            self.store.record_events([event])
            self.store.write_fault(fault, _revision(self.store.now()))
            count += 1
        self.seen.add(run)
        self.metrics.runs.labels(outcome="written").inc()
        log.warning("preflight findings written as faults",
                    extra={"item": where, "node": node, "code": [f.code for f in findings]})  # fmt: skip
        return count


def _time(text: str) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _revision(now: dt.datetime) -> int:
    return int(now.timestamp() * 1_000_000)
