"""Object rules: faults read from Kubernetes objects (the object monitor's rules, `faultline object-monitor`).

A rule file is YAML, validated like a pattern pack (unknown fields are errors; every error names the file,
the rule and the field, CEL parse errors and unknown names included):

    pack: my-objects
    rules:
      - id: gpus-not-advertised
        description: the device plugin advertises fewer GPUs than the node has
        watch: {api_version: v1, kind: Node}           # any served kind; `resource:` when its plural
                                                        # is not the guessed one; namespace, label_selector,
                                                        # field_selector narrow the watch
        params: {count_label: nvidia.com/gpu.count}     # read as `params.count_label`
        when: >-                                        # CEL, a bool: the fault is open while true
          params.count_label in object.metadata.labels && ...
        for: 2m                                         # true this long before the fault opens
        since: ...                                      # CEL, a time: when the condition began (else:
                                                        # when the monitor first saw it true)
        node: object.metadata.name                      # CEL, a string: the node of the fault ('': none)
        entity: {type: POD, id: ...}                    # CEL id; default: the node itself (NODE, '')
        fault: {code: KUBE-GPUS-NOT-ADVERTISED, component: GPU, fatal: true, action: RESTART_VM}
        message: ...                                    # CEL, a string; default: description and object
        examples:
          match: [{object: {...}, now: "2026-01-01T00:00:00Z", expect: {node: n1}}]
          no_match: [{object: {...}}]
    overrides:                                          # change rules loaded before (built-in ones)
      node-not-ready: {for: 5m, params: {...}, fault: {fatal: false}, enabled: false}

Expressions read `object` (the object's JSON), `params` and `now` (`patterns.cel`). A rule's fault opens
when `when` turns true for an object (after `for`) and resolves when it turns false or the object goes
away; objects of one rule that name the same node and entity share one fault. A predicate that fails to
evaluate (a field the object lacks) is not true: write `has(object.status.x)` guards.

Files load in order, built-in first (`BUILTIN_DIR`); a rule with the id of one loaded before replaces it;
`overrides` apply after every file is loaded. Every rule's examples run at load, with the rule's own
params (an override does not make them fail).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from faultline import yamldoc
from faultline.errors import PackError
from faultline.models import Action, Component, Entity, fault_id
from patterns import cel
from patterns.schema import Code, Duration

BUILTIN_DIR = Path(__file__).parent / "objects"
NODE_ENTITY = Entity(type="NODE", id="")
MAX_MESSAGE = 500
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")

Param = str | int | float | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Watch(_Strict):
    """What the rule reads: one kind, optionally narrowed (the API server filters; the cache holds less)."""

    api_version: str = Field(min_length=1, pattern=r"^([a-z0-9.-]+/)?v[0-9]+((alpha|beta)[0-9]+)?$")
    kind: str = Field(min_length=1, pattern=r"^[A-Z][A-Za-z0-9]*$")
    resource: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9.-]*$",
                                 description="the plural; default: guessed from the kind")  # fmt: skip
    namespace: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    label_selector: str | None = None
    field_selector: str | None = None

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def plural(self) -> str:
        return self.resource or guess_resource(self.kind)


class FaultSpec(_Strict):
    code: Code = Field(pattern=r"^[A-Z0-9][A-Z0-9_.-]*$")  # and a valid taint value (63 at most, ...)
    component: Component = Component.NODE
    fatal: bool = False
    action: Action = Action.NONE
    description: str = ""


class FaultChange(_Strict):
    component: Component | None = None
    fatal: bool | None = None
    action: Action | None = None
    description: str | None = None


class EntitySpec(_Strict):
    type: str = Field(pattern=r"^[A-Z][A-Z0-9_]*$")
    id: str = Field(min_length=1, description="CEL, a string")


class Example(_Strict):
    object: dict[str, Any]
    now: dt.datetime | None = None
    expect: dict[str, Any] = Field(default_factory=dict)

    @field_validator("expect")
    @classmethod
    def _known(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - {"node", "entity", "message", "since"})
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r} (expect node, entity, message, since)")
        return value


class Examples(_Strict):
    match: list[Example] = Field(min_length=1)
    no_match: list[Example] = Field(min_length=1)


class Rule(_Strict):
    id: str = Field(pattern=_NAME.pattern)
    description: str = Field(min_length=1)
    watch: Watch
    params: dict[str, Param] = Field(default_factory=dict)
    when: str = Field(min_length=1)
    for_: Duration | None = Field(default=None, alias="for")
    since: str | None = None
    node: str = Field(min_length=1)
    entity: EntitySpec | None = None
    fault: FaultSpec
    message: str | None = None
    examples: Examples


class Override(_Strict):
    enabled: bool | None = None
    for_: Duration | None = Field(default=None, alias="for")
    params: dict[str, Param] = Field(default_factory=dict)
    fault: FaultChange | None = None


class RuleFile(_Strict):
    pack: str = Field(pattern=_NAME.pattern)
    version: int | str = 1
    description: str = ""
    rules: list[Rule] = Field(default_factory=list)
    overrides: dict[str, Override] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _something(self) -> RuleFile:
        if not self.rules and not self.overrides:
            raise ValueError("a rule file needs `rules` or `overrides`")
        return self


def guess_resource(kind: str) -> str:
    """The plural the API server's REST mapper guesses for a kind (lower case; -s -> -ses, -y -> -ies,
    else -s): right for the built-in kinds and most CRDs; a rule names `resource` where it is not."""
    lower = kind.lower()
    if lower.endswith("s"):
        return lower + "es"
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + "s"


@dataclass(frozen=True)
class Verdict:
    """A rule's reading of one object at one time: does its fault hold, on which node and entity, since
    when (None: not said), and any expression's error (`when: no such member ...`)."""

    holds: bool
    node: str = ""
    entity: Entity = NODE_ENTITY
    message: str = ""
    since: dt.datetime | None = None
    error: str | None = None


