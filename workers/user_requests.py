"""RemediationRequests that people create (`kubectl create` of a `remediationrequests.faultline.io`):
which requests are theirs, whether one can be carried out (`check`, pure), and the janitor's adoption
pass (`Adopter.run`, run with its maintenance pass) that records each acceptable request in the store
as a repair of its own. The janitor then carries it out like a repair remediation asked for: the
same Job or provider call, the same wait for the node and the same validation; a round that fails goes
to remediation, which escalates along the ladder as configured.

Whose request: the remediation worker labels every request it creates `faultline.io/node`; a request
without that label was created by a person (or their tooling). Who asked is the annotation
`faultline.io/requested-by` when set, else the field manager that created the object (`kubectl-create`
for `kubectl create`): the API server records no user on the object.

Status (`status.phase`, `status.message`):
- `Refused` (final) when the action is not one this janitor carries out for people (`user_actions`;
  CONTACT_SUPPORT is for people; REPLACE needs a cloud provider); the node does not exist; GPUs are
  listed for an action on the whole node, or are missing or invalid for GPU_RESET (each an index below
  the node's `nvidia.com/gpu` capacity, a PCI bus id or a GPU UUID, named once); a fault key is not an
  open fault of the node; a repair of the node is running (faultline's own, or another request); or
  the repair caps say the node gets no repair below the ladder's last step (`remedies.capped`).
- `Pending` once adopted, then the janitor's `Running`, `Validating` and `Succeeded`, `Failed` or
  `TimedOut`. What is validated: the faults the request names (`faultKeys`), else the node's open
  fatal faults (for a GPU reset, those of the GPUs named by bus id); a node with none is validated by
  the step itself (the Job succeeded, the node came back with a new boot id).
- Deleted before the janitor starts the repair: the repair is cancelled (its round's outcome
  `Cancelled`, counted by no cap) and nothing runs. Deleted after: the repair completes; its status
  is written nowhere (a request of the same name created since is another request, told by its uid).

Cordon (`user_cordon`, on by default): the janitor cordons the node before it acts, recording the
request in the Node annotation `faultline.io/cordoned-for`, and uncordons it when the round ends, only
if that annotation still names the request (a node cordoned already, by quarantine, an operator or
`kubectl drain`, is left as it was). It does not drain: eviction belongs to the drainer, which drains
the nodes quarantine holds, by each namespace's mode; a person who wants workloads moved gracefully
runs `kubectl drain` first, and a GPU reset refuses to run while GPU processes remain.

Level-triggered, restartable at any line: the pass writes `Pending` before it inserts the repair, so a
request `Pending` without a repair is checked again, and one with a repair is left alone. The repair's
id is the node's next turn (`<node>/request-<n>`, the request's uid inside), and its insert is the
fence: of two janitor replicas adopting one request, or two requests of one node, at once, one wins
and the other reads again at its next pass (where it finds the repair running).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from faultline import bounds, kube, store
from faultline.errors import ConflictError, FaultlineError, InvalidError, NotFoundError, TransientError
from faultline.models import PROVIDER_REPAIR, FaultState, RepairStep
from workers import remedies

log = logging.getLogger(__name__)
MADE_BY_FAULTLINE = "faultline.io/node"  # the label remediation puts on the requests it creates
USERS = f"!{MADE_BY_FAULTLINE}"  # label selector: the requests people created
REQUESTED_BY = "faultline.io/requested-by"
CORDONED_FOR = "faultline.io/cordoned-for"
ADOPT, REFUSE, WAIT = "adopt", "refuse", "wait"
NODE_STEPS = (remedies.REBOOT, remedies.REPLACE)  # act on the whole node: no GPUs to name
STEPS = (remedies.GPU_RESET, *NODE_STEPS)
_INDEX = re.compile(r"\d{1,3}")
_PCI = re.compile(r"(?P<domain>[0-9a-f]{4,8}):(?P<bus>[0-9a-f]{2}):(?P<device>[0-9a-f]{2})(?:\.[0-7])?")
_UUID = re.compile(r"gpu-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class Request:
    """A RemediationRequest as the janitor reads it."""

    name: str
    uid: str
    by: str
    node: str
    action: str
    gpus: tuple[str, ...]
    fault_keys: tuple[str, ...]
    reason: str
    created: dt.datetime | None
    phase: str | None


def parse(obj: dict[str, Any]) -> Request:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    by = str((meta.get("annotations") or {}).get(REQUESTED_BY, ""))
    if not by:
        creators = [m for m in meta.get("managedFields") or [] if m.get("operation") == "Create"]
        by = f"field manager {creators[0].get('manager', '?')}" if creators else ""
    created = meta.get("creationTimestamp")
    return Request(
        name=str(meta.get("name", "")), uid=str(meta.get("uid", "")), by=by, node=str(spec.get("node", "")),
        action=str(spec.get("action", "")), gpus=tuple(str(g) for g in spec.get("gpus") or ()),
        fault_keys=tuple(str(k) for k in spec.get("faultKeys") or ()), reason=str(spec.get("reason") or ""),
        created=dt.datetime.fromisoformat(created.replace("Z", "+00:00")) if created else None,
        phase=(obj.get("status") or {}).get("phase"),
    )  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    outcome: str  # ADOPT | REFUSE | WAIT
    message: str
    round: store.RepairRound | None = None  # ADOPT: the repair's one round
    turn: int = 0  # ADOPT: the node's next turn (the repair's id)


@dataclass(frozen=True)
class Limits:
    """What the janitor allows people to ask for (from its settings)."""

    actions: tuple[str, ...]
    caps: remedies.Caps
    can_replace: bool  # a cloud provider is configured


def job_name(uid: str) -> str:
    """A request's repair Job: by uid, so a request deleted and created again under the same name never
    finds the earlier one's Job (which would say it succeeded)."""
    return bounds.clip(f"request-{uid}", bounds.LABEL_VALUE)


