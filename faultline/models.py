"""The data model every faultline module speaks (ARCHITECTURE §3).

Observation -> HealthEvent -> Fault.  Ids are deterministic hashes so that a replay, a retry or a
restart produces the same ids and the store's unique indexes absorb duplicates.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from dataclasses import field as dc_field
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Action(StrEnum):
    """What it takes to put the component back in service (ordered from least to most disruptive)."""

    NONE = "NONE"
    RESTART_APP = "RESTART_APP"
    COMPONENT_RESET = "COMPONENT_RESET"
    RESTART_VM = "RESTART_VM"
    RESTART_BM = "RESTART_BM"
    REPLACE_VM = "REPLACE_VM"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"


HEALTH_SAMPLE_CODE = "GPU-HEALTH-SAMPLE"  # the code of a GPU's health sample events (every field it read)


class RepairStep(StrEnum):
    """A round of repair (remediation's ladder, a person's RemediationRequest): what the janitor does."""

    GPU_RESET = "GPU_RESET"
    REBOOT = "REBOOT"
    REPLACE = "REPLACE"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"  # no automatic repair left: a person takes over


class RepairOutcome(StrEnum):
    """How a round of repair ended, as the janitor (or remediation, for contact support) recorded it."""

    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    NOT_CLEARED = "NotCleared"  # it ran, but the faults did not clear within validation
    CONTACT_SUPPORT = "ContactSupport"
    CANCELLED = "Cancelled"  # a person's request deleted before the janitor started it: no repair


class Component(StrEnum):
    GPU = "GPU"
    NVSWITCH = "NVSWITCH"
    NIC = "NIC"
    NODE = "NODE"
    MONITOR = "MONITOR"


class Source(StrEnum):
    JOURNAL = "journal"
    KMSG = "kmsg"
    SYSLOG = "syslog"
    NVML = "nvml"
    DCGM = "dcgm"
    NIC = "nic"
    CSP = "csp"
    KUBE = "kube"
    GRPC = "grpc"


# Fault.metadata["repair"] == PROVIDER_REPAIR: the cloud provider carries out what the fault's action says
# (announced maintenance): faultline quarantines and drains the node but asks for no repair of its own.
PROVIDER_REPAIR = "provider"


class FaultState(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"


class Entity(BaseModel):
    """What the fault is about: a GPU or NVSwitch by PCI bus id (dddd:bb:dd), a NIC by device/port."""

    model_config = ConfigDict(frozen=True)

    type: str
    id: str


class Observation(BaseModel):
    """One raw input item. Never stored."""

    model_config = ConfigDict(frozen=True)

    node: str
    source: Source
    ts: datetime
    text: str | None = None
    fields: dict[str, str] = Field(default_factory=dict)


class HealthEvent(BaseModel):
    """What a detector concludes from observations."""

    model_config = ConfigDict(frozen=True)

    id: str
    node: str
    agent: str = "faultline"
    component: Component
    check: str
    code: str
    entities: tuple[Entity, ...]
    healthy: bool
    fatal: bool
    action: Action
    message: str = ""
    metadata: dict[str, str] = Field(default_factory=dict)
    generated_at: datetime
    observed_at: datetime


class Fault(BaseModel):
    """The deduplicated view of one problem on one entity, keyed by (node, entity, code)."""

    model_config = ConfigDict(frozen=True)

    id: str
    node: str
    entity: Entity
    code: str
    component: Component
    count: int
    first_seen: datetime
    last_seen: datetime
    fatal: bool
    action: Action
    state: FaultState
    resolved_at: datetime | None = None
    description: str = ""
    message: str = ""
    pattern: str = ""
    metadata: dict[str, str] = Field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return fault_key(self.node, self.entity.type, self.entity.id, self.code)


@dataclass(frozen=True)
class NodeUpdate:
    """What the node agent's detector hands its sinks after a batch: every fault of the node, the ones
    that changed (each with its revision: the store keeps the newest), and the batch's health events.
    A plain dataclass: it is built once per batch and never crosses a process."""

    node: str
    faults: list[Fault]
    changed: list[tuple[Fault, int]]
    events: list[HealthEvent] = dc_field(default_factory=list)


# A fault code is the value of the quarantine's taint (`faultline.io/fault=<code>`): Kubernetes' label-value
# syntax, or the node could never be tainted for it
FAULT_CODE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
FAULT_CODE_RULE = "1-63 of A-Z a-z 0-9 - _ . beginning and ending with a letter or digit (a taint value)"


def code_problem(code: str) -> str | None:
    """Why `code` cannot be a fault code, or None when it can."""
    if FAULT_CODE.fullmatch(code):
        return None
    return f"code {code[:80]!r} is not a valid taint value: {FAULT_CODE_RULE}"


def fault_key(node: str, entity_type: str, entity_id: str, code: str) -> tuple[str, str, str, str]:
    """The stable identity of a fault: (node, entity type, entity id, code)."""
    return (node, entity_type, entity_id, code)


def stable_id(*parts: object) -> str:
    """A deterministic 24-hex-digit id from the parts (their str forms, unit-separated)."""
    joined = "\x1f".join(str(p) for p in parts)
    return hashlib.blake2b(joined.encode("utf-8"), digest_size=12).hexdigest()


def fault_id(node: str, entity_type: str, entity_id: str, code: str) -> str:
    return stable_id("fault", node, entity_type, entity_id, code)


def event_id(node: str, source: str, entity_type: str, entity_id: str, code: str, ts: datetime) -> str:
    return stable_id("event", node, source, entity_type, entity_id, code, ts.isoformat())


def utc_text(t: datetime, *, seconds: bool = False) -> str:
    """`t` as UTC in ISO 8601 with a `Z` (a naive `t` is taken to be UTC already); `seconds`: to the second,
    as `kubectl` prints times."""
    aware = (t if t.tzinfo else t.replace(tzinfo=UTC)).astimezone(UTC)
    return aware.strftime("%Y-%m-%dT%H:%M:%SZ") if seconds else aware.isoformat().replace("+00:00", "Z")


def utc_from_epoch(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)
