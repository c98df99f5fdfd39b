"""Quarantine rules (pure): which faults cordon, taint and label a node.

A rules file is YAML, loaded and validated like a pattern pack (errors name the file, the rule and the
field):

    rules:
      - name: fatal-gpu
        match: {fatal: true}                     # all given fields must match
        cordon: true
        taints: [{key: faultline.io/fault, value: "{code}", effect: NoSchedule}]
      - name: flapping-links
        match: {code: [NIC-FLAPPING], min_count: 3, node_labels: {pool: training}}
        cordon: true
        labels: {faultline.io/nic: degraded}

Match fields: `code` and `component` and `action` (lists: any of), `fatal` (bool), `min_count`,
`node_labels` (all must equal). A node's desired quarantine is the union over its open faults of every
matching rule's effects. Taints are unique by key and effect on a Node, so for each (key, effect) the
value rendered from the most severe fault wins. Without a rules file the built-in default applies:
fatal faults cordon and taint `faultline.io/fault=<code>:NoSchedule`; other faults only set the node
conditions the agent writes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from faultline import yamldoc
from faultline.errors import ConfigError
from faultline.models import Action, Component

FAULT_TAINT = "faultline.io/fault"
STATE_LABEL = "faultline.io/state"
FAULTS_ANNOTATION = "faultline.io/faults"
MANAGED_LABEL = "faultline.io/managed"
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_SEVERITY = {a: i for i, a in enumerate(Action)}


class Match(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    code: tuple[str, ...] | None = None
    component: tuple[Component, ...] | None = None
    action: tuple[Action, ...] | None = None
    fatal: bool | None = None
    min_count: int = Field(default=1, ge=1)
    node_labels: dict[str, str] = Field(default_factory=dict)


class TaintSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(min_length=1, max_length=253)
    value: str = Field(default="{code}", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @field_validator("value")
    @classmethod
    def _template(cls, value: str) -> str:
        if not _LABEL_VALUE.fullmatch(value.replace("{code}", "X")):
            raise ValueError(f"{value!r} is not a label value (alphanumerics, '-', '_', '.'; at most 63)")
        return value


class Rule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    match: Match = Field(default_factory=Match)
    cordon: bool = False
    taints: tuple[TaintSpec, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not _LABEL_VALUE.fullmatch(value.replace("{code}", "X")):
                raise ValueError(f"label {key}: {value!r} is not a label value")
        return labels


class RuleFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rules: tuple[Rule, ...]


DEFAULT_RULES = (
    Rule(name="fatal-faults-cordon", match=Match(fatal=True), cordon=True,
         taints=(TaintSpec(key=FAULT_TAINT, value="{code}", effect="NoSchedule"),)),
)  # fmt: skip


def load_rules(path: Path | None) -> tuple[Rule, ...]:
    """The rules of a YAML file (None: the built-in default); ConfigError naming file, rule and field."""
    if path is None:
        return DEFAULT_RULES
    try:
        data = yamldoc.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yamldoc.YamlError) as exc:
        raise ConfigError(f"{path}: cannot read quarantine rules: {exc}") from exc
    try:
        parsed = RuleFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        rules = data.get("rules") if isinstance(data, dict) else None
        loc = first["loc"]
        if rules and len(loc) > 1 and loc[0] == "rules" and isinstance(loc[1], int) and loc[1] < len(rules):
            name = rules[loc[1]].get("name") if isinstance(rules[loc[1]], dict) else None
            where += f" (rule {name!r})" if name else ""
        raise ConfigError(f"{path}: {where}: {first['msg']}") from exc
    names = [r.name for r in parsed.rules]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"{path}: rule names must be unique: {', '.join(duplicates)}")
    return parsed.rules


@dataclass(frozen=True)
class OpenFault:
    """What the rules look at in a stored fault."""

    key: str
    code: str
    component: Component
    action: Action
    fatal: bool
    count: int
    first_seen: Any = None  # as stored (for latency figures)
    stage: str = ""  # the quarantine stage's state, as stored

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> OpenFault:
        return cls(str(doc["_id"]), str(doc["code"]), Component(doc["component"]), Action(doc["action"]),
                   bool(doc["fatal"]), int(doc.get("count", 1)), doc.get("first_seen"),
                   str((doc.get("quarantine") or {}).get("state", "")))  # fmt: skip


@dataclass(frozen=True)
class Desired:
    """What faultline wants on a node: cordoned or not, its taints and labels, and the faults behind it."""

    cordon: bool = False
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect), sorted
    labels: tuple[tuple[str, str], ...] = ()
    faults: tuple[str, ...] = ()  # the open fault keys that made it
    # annotations while it is held (other systems told to leave the node alone: Karpenter's do-not-disrupt);
    # they do not make a quarantine by themselves
    annotations: tuple[tuple[str, str], ...] = ()

    @property
    def quarantined(self) -> bool:
        return self.cordon or bool(self.taints) or bool(self.labels)


def matches(rule: Rule, fault: OpenFault, node_labels: Mapping[str, str]) -> bool:
    m = rule.match
    return (
        (m.code is None or fault.code in m.code)
        and (m.component is None or fault.component in m.component)
        and (m.action is None or fault.action in m.action)
        and (m.fatal is None or fault.fatal == m.fatal)
        and fault.count >= m.min_count
        and all(node_labels.get(k) == v for k, v in m.node_labels.items())
    )


def severity(fault: OpenFault) -> tuple[bool, int, str, str]:
    """Sort key, most severe first: fatal, then the heaviest action, then code and key (stable)."""
    return (not fault.fatal, -_SEVERITY[fault.action], fault.code, fault.key)


def desired(rules: Iterable[Rule], faults: Iterable[OpenFault], node_labels: Mapping[str, str]) -> Desired:
    cordon = False
    taints: dict[tuple[str, str], str] = {}
    labels: dict[str, str] = {}
    reasons: list[str] = []
    rule_list = list(rules)
    for fault in sorted(faults, key=severity):  # most severe first: its values win
        hit = False
        for rule in rule_list:
            if not matches(rule, fault, node_labels):
                continue
            hit = True
            cordon |= rule.cordon
            for t in rule.taints:
                taints.setdefault((t.key, t.effect), t.value.replace("{code}", fault.code))
            for key, value in rule.labels.items():
                labels.setdefault(key, value.replace("{code}", fault.code))
        if hit:
            reasons.append(fault.key)
    if cordon or taints or labels:
        labels.setdefault(STATE_LABEL, "quarantined")
    return Desired(
        cordon=cordon,
        taints=tuple(sorted((k, v, e) for (k, e), v in taints.items())),
        labels=tuple(sorted(labels.items())),
        faults=tuple(sorted(reasons)),
    )


@dataclass(frozen=True)
class Owned:
    """What faultline itself put on a node (kept in an annotation, so it can remove exactly that)."""

    cordoned: bool = False
    taints: tuple[tuple[str, str, str], ...] = ()
    labels: tuple[str, ...] = ()
    annotations: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "cordoned": self.cordoned,
            "taints": [
                {"key": k, "value": v, "effect": e} for k, v, e in self.taints
            ],  # FerretDB: no nested arrays
            "labels": list(self.labels),
        }
        if self.annotations:  # only then: records of holds without any read as before
            doc["annotations"] = list(self.annotations)
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Owned:
        if not data:
            return cls()
        taints = tuple(
            (str(t["key"]), str(t.get("value", "")), str(t["effect"])) for t in data.get("taints") or []
        )
        return cls(
            bool(data.get("cordoned")), taints, tuple(str(x) for x in data.get("labels", [])),
            tuple(str(x) for x in data.get("annotations", [])),
        )  # fmt: skip


@dataclass(frozen=True)
class NodeState:
    unschedulable: bool
    taints: tuple[tuple[str, str, str], ...]  # every taint on the node
    labels: Mapping[str, str]
    owned: Owned
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """The change to make: the node's new spec fields and faultline's new ownership record."""

    unschedulable: bool
    taints: tuple[tuple[str, str, str], ...]
    set_labels: dict[str, str] = field(default_factory=dict)
    remove_labels: tuple[str, ...] = ()
    owned: Owned = field(default_factory=Owned)
    changed: bool = False
    set_annotations: dict[str, str] = field(default_factory=dict)
    remove_annotations: tuple[str, ...] = ()


def plan(state: NodeState, want: Desired) -> Plan:
    """From what the node has and what faultline owns to what faultline wants, touching nothing else:
    a node cordoned by someone else stays cordoned (and the cordon is not recorded as faultline's),
    taints and labels of others are kept, and only what faultline added is removed. A taint with the
    key and effect of a wanted one that faultline did not add is left as it is, as is a label someone
    else set (labels under `faultline.io/` are faultline's own and are always set)."""
    owned = state.owned
    if want.cordon:
        owns_cordon = owned.cordoned or not state.unschedulable
        unschedulable = True
    else:
        owns_cordon = False
        unschedulable = state.unschedulable and not owned.cordoned

    wanted_by_slot = {(k, e): (k, v, e) for k, v, e in want.taints}
    owned_slots = {(k, e) for k, _, e in owned.taints}
    taints: list[tuple[str, str, str]] = []
    owned_taints: set[tuple[str, str, str]] = set()
    slots_present: set[tuple[str, str]] = set()
    for taint in state.taints:
        slot = (taint[0], taint[2])
        if slot in owned_slots and taint in owned.taints:  # faultline's
            if slot in wanted_by_slot:
                taints.append(wanted_by_slot[slot])
                owned_taints.add(wanted_by_slot[slot])
                slots_present.add(slot)
            continue  # no longer wanted: removed
        taints.append(taint)  # someone else's: kept
        slots_present.add(slot)
    for slot, taint in wanted_by_slot.items():
        if slot not in slots_present:
            taints.append(taint)
            owned_taints.add(taint)

    set_labels: dict[str, str] = {}
    owned_labels: set[str] = set()
    for key, value in want.labels:
        ours = key in owned.labels or key not in state.labels or key.startswith("faultline.io/")
        if ours:
            owned_labels.add(key)
            if state.labels.get(key) != value:
                set_labels[key] = value
    remove = tuple(sorted(k for k in owned.labels if k not in owned_labels and k in state.labels))

    # annotations: like labels, an annotation someone else set first is theirs (kept, never removed)
    set_annotations: dict[str, str] = {}
    owned_annotations: set[str] = set()
    for key, value in want.annotations:
        if key in owned.annotations or key not in state.annotations:
            owned_annotations.add(key)
            if state.annotations.get(key) != value:
                set_annotations[key] = value
    remove_annotations = tuple(
        sorted(k for k in owned.annotations if k not in owned_annotations and k in state.annotations)
    )

    new_owned = Owned(
        owns_cordon,
        tuple(sorted(owned_taints)),
        tuple(sorted(owned_labels)),
        tuple(sorted(owned_annotations)),
    )
    new_taints = tuple(sorted(set(taints)))
    changed = (
        unschedulable != state.unschedulable or new_taints != tuple(sorted(set(state.taints)))
        or bool(set_labels) or bool(remove) or bool(set_annotations) or bool(remove_annotations)
        or new_owned != owned
    )  # fmt: skip
    return Plan(unschedulable, new_taints, set_labels, remove, new_owned, changed, set_annotations,
                remove_annotations)  # fmt: skip