def pci(gpu: str) -> str | None:
    """A PCI bus id as faults name GPUs (`0000:3a:00`), or None when `gpu` is not one."""
    m = _PCI.fullmatch(gpu.lower())
    if m is None:
        return None
    return f"{int(m['domain'], 16):04x}:{m['bus']}:{m['device']}"


def gpu_problem(node: str, gpus: Sequence[str], capacity: int | None) -> str | None:
    """Why `gpus` cannot be reset on the node, or None."""
    seen: set[str] = set()
    for i, gpu in enumerate(gpus):
        where = f"spec.gpus[{i}] {gpu!r}"
        if _INDEX.fullmatch(gpu):
            if capacity is None:
                return (f"{where}: node {node} reports no nvidia.com/gpu capacity to check an index "
                        "against; name the GPU by PCI bus id or UUID")  # fmt: skip
            if int(gpu) >= capacity:
                return f"{where}: node {node} has {capacity} GPUs (indices 0-{capacity - 1})"
            key = str(int(gpu))
        elif (bus := pci(gpu)) is not None:
            key = bus
        elif _UUID.fullmatch(gpu.lower()):
            key = gpu.lower()
        else:
            return f"{where}: not a GPU index, PCI bus id (0000:3b:00) or GPU UUID (GPU-...)"
        if key in seen:
            return f"{where}: named twice"
        seen.add(key)
    return None


def gpu_capacity(node: dict[str, Any]) -> int | None:
    value = ((node.get("status") or {}).get("capacity") or {}).get("nvidia.com/gpu")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def running(repair: store.Repair) -> bool:
    """Is this repair being carried out, validated, or decided right now?"""
    active = (store.State.PENDING, store.State.CLAIMED)
    return repair.janitor.state in active or repair.remediation.state == store.State.CLAIMED


def history(repairs: Iterable[store.Repair]) -> list[remedies.Repair]:
    return [
        remedies.Repair(r.step, tuple(r.fault_keys), r.at, r.outcome)
        for repair in repairs
        for r in repair.rounds
        if r.outcome and r.at is not None
    ]


