"""NVSentinel-compatible ingest: NVSentinel's health monitors (and monitors written for its platform
connector) report to the node agent unchanged, over NVSentinel's own gRPC contract
(`datamodels.PlatformConnector/HealthEventOccurredV1`, faultline/api/nvsentinel.proto).

    HealthEventOccurredV1(batch) ── validate: every event, whole ──> Reports
        ── CheckIndex.accept: codes, check-level clears ──> IngestSpool (fsync) ──> the `ingest` pack

Each event becomes records of faultline's own ingest (`sources.ingest`), appended to the same spool, so
they are durable before the call returns and are matched, deduplicated and resolved like faultline's
own ingest; a bad field fails the whole batch with INVALID_ARGUMENT naming it (`events[2].errorCode[0]`)
and nothing is kept. The server is `sources.nvsentinel_server` (it alone imports grpc).

How a HealthEvent maps (field numbers as in the proto):

- `nodeName` (13) must be this agent's node; `agent` (2) and `checkName` (4) are kept as they are.
- `componentClass` (3): GPU, NVSWITCH, NIC or NODE, in any case; any other class is refused.
- `errorCode` (9): one faultline fault per code, upper-cased. The XID and SXID checks of NVSentinel's
  syslog monitor send bare numbers; they become `XID-<n>` and `SXID-<n>`, faultline's own codes. An
  unhealthy event with no code gets its check's name as code.
- `entitiesImpacted` (10): NVSentinel lists several names of one thing (a GPU's index, PCI address and
  UUID); the fault is on one of them: for a GPU or NVSwitch its PCI bus id (`dddd:bb:dd`, as faultline's
  own detectors name it), else a GPU's UUID, else the first entity as sent, else the node.
- `recommendedAction` (8), every value: NONE, COMPONENT_RESET, CONTACT_SUPPORT, RESTART_VM, RESTART_BM,
  REPLACE_VM and RESTART_APP are faultline's actions of the same name. RUN_FIELDDIAG and RUN_DCGMEUD
  (diagnostics faultline does not run), CUSTOM (a site's own remediation), REMEDIATE (no meaning stated
  in the proto) and UNKNOWN become CONTACT_SUPPORT: the node is held for a person, never repaired
  blindly. A number outside the enum is refused.
- `processingStrategy` (16): UNSPECIFIED is EXECUTE_REMEDIATION, as NVSentinel's connector reads it;
  STORE_ONLY and STORE_AND_ANALYSE ("do not touch the cluster") record the fault as not fatal with
  action NONE, so the default quarantine rules leave the node alone. `quarantineOverrides` (14): skip
  is the same as STORE_ONLY, force makes the fault fatal. `drainOverrides` (15) is refused when set:
  faultline drains a quarantined node as its drain settings say.
- `isHealthy` (6): resolves the codes it names on that entity; with no code (NVSentinel's "this check
  passes"), every code the same agent's check reported there and that is still open (`CheckIndex`).
- `message` (7), `metadata` (11) and `generatedTimestamp` (12, required) follow faultline's ingest
  limits; the original component class, action, strategy, codes, entities, `id` (17) and
  `customRecommendedAction` (18) are kept in the record's metadata under `nvsentinel_*`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultline import bounds
from faultline.models import Action, Component
from patterns import templates
from sources import ingest
from sources.ingest import InvalidEventError

if TYPE_CHECKING:  # the messages' module is imported by the server (sources.nvsentinel_server) only
    from faultline.api import nvsentinel_pb2

log = logging.getLogger(__name__)

# RecommendedAction by number: (its name, faultline's action)
ACTIONS: dict[int, tuple[str, Action]] = {
    0: ("NONE", Action.NONE),
    2: ("COMPONENT_RESET", Action.COMPONENT_RESET),
    5: ("CONTACT_SUPPORT", Action.CONTACT_SUPPORT),
    6: ("RUN_FIELDDIAG", Action.CONTACT_SUPPORT),
    15: ("RESTART_VM", Action.RESTART_VM),
    24: ("RESTART_BM", Action.RESTART_BM),
    25: ("REPLACE_VM", Action.REPLACE_VM),
    26: ("RUN_DCGMEUD", Action.CONTACT_SUPPORT),
    27: ("CUSTOM", Action.CONTACT_SUPPORT),
    28: ("REMEDIATE", Action.CONTACT_SUPPORT),
    39: ("RESTART_APP", Action.RESTART_APP),
    99: ("UNKNOWN", Action.CONTACT_SUPPORT),
}
# ProcessingStrategy by number: (its name, whether the event may act on the cluster)
STRATEGIES: dict[int, tuple[str, bool]] = {
    0: ("UNSPECIFIED", True),
    1: ("EXECUTE_REMEDIATION", True),
    2: ("STORE_ONLY", False),
    3: ("STORE_AND_ANALYSE", False),
}
COMPONENTS = {c.value: c for c in (Component.GPU, Component.NVSWITCH, Component.NIC, Component.NODE)}
CODE_PREFIXES = {"SysLogsXIDError": "XID-", "SysLogsSXIDError": "SXID-"}  # bare numbers of these checks
VERSIONS = (0, 1)  # 0: unset
MAX_CODES = 16
MAX_ID = 128
MAX_CODE = 64  # characters of a code (as _CODE says, and the ingest API's)
_CODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_NOT_CODE = re.compile(r"[^A-Z0-9_.-]")

Key = tuple[str, str, str, str]  # (agent, check, entity type, entity id)


@dataclass(frozen=True)
class Report:
    """One accepted NVSentinel event: the ingest record without its code, and the codes it concerns;
    no codes on a healthy event: every code its check reported open on that entity."""

    key: Key
    codes: tuple[str, ...]
    record: dict[str, Any]


def _require(ok: bool, field: str, reason: str) -> None:
    if not ok:
        raise InvalidEventError(field, reason)


def validate(batch: nvsentinel_pb2.HealthEvents, node: str, now: dt.datetime) -> list[Report]:
    """Every event of the batch mapped, or InvalidEventError for the first bad field."""
    _require(batch.version in VERSIONS, "version", f"{batch.version} is not a version this agent reads (1)")
    _require(0 < len(batch.events) <= ingest.MAX_EVENTS, "events",
             f"a batch holds 1 to {ingest.MAX_EVENTS} events")  # fmt: skip
    return [_event(e, f"events[{i}]", node, now) for i, e in enumerate(batch.events)]


def _event(e: nvsentinel_pb2.HealthEvent, at: str, node: str, now: dt.datetime) -> Report:
    _require(e.version in VERSIONS, f"{at}.version", f"{e.version} is not a version this agent reads (1)")
    _require(e.nodeName == node, f"{at}.nodeName",
             f"{bounds.quote(e.nodeName)} is not this agent's node {node!r}")  # fmt: skip
    _require(bool(ingest._NAME.fullmatch(e.agent)), f"{at}.agent",
             "1-128 of A-Z a-z 0-9 _ . : / - (no spaces)")  # fmt: skip
    _require(bool(ingest._NAME.fullmatch(e.checkName)), f"{at}.checkName",
             "1-128 of A-Z a-z 0-9 _ . : / - (no spaces)")  # fmt: skip
    component = COMPONENTS.get(e.componentClass.upper())
    _require(component is not None, f"{at}.componentClass",
             f"{bounds.quote(e.componentClass)} is not one of {', '.join(COMPONENTS)}")  # fmt: skip
    assert component is not None
    _require(e.recommendedAction in ACTIONS, f"{at}.recommendedAction",
             f"{e.recommendedAction} is not one of {_names(ACTIONS)}")  # fmt: skip
    action_name, action = ACTIONS[e.recommendedAction]
    _require(e.processingStrategy in STRATEGIES, f"{at}.processingStrategy",
             f"{e.processingStrategy} is not one of {_names(STRATEGIES)}")  # fmt: skip
    strategy, acts = STRATEGIES[e.processingStrategy]
    fatal = e.isFatal
    q = e.quarantineOverrides
    _require(not (q.force and q.skip), f"{at}.quarantineOverrides", "force and skip exclude each other")
    if q.skip:
        acts = False
    if q.force:
        _require(acts, f"{at}.quarantineOverrides.force", f"contradicts processingStrategy {strategy}")
        fatal = True
    for flag in ("force", "skip"):
        _require(not getattr(e.drainOverrides, flag), f"{at}.drainOverrides.{flag}",
                 "faultline takes no per-event drain override: a quarantined node is drained as the "
                 "drain settings say")  # fmt: skip
    codes = _codes(e, at)
    entities, primary = _entities(e, at, component)
    _require(len(e.message) <= ingest.MAX_MESSAGE, f"{at}.message",
             f"at most {ingest.MAX_MESSAGE} characters")  # fmt: skip
    metadata = _metadata(e, at)
    _require(len(e.id) <= MAX_ID, f"{at}.id", f"at most {MAX_ID} characters")
    _require(len(e.customRecommendedAction) <= MAX_ID, f"{at}.customRecommendedAction",
             f"at most {MAX_ID} characters")  # fmt: skip
    when = _when(e, at, now)
    if not codes and not e.isHealthy:
        codes = (bounds.clip(_NOT_CODE.sub("-", e.checkName.upper()), MAX_CODE),)  # a failing check, no code
    metadata.update(
        {"nvsentinel_component_class": e.componentClass, "nvsentinel_recommended_action": action_name,
         "nvsentinel_processing_strategy": strategy, "nvsentinel_fatal": str(e.isFatal).lower()}
    )  # fmt: skip
    optional = {"nvsentinel_error_codes": ",".join(e.errorCode), "nvsentinel_entities": entities,
                "nvsentinel_id": e.id, "nvsentinel_custom_action": e.customRecommendedAction}  # fmt: skip
    metadata.update({k: v for k, v in optional.items() if v})
    unhealthy = not e.isHealthy
    record = {
        "node": e.nodeName, "agent": e.agent, "check": e.checkName, "component": component.value,
        "entities": [{"type": primary[0], "id": primary[1]}] if primary else [],
        "healthy": e.isHealthy, "fatal": unhealthy and acts and fatal,
        "action": (action if unhealthy and acts else Action.NONE).value,
        "message": e.message, "metadata": metadata, "ts": when.timestamp(),
    }  # fmt: skip
    etype, eid = primary or ("NODE", "")
    return Report((e.agent, e.checkName, etype, eid), codes, record)


def _names(table: dict[int, tuple[str, Any]]) -> str:
    return ", ".join(f"{name}={number}" for number, (name, _) in table.items())


def _codes(e: nvsentinel_pb2.HealthEvent, at: str) -> tuple[str, ...]:
    _require(len(e.errorCode) <= MAX_CODES, f"{at}.errorCode", f"at most {MAX_CODES} codes")
    prefix = CODE_PREFIXES.get(e.checkName, "")
    codes: list[str] = []
    for k, raw in enumerate(e.errorCode):
        _require(bool(_CODE.fullmatch(raw)), f"{at}.errorCode[{k}]",
                 "1-64 of A-Z a-z 0-9 _ . - starting with a letter or digit")  # fmt: skip
        code = raw.upper()
        if prefix and code[0].isdigit():
            code = prefix + code
            _require(len(code) <= MAX_CODE, f"{at}.errorCode[{k}]",
                     f"{bounds.quote(code)} is longer than {MAX_CODE} characters")  # fmt: skip
        if code not in codes:
            codes.append(code)
    return tuple(codes)


def _entities(
    e: nvsentinel_pb2.HealthEvent, at: str, component: Component
) -> tuple[str, tuple[str, str] | None]:
    """The entities as sent (`TYPE=value,...`) and the one the fault is on (None: the node)."""
    _require(len(e.entitiesImpacted) <= ingest.MAX_ENTITIES, f"{at}.entitiesImpacted",
             f"at most {ingest.MAX_ENTITIES}")  # fmt: skip
    named: list[tuple[str, str]] = []
    for j, entity in enumerate(e.entitiesImpacted):
        etype = entity.entityType.upper()
        _require(bool(ingest._ENTITY_TYPE.fullmatch(etype)), f"{at}.entitiesImpacted[{j}].entityType",
                 "1-32 of A-Z a-z _ starting with a letter")  # fmt: skip
        _require(bool(ingest._ENTITY_ID.fullmatch(entity.entityValue)),
                 f"{at}.entitiesImpacted[{j}].entityValue", "1-128 of A-Z a-z 0-9 _ . : / -")  # fmt: skip
        named.append((etype, entity.entityValue))
    first = dict(reversed(named))  # each type's first entity
    primary: tuple[str, str] | None = named[0] if named else None
    if component in (Component.GPU, Component.NVSWITCH) and "PCI" in first:
        primary = (component.value, templates.pci_bus(first["PCI"]))
    elif component is Component.GPU and "GPU_UUID" in first:
        primary = (Component.GPU.value, first["GPU_UUID"])
    return ",".join(f"{x.entityType}={x.entityValue}" for x in e.entitiesImpacted), primary


def _metadata(e: nvsentinel_pb2.HealthEvent, at: str) -> dict[str, str]:
    _require(
        len(e.metadata) <= ingest.MAX_METADATA, f"{at}.metadata", f"at most {ingest.MAX_METADATA} entries"
    )
    for key, value in e.metadata.items():
        _require(bool(ingest._META_KEY.fullmatch(key)),
                 f"{at}.metadata[{bounds.quote(key, ingest.MAX_METADATA_KEY)}]",
                 "keys are 1-64 of A-Z a-z 0-9 _ - (no dots or $)")  # fmt: skip
        _require(len(value) <= ingest.MAX_METADATA_VALUE, f"{at}.metadata[{key!r}]",
                 f"values are at most {ingest.MAX_METADATA_VALUE} characters")  # fmt: skip
    return dict(e.metadata)


def _when(e: nvsentinel_pb2.HealthEvent, at: str, now: dt.datetime) -> dt.datetime:
    _require(e.HasField("generatedTimestamp"), f"{at}.generatedTimestamp", "required")
    try:
        when = e.generatedTimestamp.ToDatetime(tzinfo=dt.UTC)
    except (ValueError, OverflowError) as exc:
        raise InvalidEventError(f"{at}.generatedTimestamp", f"not a valid time ({exc})") from exc
    _require(
        when <= now + ingest.MAX_FUTURE, f"{at}.generatedTimestamp", f"{when.isoformat()} is in the future"
    )
    _require(
        when >= now - ingest.MAX_AGE, f"{at}.generatedTimestamp", f"{when.isoformat()} is older than 7 days"
    )
    return when


def plan(
    reports: Iterable[Report], table: dict[Key, tuple[str, ...]], *, max_keys: int, max_codes: int
) -> tuple[list[dict[str, Any]], dict[Key, tuple[str, ...]]]:
    """The ingest records of these reports, in order, and the open codes per check and entity after
    them (pure). A healthy report without codes resolves what its key has open; the table keeps the
    `max_keys` most recently failing keys and their `max_codes` latest codes."""
    after = dict(table)
    records: list[dict[str, Any]] = []
    for report in reports:
        open_codes = after.get(report.key, ())
        if report.record["healthy"]:
            codes = report.codes or open_codes
            remaining = tuple(c for c in open_codes if c not in codes)
            after.pop(report.key, None)
            if remaining:
                after[report.key] = remaining
        else:
            codes = report.codes
            after.pop(report.key, None)  # re-inserted last: the most recent
            after[report.key] = (*open_codes, *(c for c in codes if c not in open_codes))[-max_codes:]
            while len(after) > max_keys:
                forgotten = next(iter(after))
                log.warning(
                    "nvsentinel_check_forgotten", extra={"agent": forgotten[0], "check": forgotten[1]}
                )
                del after[forgotten]
        records.extend({**report.record, "code": code} for code in codes)
    return records, after


class CheckIndex:
    """Which codes each (agent, check, entity) reported failing and has not reported healthy since:
    NVSentinel's monitors say "this check passes on this entity" with no code, faultline resolves by
    code. Kept in a JSON file beside the spool, replaced atomically; it only ever holds more codes than
    are open (written before the spool when it grows, after it when it shrinks), and resolving a code
    that is not open does nothing."""

    def __init__(self, path: Path, *, max_keys: int = 4096, max_codes: int = 64) -> None:
        self.path = path
        self.max_keys = max_keys
        self.max_codes = max_codes
        self.lock = threading.Lock()
        self.table = self._load()

    def _load(self) -> dict[Key, tuple[str, ...]]:
        try:
            doc = json.loads(self.path.read_text())
            return {(a, c, t, i): tuple(codes) for a, c, t, i, codes in doc["open"]}
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("nvsentinel_index_unreadable", extra={"path": str(self.path), "error": str(exc)})
            return {}

    def _write(self, table: dict[Key, tuple[str, ...]]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = json.dumps({"open": [[*key, list(codes)] for key, codes in table.items()]}).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self.table = table

    def accept(self, reports: list[Report], append: Callable[[list[dict[str, Any]]], None]) -> int:
        """Append the reports' records with `append` (the spool's, durable when it returns) and keep
        the index; returns how many records were appended. `append`'s errors propagate."""
        with self.lock:
            records, after = plan(reports, self.table, max_keys=self.max_keys, max_codes=self.max_codes)
            grown = {**self.table, **{k: _union(self.table.get(k, ()), v) for k, v in after.items()}}
            if grown != self.table:
                self._write(grown)
            append(records)
            if after != self.table:
                self._write(after)
            return len(records)


def _union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return (*a, *(c for c in b if c not in a))
