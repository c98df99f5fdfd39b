"""The pattern pack schema (ARCHITECTURE §4): what a pack YAML file may say, validated by pydantic.

Unknown fields are errors everywhere, so a typo in a user pack fails at load instead of being ignored.
Durations are written `90s`, `10m`, `24h`, `7d` or as a number of seconds.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from faultline import models
from faultline.models import Action, Component
from patterns.templates import Template

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
LogSource = Literal["syslog", "journal", "kmsg", "nvml", "dcgm", "nic", "grpc"]
LOG_SOURCES: tuple[LogSource, ...] = ("syslog", "journal", "kmsg")


def parse_duration(value: object) -> float:
    """`"10m"` -> 600.0. Accepts numbers (seconds) and strings with a ms/s/m/h/d unit."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value) if isinstance(value, float) or abs(value) < 2**1000 else math.inf
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise ValueError(f"not a duration: {value!r} (write e.g. 30s, 10m, 24h)")
    if not math.isfinite(seconds):  # .nan would pass every window check below, .inf never end one
        raise ValueError(f"not a duration: {value!r} (a finite number of seconds)")
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {value!r}")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _offset(value: object) -> float:
    return 0.0 if value in (0, "0", "0s") else parse_duration(value)


Offset = Annotated[float, BeforeValidator(_offset)]
"""A duration that may be zero (when a cluster example's record happens)."""


def _code(value: str) -> str:
    """A fault code (template) that renders a valid taint value: its fields stand in as `0` here, so the
    literal parts and their length are checked at load."""
    if value:
        try:
            template = Template(value)
        except ValueError:
            return value  # the compiler names a bad template
        rendered = template.render(dict.fromkeys(template.fields, "0")) if template.fields else value
        if models.code_problem(rendered or value) is not None:
            fields = f" (as {rendered!r}, each field taken as 0)" if template.fields else ""
            raise ValueError(
                f"code {value[:80]!r}{fields} is not a valid taint value: {models.FAULT_CODE_RULE}"
            )
    return value