def check(
    req: Request, node: dict[str, Any] | None, repairs: Sequence[store.Repair],
    faults: Sequence[store.FaultRecord], *, live: set[str], limits: Limits, now: dt.datetime,
) -> Verdict:  # fmt: skip
    """What to do with a person's request, given the Node (None: it does not exist), the node's repairs
    and faults in the store, the uids of the requests that exist (`live`), and the janitor's limits."""
    action = req.action
    if action == remedies.CONTACT_SUPPORT:
        return Verdict(REFUSE, "spec.action: CONTACT_SUPPORT is not a repair faultline carries out "
                               "(a person is the next step)")  # fmt: skip
    if action not in STEPS:
        return Verdict(REFUSE, f"spec.action: {action!r} is not one of {', '.join(STEPS)}")
    if action not in limits.actions:
        allowed = ", ".join(limits.actions) or "nothing"
        return Verdict(REFUSE, f"spec.action: this janitor carries out {allowed} for requests people "
                               f"create, not {action} (its user_actions setting)")  # fmt: skip
    if action == remedies.REPLACE and not limits.can_replace:
        return Verdict(REFUSE, "spec.action: REPLACE needs a cloud provider, and the janitor has none")
    if node is None:
        return Verdict(REFUSE, f"spec.node: node {req.node!r} does not exist")
    if action in NODE_STEPS and req.gpus:
        return Verdict(REFUSE, f"spec.gpus: {action} acts on the whole node and cannot target GPUs; "
                               "leave gpus out (or ask for GPU_RESET)")  # fmt: skip
    if action == remedies.GPU_RESET:
        if not req.gpus:
            return Verdict(REFUSE, "spec.gpus: name the GPUs to reset (index, PCI bus id or UUID)")
        problem = gpu_problem(req.node, req.gpus, gpu_capacity(node))
        if problem is not None:
            return Verdict(REFUSE, problem)
    open_ = {f.id: f for f in faults if f.state == FaultState.OPEN}
    for i, key in enumerate(req.fault_keys):
        if key not in open_:
            return Verdict(REFUSE, f"spec.faultKeys[{i}] {key!r}: not an open fault of node {req.node}")
    busy = [r for r in repairs if running(r)]
    if busy:
        # a person's request deleted before it started is cancelled by the janitor's next claim: wait
        if all(r.user is not None and r.user.uid not in live and r.rounds and r.rounds[-1].started_at is None
               for r in busy):  # fmt: skip
            return Verdict(WAIT, f"waiting for the cancelled {busy[0].id} to close")
        r = busy[0]
        what = f"{r.rounds[-1].step} ({r.rounds[-1].request})" if r.rounds else "being decided"
        return Verdict(REFUSE, f"a repair of node {req.node} is already running: {r.id}, {what}")
    keys = list(req.fault_keys) or _default_faults(action, req.gpus, open_.values())
    why = remedies.capped(keys, history(repairs), limits.caps, now)
    if why is not None and action != remedies.REPLACE:
        return Verdict(REFUSE, f"node {req.node}: {why} (the repair caps): no {action}; faultline's "
                               f"ladder goes to {remedies.last_step(limits.caps)} next")  # fmt: skip
    gpus = list(req.gpus)
    if action in NODE_STEPS:  # the GPUs of the faults it repairs, which the node agent re-reads after
        gpus = sorted({open_[k].entity.id for k in keys if open_[k].entity.type == "GPU"})
    who = f" by {req.by}" if req.by else ""
    why = bounds.clip(req.reason or f"RemediationRequest {req.name}", bounds.REQUEST_TEXT)
    round_ = store.RepairRound(
        step=RepairStep(action), request=req.name, job=job_name(req.uid), fault_keys=sorted(keys), gpus=gpus,
        reason=f"{why} (requested{who})",
        requested_at=req.created or now,
    )  # fmt: skip
    turn = max((r.user.turn for r in repairs if r.user is not None), default=0) + 1
    validate = f"validating {', '.join(sorted(keys))}" if keys else "no open fault to validate"
    return Verdict(ADOPT, f"accepted: {action} of node {req.node}, {validate}", round_, turn)


def _default_faults(action: str, gpus: Sequence[str], faults: Iterable[store.FaultRecord]) -> list[str]:
    """The open fatal faults a step is expected to clear: the whole node's for a reboot or replacement,
    those of the GPUs named by bus id for a reset; never announced maintenance (the provider's to end)."""
    fatal = [f for f in faults if f.fatal and f.metadata.get("repair") != PROVIDER_REPAIR]
    if action != remedies.GPU_RESET:
        return [f.id for f in fatal]
    named = {b for g in gpus if (b := pci(g)) is not None}
    return [f.id for f in fatal if f.entity.type == "GPU" and pci(f.entity.id) in named]


def still_wanted(api: kube.ApiClient, user: store.UserRequest) -> bool:
    """Does the request exist still (the same object: a request created again under its name is not)?"""
    try:
        obj = kube.resources.get_request(api, user.name)
    except NotFoundError:
        return False
    return bool((obj.get("metadata") or {}).get("uid") == user.uid)


def cordon(api: kube.ApiClient, node: str, request: str) -> bool:
    """Cordon the node for `request` unless it is cordoned already (then it is someone else's cordon,
    left alone); idempotent. True when the node is cordoned for this request."""
    for _ in range(5):
        meta, spec = _node(api, node)
        if (meta.get("annotations") or {}).get(CORDONED_FOR) == request:
            return True
        if spec.get("unschedulable"):
            return False
        body = {"metadata": {"annotations": {CORDONED_FOR: request}}, "spec": {"unschedulable": True}}
        try:
            kube.nodes.patch(api, node, body, resource_version=meta["resourceVersion"])
        except ConflictError:
            continue  # the Node changed since it was read: read it again
        return True
    raise TransientError(f"node {node}: five conflicting updates in a row while cordoning", delay=1.0)


