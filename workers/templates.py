"""An external remediator's CR template (pure): loaded and checked once, rendered for each repair.

The template is one Kubernetes object in YAML whose strings may name the repair's fields as `${field}`:

    name       the request's name (also metadata.name when the template sets none)
    node       the Node to repair
    action     the step decided: GPU_RESET, REBOOT or REPLACE
    gpus       the affected GPUs' PCI bus ids; as a whole string value it becomes a list
    faultKeys  the open faults' keys; as a whole string value it becomes a list
    reason     why this step (escalation, repeat offender, the fault's action)

Every object gets the label `faultline.io/node`. An unknown field, a missing apiVersion or kind, or YAML
that is not one mapping is a ConfigError naming the file and the place.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from faultline import yamldoc
from faultline.errors import ConfigError

FIELDS = ("name", "node", "action", "gpus", "faultKeys", "reason")
_REF = re.compile(r"\$\{([^}]*)\}")
_WHOLE = re.compile(r"^\$\{(gpus|faultKeys)\}$")


def load(path: Path) -> dict[str, Any]:
    where = str(path)
    try:
        body = yamldoc.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yamldoc.YamlError) as exc:
        raise ConfigError(f"{where}: cannot read the template: {exc}") from exc
    if not isinstance(body, dict):
        raise ConfigError(
            f"{where}: a template is one Kubernetes object (a mapping), not {type(body).__name__}"
        )
    for key in ("apiVersion", "kind"):
        if not isinstance(body.get(key), str) or not body[key]:
            raise ConfigError(f"{where}: {key} is missing")
    if "/" not in body["apiVersion"]:
        raise ConfigError(f"{where}: apiVersion {body['apiVersion']!r} has no API group (group/version)")
    meta = body.get("metadata", {})
    if not isinstance(meta, dict):
        raise ConfigError(f"{where}: metadata must be a mapping")
    if not isinstance(meta.get("labels") or {}, dict):  # render adds faultline.io/node to them
        raise ConfigError(f"{where}: metadata.labels must be a mapping")
    if "name" in meta and not (isinstance(meta["name"], str) and meta["name"]):
        raise ConfigError(f"{where}: metadata.name must be a string (or absent: the request's name)")
    _check(body, where, "")
    return body


def _check(value: Any, where: str, at: str) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _check(v, where, f"{at}.{k}" if at else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check(v, where, f"{at}[{i}]")
    elif isinstance(value, str):
        for ref in _REF.findall(value):
            if ref not in FIELDS:
                raise ConfigError(f"{where}: {at}: unknown field ${{{ref}}} (known: {', '.join(FIELDS)})")


def render(template: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The template with every `${field}` replaced; lists stay lists where a value is only `${gpus}` or
    `${faultKeys}`, and are joined with commas inside longer strings."""

    def sub(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: sub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [sub(v) for v in value]
        if isinstance(value, str):
            if m := _WHOLE.match(value):
                return list(values[m[1]])
            return _REF.sub(lambda m: _text(values[m[1]]), value)
        return value

    out: dict[str, Any] = sub(template)
    meta = out.setdefault("metadata", {})
    meta.setdefault("name", values["name"])
    meta["labels"] = {**(meta.get("labels") or {}), "faultline.io/node": values["node"]}
    return out


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