class CompiledRule:
    """A rule with its expressions compiled and its overrides applied."""

    def __init__(self, rule: Rule, file: str) -> None:
        self.spec, self.file, self.id = rule, file, rule.id
        self.watch = rule.watch
        self.fault = rule.fault
        self.for_s = rule.for_
        self.enabled = True
        self.params = dict(rule.params)
        self.overridden_by: list[str] = []
        self.exprs: dict[str, cel.Expression] = {}
        sources = {"when": rule.when, "node": rule.node, "since": rule.since, "message": rule.message,
                   "entity.id": rule.entity.id if rule.entity else None}  # fmt: skip
        for name, source in sources.items():
            if source is not None:
                try:
                    self.exprs[name] = cel.Expression(source)
                except cel.CelError as exc:
                    raise PackError(file, f"rule {rule.id!r}: {name}: {exc}") from exc
        # re-read as time passes: the predicate and what names the fault (the message may say `now`)
        self.uses_now = any(self.exprs[n].uses_now for n in ("when", "node", "entity.id") if n in self.exprs)
        self._params = cel.value(self.params)

    def override(self, change: Override, file: str) -> None:
        unknown = sorted(set(change.params) - set(self.params))
        if unknown:
            raise PackError(file, f"overrides: rule {self.id!r}: params: unknown param {unknown[0]!r} "
                            f"(the rule has {', '.join(sorted(self.params)) or 'none'})")  # fmt: skip
        if change.enabled is not None:
            self.enabled = change.enabled
        if change.for_ is not None:
            self.for_s = change.for_
        if change.fault is not None:
            self.fault = self.fault.model_copy(update=change.fault.model_dump(exclude_none=True))
        self.params.update(change.params)
        self._params = cel.value(self.params)
        self.overridden_by.append(file)

    def evaluate(self, obj: cel.Value, now: dt.datetime, *, params: cel.Value | None = None) -> Verdict:
        """The rule on one object (as CEL values, `cel.value(doc)`) at `now`."""
        activation = {"object": obj, "params": self._params if params is None else params,
                      "now": cel.timestamp(now)}  # fmt: skip
        try:
            if not cel.as_bool(self.exprs["when"].evaluate(activation)):
                return Verdict(False)
        except cel.CelError as exc:
            return Verdict(False, error=f"when: {exc}")
        try:
            node = cel.as_str(self.exprs["node"].evaluate(activation))
        except cel.CelError as exc:
            return Verdict(False, error=f"node: {exc}")
        if not node:
            return Verdict(False)
        entity = NODE_ENTITY
        if self.spec.entity is not None:
            try:
                entity_id = cel.as_str(self.exprs["entity.id"].evaluate(activation))
            except cel.CelError as exc:
                return Verdict(False, error=f"entity.id: {exc}")
            entity = Entity(type=self.spec.entity.type, id=entity_id)
        error = None
        since = None
        if "since" in self.exprs:
            try:
                since = cel.as_time(self.exprs["since"].evaluate(activation))
            except cel.CelError as exc:
                error = f"since: {exc}"
        message = ""
        if "message" in self.exprs:
            try:
                message = cel.as_str(self.exprs["message"].evaluate(activation))
            except cel.CelError as exc:
                error = f"message: {exc}"
        if not message:
            message = f"{self.fault.description or self.spec.description}: {describe(obj)}"
        return Verdict(True, node, entity, message[:MAX_MESSAGE], since, error)

    def fault_id(self, verdict: Verdict) -> str:
        return fault_id(verdict.node, verdict.entity.type, verdict.entity.id, self.fault.code)


