"""The typed documents of every collection faultline writes (what `faultline.store` returns).

Each model reads a stored document as it is (`from_doc`, unknown fields ignored) and names the fields
other modules may rely on. Dates are aware UTC (a naive date, as an older version or a test may have
written it, is taken as UTC).

Hand-over fields between workers (each written only through a named store operation):
- `NodeHold.quarantined` and `NodeHold.owned.cordoned` (quarantine -> drainer, remediation): the node
  is held, and faultline cordoned it; `NodeHold.quarantined_at` is the quarantine's *episode*.
- `Drain.episode` and `Drain.result == "drained"` (drainer -> remediation): that episode's node is empty;
  with `Drain.scope == "gpus"` only the pods of `Drain.gpus` were moved (a partial drain), and
  remediation asks for the whole node (`widen_drain`) before any repair other than a reset of those GPUs.
- `GpuPods` (node agent -> drainer): which pods use which GPU, read after the episode's cordon.
- `Repair.remediation.state` / `Repair.janitor.state` (remediation <-> janitor): a pending janitor stage
  carries out the last round; a pending remediation stage decides the next round (an escalation).
- `Repair.user` (a person -> janitor): a RemediationRequest someone created, adopted as a repair of
  its own (`Store.adopt_request`); the janitor carries out its one round like remediation's.
- `RepairRound.verified_at` (janitor -> node agent): the round's step verifiably happened (reset Job
  succeeded, node back with a new boot id); while the round validates, the agent re-reads the round's
  GPUs and reports those that read healthy (`RepairNotice`).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from faultline.models import RepairOutcome, RepairStep
from faultline.store.base import Stage, State


def _aware(t: dt.datetime) -> dt.datetime:
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


UTCDateTime = Annotated[dt.datetime, AfterValidator(_aware)]


class Document(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Self:
        return cls.model_validate(doc)


class StageStatus(Document):
    """One stage's status on a work document (`queue`, `drains`, `repairs`), moved only by claims.

    `seq` is the number of the last lease document of this (stage, item); `retry_after`: a failed
    item is not claimed again before it (back-off); `error`: why it was given back or parked."""

    state: State = State.PENDING
    attempts: int = 0
    seq: int = 0
    lease_owner: str | None = None
    lease_until: UTCDateTime | None = None
    updated_at: UTCDateTime | None = None
    error: str | None = None
    retry_after: UTCDateTime | None = None


class Lease(Document):
    """`leases`: `<stage>/<item>/<n>`, inserted to claim, close or take back an item (fencing)."""

    id: str = Field(alias="_id")
    fault: str  # the item's id
    stage: str
    n: int
    owner: str
    kind: str  # claimed | closed:<state> | expired
    until: UTCDateTime | None = None
    at: UTCDateTime


class EntityRecord(Document):
    type: str
    id: str


class FaultRecord(Document):
    """`faults`: the detector's view of one fault (written by revision: by the node agents, and the cloud
    maintenance monitor for the CSP-MAINTENANCE-* faults, whose `metadata` holds its record)."""

    id: str = Field(alias="_id")
    node: str
    entity: EntityRecord
    code: str
    component: str
    count: int = 1
    first_seen: UTCDateTime
    last_seen: UTCDateTime
    fatal: bool = False
    action: str
    state: str
    resolved_at: UTCDateTime | None = None
    resolved_by: str | None = None
    message: str = ""
    pattern: str = ""
    metadata: dict[str, str] = Field(default_factory=dict)
    revision: int = 0
    evidence: dict[str, str] | None = None  # who signed it (`faultline.evidence`)
    work: StageStatus | None = None  # the fault's work item's stage status, where it was read with it
    opened_revision: int | None = None  # the revision of the write that stored it first


class WorkItem(Document):
    """`queue`: `<stage>/<fault key>`, a fault-level stage's work on one open fault (made when the fault
    opens, removed when it resolves). The stage's status sits under the stage's name."""

    id: str = Field(alias="_id")
    key: str
    node: str
    first_seen: UTCDateTime | None = None
    last_seen: UTCDateTime | None = None
    fatal: bool = False
    quarantine: StageStatus = Field(default_factory=StageStatus)


class Taint(Document):
    key: str
    value: str = ""
    effect: str


class Owned(Document):
    """What faultline itself put on a node (the quarantine's record of it)."""

    cordoned: bool = False
    taints: list[Taint] = Field(default_factory=list)  # FerretDB: no nested arrays
    labels: list[str] = Field(default_factory=list)


class NodeHold(Document):
    """`nodes/<node>`: what faultline holds on a node (written by the quarantine worker)."""

    id: str = Field(alias="_id")
    quarantined: bool = False
    quarantined_at: UTCDateTime | None = None  # the first quarantine of this episode
    faults: list[str] = Field(default_factory=list)
    owned: Owned = Field(default_factory=Owned)
    checked_at: UTCDateTime | None = None
    released_at: UTCDateTime | None = None
    gone: bool = False  # the Node no longer exists


class DryRun(Document):
    """`nodes/dry-run:<node>`: what the quarantine would have done (dry-run mode)."""

    id: str = Field(alias="_id")
    node: str
    at: UTCDateTime
    would: str


class Breaker(Document):
    """`nodes/breaker:quarantine`: the quarantine circuit breaker's stored state, and its last reset by a
    person (`faultline breaker reset`): who, why and when."""

    state: str = "closed"
    since: UTCDateTime | None = None
    reason: str = ""
    reset_by: str = ""
    reset_reason: str = ""
    reset_at: UTCDateTime | None = None
    revision: int = 0  # every change adds one: a replica changes the state only from the one it read


class PodRecord(Document):
    """One pod of a drain (kept so a takeover continues, e.g. DeleteAfterTimeout's first eviction).
    `skipped`: why the drain leaves this pod where it is (a system namespace; in a partial drain, a pod
    that uses none of the faulty GPUs); `mode` is empty for a pod skipped before its mode was read."""

    model_config = ConfigDict(extra="allow")
    namespace: str
    name: str
    mode: str = ""
    skipped: str | None = None
    evicted_at: UTCDateTime | None = None
    evicted: bool = False
    refused: int = 0
    deleted_at: UTCDateTime | None = None


class Drain(Document):
    """`drains/<node>`: the drain of one quarantine episode of a node (the drainer's work item)."""

    id: str = Field(alias="_id")
    node: str
    episode: UTCDateTime | None = None
    first_seen: UTCDateTime | None = None
    fatal: bool = False
    pods: dict[str, PodRecord] = Field(default_factory=dict)  # by pod uid
    started_at: UTCDateTime | None = None
    drained_at: UTCDateTime | None = None
    result: str | None = None  # "drained" hands the episode to remediation
    # what the drain empties: "node" (every pod but DaemonSet, mirror and system-namespace pods) or
    # "gpus" (a partial drain: only the pods using `gpus`, PCI bus ids); `scope_reason` says why
    scope: str | None = None
    gpus: list[str] = Field(default_factory=list)
    scope_reason: str | None = None
    nodedrain: StageStatus = Field(default_factory=StageStatus)


class GpuAssignment(Document):
    """One GPU device the kubelet gave one container: `gpu` the GPU's PCI bus id (the id faults name),
    `device` the id the kubelet and device plugin use (a UUID, or an index)."""

    gpu: str
    device: str
    namespace: str
    pod: str
    container: str = ""


class GpuPods(Document):
    """`gpu_pods/<node>`: which pods use which GPU on a node, as the node's agent last read it from the
    kubelet's pod-resources API (agent -> drainer, for a partial drain). `episode`: the node's
    quarantine episode (`NodeHold.quarantined_at`) the agent had seen before that read, so the
    drainer knows the read was made after the node was cordoned; `unmapped`: GPU device ids the agent
    could not match to a GPU of the node (MIG devices, an unknown id scheme)."""

    id: str = Field(alias="_id")
    node: str
    read_at: UTCDateTime
    episode: UTCDateTime | None = None
    assignments: list[GpuAssignment] = Field(default_factory=list)  # flat: FerretDB has no nested arrays
    unmapped: list[str] = Field(default_factory=list)


class RepairRound(Document):
    """One round of repair: asked for by remediation, carried out and judged by the janitor."""

    step: RepairStep
    request: str
    fault_keys: list[str] = Field(default_factory=list)
    gpus: list[str] = Field(default_factory=list)
    reason: str = ""
    requested_at: UTCDateTime | None = None
    started_at: UTCDateTime | None = None  # the janitor's first holder of the round
    boot_before: str | None = None  # the node's boot id then (a takeover waits for the same reboot)
    cloud_call: str | None = None  # the provider's answer, once called (never called twice)
    # the janitor's verified outcome of its step, before validation (the reset Job succeeded; the node
    # is back with a new boot id): what the node agent re-reads its GPUs' health on (`RepairNotice`)
    verified_at: UTCDateTime | None = None
    evidence: str | None = None
    # the janitor's waits hold no thread: what a later look needs (each holder looks once and gives the
    # round back): when the Job was created (never created twice), when validation must end, and when
    # the last look was (a gap in the looks, the store or every janitor away, gives the agent its time)
    acted_at: UTCDateTime | None = None
    validate_until: UTCDateTime | None = None
    checked_at: UTCDateTime | None = None
    lookers: list[str] = Field(default_factory=list)  # the janitor replicas that took the round on
    outcome: RepairOutcome | None = None
    at: UTCDateTime | None = None
    message: str | None = None
    external: bool = False  # an external remediator's CR: the janitor only validates
    timeout: float | None = None  # seconds for an external round's faults to clear
    job: str | None = None  # the repair Job's name where it is not `request` (a person's request)


class UserRequest(Document):
    """The RemediationRequest a person created, which the janitor adopted as a repair: its name and
    uid (a request deleted, or deleted and created again under the same name, is no longer this one),
    who asked (the annotation `faultline.io/requested-by`, else the field manager that created it),
    and the repair's turn among the node's adopted requests (`<node>/request-<turn>`)."""

    name: str
    uid: str
    by: str = ""
    turn: int


class Repair(Document):
    """`repairs/<node>/<episode>`: the repair of one quarantine episode (remediation's and the
    janitor's work item); `repairs/<node>/request-<turn>`: a person's RemediationRequest the janitor
    adopted (`user` set; no episode)."""

    id: str = Field(alias="_id")
    node: str
    episode: UTCDateTime | None = None
    first_seen: UTCDateTime | None = None
    fatal: bool = True
    rounds: list[RepairRound] = Field(default_factory=list)
    result: str | None = None
    user: UserRequest | None = None
    remediation: StageStatus = Field(default_factory=StageStatus)
    janitor: StageStatus = Field(default_factory=lambda: StageStatus(state=State.IDLE))


class RepairNotice(BaseModel):
    """A repair the janitor carried out on a node and verified, now being validated (read by the node
    agent: `Store.repairs_to_confirm`). `round_id` is `<repair id>#<round index>`; `gpus` the PCI bus
    ids the round repaired."""

    round_id: str
    step: RepairStep  # GPU_RESET | REBOOT
    gpus: tuple[str, ...]
    verified_at: dt.datetime


class ScheduledEvent(Document):
    """One event of an Azure VM's Scheduled Events document, as its agent read it (`Resources` joined
    with commas: FerretDB has no arrays inside the documents of an array)."""

    event_id: str
    event_type: str
    status: str = "Scheduled"  # Scheduled | Started
    resources: str = ""
    not_before: str = ""  # as Azure wrote it (RFC 1123), "" when none
    description: str = ""
    source: str = ""  # Platform | User
    duration_s: int = -1


class ScheduledEvents(Document):
    """`maintenance/<node>`: an Azure node's Scheduled Events, which only the node itself can read (its
    agent relays them every few seconds), and the early starts asked for them: `start_requested` by the
    maintenance monitor once the node is drained, `started` by the agent once it posted them."""

    id: str = Field(alias="_id")
    node: str
    read_at: UTCDateTime | None = None
    vm_name: str = ""
    incarnation: int = 0
    events: list[ScheduledEvent] = Field(default_factory=list)
    start_requested: list[str] = Field(default_factory=list)
    started: list[str] = Field(default_factory=list)
    started_at: UTCDateTime | None = None


class GpuIdentity(Document):
    """`gpus/<node>/<pci>`: what a node's agent read of one of its GPUs (reports and RMA bundles name GPUs
    by it). A GPU moved to another node gets a document there too: its serial ties them together."""

    id: str = Field(alias="_id")
    node: str
    pci: str
    index: int = -1
    uuid: str = ""
    serial: str = ""
    model: str = ""
    vbios: str = ""
    driver: str = ""
    first_seen: UTCDateTime | None = None
    seen_at: UTCDateTime | None = None


class Episode(Document):
    """`episodes/<node>/<quarantined at>`: one quarantine of a node, from cordon to release (written by the
    quarantine worker; what `faultline report` measures time to quarantine and out of service on)."""

    id: str = Field(alias="_id")
    node: str
    quarantined_at: UTCDateTime
    released_at: UTCDateTime | None = None
    faults: list[str] = Field(default_factory=list)
    codes: list[str] = Field(default_factory=list)
    first_seen: UTCDateTime | None = None  # the earliest first sighting of the faults behind it


class Parked(BaseModel):
    """A parked work item, as `faultline status` lists it."""

    stage: Stage
    item: str
    node: str
    attempts: int
    reason: str
    at: dt.datetime | None