def uncordon(api: kube.ApiClient, node: str, request: str) -> bool:
    """Take back the cordon `cordon` put on the node for `request` (nothing when the annotation names
    another request or none, or the Node is gone). True when it uncordoned."""
    for _ in range(5):
        try:
            meta, _spec = _node(api, node)
        except NotFoundError:
            return False
        if (meta.get("annotations") or {}).get(CORDONED_FOR) != request:
            return False
        body = {"metadata": {"annotations": {CORDONED_FOR: None}}, "spec": {"unschedulable": None}}
        try:
            kube.nodes.patch(api, node, body, resource_version=meta["resourceVersion"])
        except ConflictError:
            continue
        return True
    raise TransientError(f"node {node}: five conflicting updates in a row while uncordoning", delay=1.0)


def _node(api: kube.ApiClient, node: str) -> tuple[dict[str, Any], dict[str, Any]]:
    obj = kube.nodes.read(api, node)
    return obj.get("metadata") or {}, obj.get("spec") or {}


def _stamp(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Adopter:
    """The adoption pass: every person's request not yet adopted or refused is checked and either
    refused (status), left for the next pass (WAIT), or adopted (status Pending, then the repair)."""

    def __init__(
        self, st: store.Store, api: kube.ApiClient, limits: Limits, *, record: Any = None
    ) -> None:  # fmt: skip
        self.store = st
        self.api = api
        self.limits = limits
        self.record = record  # called (node, reason, note, warning) for an Event on an existing node

    def run(self) -> None:
        objs = kube.resources.list_requests(self.api, label_selector=USERS)
        first = dt.datetime.min.replace(tzinfo=dt.UTC)
        requests = sorted(map(parse, objs), key=lambda r: (r.created or first, r.name))
        live = {r.uid for r in requests}
        for req in requests:
            if req.phase not in (None, "Pending"):
                continue  # refused, or carried out already
            try:
                self._one(req, live)
            except FaultlineError as exc:  # this request waits for the next pass; the others go on
                log.warning(
                    "RemediationRequest %s: %s", req.name, exc, extra={"node": req.node, "item": req.name}
                )

    def _one(self, req: Request, live: set[str]) -> None:
        repairs = self.store.repairs_of(req.node) if req.node else []
        if any(r.user is not None and r.user.uid == req.uid for r in repairs):
            return  # adopted already
        try:
            node: dict[str, Any] | None = kube.nodes.read(self.api, req.node) if req.node else None
        except NotFoundError:
            node = None
        faults = self.store.faults_of({req.node})[req.node] if node is not None else []
        now = self.store.clock()
        verdict = check(req, node, repairs, faults, live=live, limits=self.limits, now=now)
        fields = {"node": req.node, "item": req.name, "outcome": verdict.outcome, "note": verdict.message,
                  "requested_by": req.by}  # fmt: skip
        if verdict.outcome == WAIT:
            return
        if verdict.outcome == REFUSE:
            if self._refuse(req, verdict.message, now):
                log.warning("request refused", extra=fields)
                if node is not None and self.record is not None:
                    self.record(req.node, "FaultlineRequestRefused",
                                f"RemediationRequest {req.name}: {verdict.message}", True)  # fmt: skip
            return
        assert verdict.round is not None
        pending = {"phase": "Pending", "message": bounds.clip(verdict.message, bounds.REQUEST_TEXT)}
        if req.phase != "Pending" and not self._status(req, pending):
            return  # deleted meanwhile
        user = store.UserRequest(name=req.name, uid=req.uid, by=req.by, turn=verdict.turn)
        if not self.store.adopt_request(req.node, user, verdict.round):
            log.info("request: the node's turn was taken by another adoption; next pass", extra=fields)
            return
        log.info("request adopted", extra={**fields, "repair": store.user_repair_key(req.node, verdict.turn)})

    def _refuse(self, req: Request, message: str, now: dt.datetime) -> bool:
        """Status Refused; on a cluster whose CRD predates that phase (the chart never upgrades CRDs),
        Failed with the same message. False when the request is gone."""
        said = bounds.clip(message, bounds.REQUEST_TEXT)
        status = {"phase": "Refused", "message": said, "finishedAt": _stamp(now), "attempts": 0}
        try:
            return self._status(req, status)
        except InvalidError:
            failed = bounds.clip(f"refused: {message}", bounds.REQUEST_TEXT)
            return self._status(req, {**status, "phase": "Failed", "message": failed})

    def _status(self, req: Request, status: dict[str, Any]) -> bool:
        """Write the request's status; False when it is gone (or is another object of that name now)."""
        try:
            current = kube.resources.get_request(self.api, req.name)
            if (current.get("metadata") or {}).get("uid") != req.uid:
                return False
            kube.resources.patch_request_status(self.api, req.name, status)
        except NotFoundError:
            return False
        return True