def describe(obj: Any) -> str:
    """`Pod ns/name` or `Node name`, from an object's own fields (JSON or CEL values, whose maps raise
    KeyError from `get`)."""
    meta = obj["metadata"] if "metadata" in obj else {}  # noqa: SIM401 - CEL maps' get raises
    kind = str(obj["kind"]) if "kind" in obj else "object"
    name = str(meta["name"]) if "name" in meta else "?"
    return f"{kind} {meta['namespace']}/{name}" if "namespace" in meta else f"{kind} {name}"


@dataclass
class RuleSet:
    """Every loaded rule by id, in load order, and the files read."""

    rules: dict[str, CompiledRule] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    def enabled(self) -> list[CompiledRule]:
        return [r for r in self.rules.values() if r.enabled]


def rule_files(path: Path) -> list[Path]:
    if not path.exists():
        raise PackError(str(path), "rule file or directory does not exist")
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def read_file(path: Path) -> RuleFile:
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PackError(name, f"cannot read: {exc}") from exc
    return parse(text, name)


def parse(text: str, name: str) -> RuleFile:
    """One rule file's text; every problem a PackError naming `name`, the rule and the field."""
    try:
        raw = yamldoc.parse(text)
    except yamldoc.YamlError as exc:
        raise PackError(name, str(exc)) from exc
    if not isinstance(raw, dict):
        raise PackError(name, "a rule file must be a YAML mapping with `pack` and `rules`")
    try:
        return RuleFile.model_validate(raw)
    except ValidationError as exc:
        raise PackError(name, _describe(raw, exc.errors()[0])) from exc


def _describe(raw: dict[str, Any], err: Any) -> str:
    loc = [str(p) for p in err["loc"]]
    msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
    prefix = ""
    if len(loc) >= 2 and loc[0] == "rules" and loc[1].isdigit():
        index = int(loc[1])
        rules = raw.get("rules")
        found = rules[index] if isinstance(rules, list) and index < len(rules) else None
        rule_id = found.get("id") if isinstance(found, dict) else None
        prefix = f"rule {str(rule_id) if rule_id else f'#{index + 1}'!r}: "
        loc = loc[2:]
    loc = [p for p in loc if p not in ("str", "int", "float", "bool") and "[" not in p]
    where = ".".join("for" if p == "for_" else p for p in loc)
    return f"{prefix}{where}: {msg}" if where else f"{prefix}{msg}"


def load(paths: Iterable[Path] = (), *, builtin: bool = True, check_examples: bool = True) -> RuleSet:
    """The built-in rules (unless `builtin=False`), then every file or directory in `paths`, in order;
    then the overrides. With `check_examples` the first failing example raises (as at the monitor's
    start); `faultline patterns test` runs them all instead."""
    rules = RuleSet()
    overrides: list[tuple[str, dict[str, Override]]] = []
    for directory in ([BUILTIN_DIR] if builtin else []) + list(paths):
        for path in rule_files(Path(directory)):
            parsed = read_file(path)
            name = str(path)
            rules.files.append(name)
            seen: set[str] = set()
            for rule in parsed.rules:
                if rule.id in seen:
                    raise PackError(name, f"rule {rule.id!r}: duplicate rule id in one file")
                seen.add(rule.id)
                rules.rules[rule.id] = CompiledRule(rule, name)
            if parsed.overrides:
                overrides.append((name, parsed.overrides))
    if check_examples:
        from patterns import object_examples  # noqa: PLC0415 - it imports this module

        failures = object_examples.run(rules)
        if failures:
            raise PackError(failures[0].file, f"rule {failures[0].rule_id!r}: {failures[0].reason}")
    for name, changes in overrides:
        for rule_id, change in changes.items():
            if rule_id not in rules.rules:
                raise PackError(name, f"overrides: no rule {rule_id!r} is loaded before these overrides")
            rules.rules[rule_id].override(change, name)
    return rules