Code = Annotated[str, AfterValidator(_code)]
"""A fault code or code template: what it renders must be a valid taint value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Classification(_Strict):
    """Fields a classification step may set. Unset fields keep what earlier steps decided."""

    fatal: bool | None = None
    action: Action | None = None
    component: Component | None = None
    description: str | None = None
    cause: str | None = None
    recommendation: str | None = None
    name: str | None = None
    escalate: Escalate | None = None
    ignore: bool | None = Field(default=None, description="true: matching lines produce nothing")


class SetStep(_Strict):
    set: Classification


class TableStep(_Strict):
    table: str
    key: str = Field(description="template for the row key, e.g. '{xid}'; skipped when a group is missing")
    required: bool = Field(default=False, description="fail the match when the key is not in the table")


ClassifyStep = SetStep | TableStep


class EntitySpec(_Strict):
    type: str
    id: str = Field(description="template, e.g. '{pci|bus}'")
    fallback: list[str] = Field(
        default_factory=list,
        description="templates tried in order when `id` names a group the match did not take part in (a "
        "line that names the device another way, e.g. by its RDMA device when the PCI address is missing)",
    )

    @field_validator("fallback", mode="before")
    @classmethod
    def _one_or_more(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value


class Escalate(_Strict):
    """count >= N within T on the same fault key makes the fault fatal with `action`."""

    count: int = Field(ge=2)
    within: Duration
    fatal: bool = True
    action: Action = Action.COMPONENT_RESET


class Threshold(_Strict):
    """No fault until `count` matches within `within` on the same key; then one fault carrying them all.
    With `amount`, each match counts the number it carries (a rate rule: e.g. a counter's increase)."""

    count: int = Field(ge=2)
    within: Duration
    amount: str | None = Field(
        default=None,
        description="template of a number in the match, e.g. '{n}': the window sums it instead of counting "
        "matches (symbol errors +40 counts 40)",
    )


class Flapping(_Strict):
    """`count` down/up cycles (this fault opened, then cleared) within `within` open a flapping fault."""

    count: int = Field(ge=2)
    within: Duration
    code: Code
    fatal: bool = True
    action: Action = Action.CONTACT_SUPPORT
    description: str = ""


class Then(_Strict):
    """A-then-B: a fault of this pattern (codes matching `first`) followed by one of `codes` on the same
    entity within `within` opens the fault `code`."""

    first: list[str] = Field(default_factory=lambda: ["*"])
    codes: list[str] = Field(min_length=1)
    within: Duration
    code: Code
    fatal: bool = True
    action: Action = Action.COMPONENT_RESET
    description: str = ""


class Clears(_Strict):
    """Cancellation: this match resolves earlier open faults (by code glob and/or action)."""

    codes: list[str] = Field(default_factory=lambda: ["*"])
    actions: list[Action] | None = None
    scope: Literal["entity", "node"] = "entity"
    same_code: bool = Field(
        default=False, description="only the fault whose code is this match's own rendered code"
    )


class SuppressedBy(_Strict):
    """Drop this match when one of `codes` was seen on the same entity within `within` (either side)."""

    codes: list[str] = Field(min_length=1)
    within: Duration


class Record(_Strict):
    """The pattern matches a record the driver writes over several log lines (each line its own syslog
    line or journal entry): a line holding one of `start` opens it, and the lines that follow on the same
    node and source within `within`, beginning with the first line's driver prefix (`NVRM: `), continue
    it, up to `lines` lines. The pattern's regex runs on the joined record (prefixes dropped, one space
    between lines), never on its lines alone. Records the kernel itself marks as one (dmesg's indented
    lines, kmsg's escaped newlines, a journal message with newlines) are joined for every pattern."""

    start: list[str] = Field(min_length=1, description="literals the record's first line holds")
    lines: int = Field(default=4, ge=2, le=16)
    within: Duration = 2.0

    @field_validator("start")
    @classmethod
    def _long_enough(cls, value: list[str]) -> list[str]:
        if any(len(v) < 3 for v in value):
            raise ValueError("record start literals must be at least 3 characters")
        return value


class ExpectedMatch(_Strict):
    line: str
    expect: dict[str, Any] = Field(default_factory=dict)


class Examples(_Strict):
    match: list[ExpectedMatch | str] = Field(min_length=1)
    no_match: list[str] = Field(min_length=1)


class Pattern(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    description: str
    scope: Literal["node"] = Field(default="node", description="node: the agent runs it; see ClusterPattern")
    kind: Literal["fault", "clear", "boot"] = "fault"
    sources: list[LogSource] = Field(default_factory=lambda: list(LOG_SOURCES))
    origin: Literal["kernel", "any"] = Field(
        default="kernel",
        description="kernel: only lines the kernel wrote match (not a syslog tag, app-name, journal "
        "transport or identifier of user space); any: lines from any writer (user-space messages)",
    )
    record: Record | None = None
    regex: str
    ignore_case: bool = False
    prefilter: list[str] | None = Field(
        default=None, description="literals one of which every matching line contains; derived if omitted"
    )
    code: Code = ""
    component: Component = Component.NODE
    entity: EntitySpec | None = None
    classify: list[ClassifyStep] = Field(default_factory=list)
    message: str | None = None
    boot_grace: Duration | None = None
    threshold: Threshold | None = None
    escalate: Escalate | None = None
    flapping: Flapping | None = None
    then: Then | None = None
    clears: Clears | None = None
    suppressed_by: SuppressedBy | None = None
    examples: Examples

    @model_validator(mode="after")
    def _kind_fields(self) -> Pattern:
        if self.kind == "fault" and not self.code:
            raise ValueError("a fault pattern needs a `code` template")
        if self.kind == "clear" and self.clears is None:
            raise ValueError("a clear pattern needs `clears`")
        if self.threshold and self.escalate:
            raise ValueError("`threshold` and `escalate` exclude each other")
        return self

    @field_validator("prefilter")
    @classmethod
    def _prefilter_literals(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("prefilter needs at least one literal")
            short = [v for v in value if len(v) < 3]
            if short:
                raise ValueError(f"prefilter literals must be at least 3 characters: {short}")
        return value


# -- cluster scope: patterns the analyzer runs over every node's events (`patterns.cluster`) ------------

# Fields a cluster pattern's window key and fault templates may name (see `patterns.cluster.field_value`);
# `label:<node label>` and `metadata:<event metadata key>` name any other, under an alias (`zone=label:...`).
CLUSTER_FIELDS = (
    "node", "code", "component", "entity", "entity_id", "gpu", "gpu_uuid", "gpu_serial", "nvlink_domain",
    "job", "episode",
)  # fmt: skip
_KEY_ALIAS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def key_field(spec: str) -> tuple[str, str]:
    """`gpu` -> ("gpu", "gpu"); `zone=label:topology.kubernetes.io/zone` -> ("zone", "label:..."): a
    window key entry as (the name templates use, where its value comes from)."""
    name, _, source = spec.partition("=")
    name, source = name.strip(), source.strip() or name.strip()
    if not _KEY_ALIAS.match(name):
        raise ValueError(f"{spec!r}: a key's name is a word (e.g. zone=label:topology.kubernetes.io/zone)")
    if source.startswith(("label:", "metadata:")):
        if not source.partition(":")[2]:
            raise ValueError(f"{spec!r}: name the label or metadata key after the colon")
    elif source not in CLUSTER_FIELDS:
        raise ValueError(
            f"{spec!r}: unknown field (one of {', '.join(CLUSTER_FIELDS)}, label:<name>, metadata:<key>)"
        )
    return name, source


class ClusterMatch(_Strict):
    """Which of the feed's records a cluster pattern counts (every condition must hold)."""

    records: Literal["events", "faults"] = Field(
        default="events", description="health events, or fault changes (each new revision of a fault)"
    )
    codes: list[str] = Field(default_factory=lambda: ["*"], min_length=1, description="code globs")
    components: list[Component] | None = None
    healthy: bool | None = Field(default=False, description="events: only unhealthy ones by default")
    fatal: bool | None = None
    states: list[Literal["open", "resolved"]] | None = Field(default=None, description="faults' states")
    labels: dict[str, str] = Field(default_factory=dict, description="node labels (value globs)")


class ClusterWindow(_Strict):
    """A sliding window over event time per key: the pattern fires once `count` records (or `count`
    distinct values of `distinct`) fall within `within` of the newest."""

    key: list[str] = Field(min_length=1, description="fields whose values key the window")
    within: Duration
    count: int = Field(default=1, ge=1)
    distinct: str | None = Field(default=None, description="count distinct values of this field instead")

    @field_validator("key")
    @classmethod
    def _fields(cls, value: list[str]) -> list[str]:
        names = [key_field(v)[0] for v in value]
        if len(set(names)) != len(names):
            raise ValueError(f"a key names a field twice: {names}")
        return value

    @field_validator("distinct")
    @classmethod
    def _distinct_field(cls, value: str | None) -> str | None:
        if value is not None:
            key_field(value)
        return value


class ClusterSuppress(_Strict):
    """Faults of these codes on the derived fault's nodes that the quarantine worker leaves alone while
    their last sighting is within `for` of the derived fault's window (`workers.suppression`)."""

    codes: list[str] = Field(min_length=1, description="code globs, e.g. the application XIDs")
    for_: Duration = Field(alias="for", description="how long before and after the window it holds")


class ClusterFault(_Strict):
    """The derived fault, written to `faults` like any other (one per node: `nodes`)."""

    code: Code = Field(min_length=1, description="template over the key's fields, e.g. 'GPU-REPEAT-{code}'")
    component: Component = Component.NODE
    entity: EntitySpec | None = Field(default=None, description="default: {type: NODE, id: '{node}'}")
    fatal: bool = False
    action: Action = Action.NONE
    description: str = ""
    nodes: Literal["trigger", "every"] = Field(
        default="trigger",
        description="the nodes given the fault: trigger, the node of the record that made the pattern "
        "fire; every, each node with a record in the window",
    )
    suppresses: ClusterSuppress | None = Field(
        default=None, description="faults on its nodes that must not quarantine them while it holds"
    )


class ClusterRecord(_Strict):
    """One record of a cluster example: an event (or fault change) `at` after the example's start."""

    at: Offset = 0.0
    node: str
    code: str
    component: Component = Component.GPU
    entity: str = Field(default="", description="type:id, e.g. GPU:0000:3b:00")
    healthy: bool = False
    fatal: bool = False
    state: Literal["open", "resolved"] = "open"
    opened: Offset | None = Field(default=None, description="fault changes: when first seen (default `at`)")
    metadata: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict, description="its node's labels")


class ClusterExample(_Strict):
    records: list[ClusterRecord] = Field(min_length=1)
    expect: dict[str, Any] = Field(
        default_factory=dict, description="code, nodes (those given the fault), entity_id, count"
    )


class ClusterExamples(_Strict):
    match: list[ClusterExample] = Field(min_length=1)
    no_match: list[ClusterExample] = Field(min_length=1)


class ClusterPattern(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    description: str
    scope: Literal["cluster"]
    match: ClusterMatch = Field(default_factory=ClusterMatch)
    window: ClusterWindow
    fault: ClusterFault
    examples: ClusterExamples

    @model_validator(mode="after")
    def _templates(self) -> ClusterPattern:
        names = {key_field(k)[0] for k in self.window.key} | {"key", "node"}  # node: the fault's own
        spec = self.fault.entity
        for what, template in (("fault.code", self.fault.code),
                               ("fault.entity.id", spec.id if spec else "{node}")):  # fmt: skip
            unknown = set(Template(template).fields) - names
            if unknown:
                raise ValueError(
                    f"{what} {template!r} names {sorted(unknown)}, not in the window key {sorted(names)}"
                )
        return self


class Pack(_Strict):
    pack: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    version: int | str = 1
    description: str = ""
    tables: dict[str, dict[str, Classification]] = Field(default_factory=dict)
    patterns: list[Pattern] = Field(default_factory=list)
    cluster_patterns: list[ClusterPattern] = Field(
        default_factory=list, description="the patterns of `scope: cluster`, set from `patterns`"
    )

    @model_validator(mode="before")
    @classmethod
    def _scopes(cls, value: object) -> object:
        # one `patterns` list in the file; the node agent's and the analyzer's patterns apart here
        if isinstance(value, dict) and isinstance(value.get("patterns"), list):
            if "cluster_patterns" in value:
                raise ValueError("cluster_patterns: unknown field (give cluster patterns `scope: cluster`)")
            items = value["patterns"]
            cluster = [p for p in items if isinstance(p, dict) and p.get("scope") == "cluster"]
            node = [p for p in items if not (isinstance(p, dict) and p.get("scope") == "cluster")]
            return {**value, "patterns": node, "cluster_patterns": cluster}
        return value

    @field_validator("tables", mode="before")
    @classmethod
    def _string_keys(cls, value: object) -> object:
        # YAML turns `79:` into an int; table keys are looked up by rendered template strings.
        if isinstance(value, dict):
            return {
                name: {str(k): v for k, v in rows.items()} if isinstance(rows, dict) else rows
                for name, rows in value.items()
            }
        return value


Classification.model_rebuild()
