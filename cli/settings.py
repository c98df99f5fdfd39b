"""Resolving a component's settings: defaults < config file < environment < flags, with where each value
came from. The file and the environment are read with pydantic-settings' own sources (YAML, and env names
from the model: `FAULTLINE_<FIELD>` or a field's aliases); the merged values are validated once, so a bad
value is reported with its field and its source whichever source it came from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource, YamlConfigSettingsSource

from faultline.config import Component, Flag
from faultline.errors import ConfigError

DEFAULT = "default"


@dataclass(frozen=True)
class Resolved:
    config: Component
    sources: dict[str, str]  # field -> "default", "file PATH", "env NAME" or "flag --NAME"


def flag_name(name: str, info: FieldInfo) -> str:
    """The command-line flag of a field: `--<field-with-dashes>` unless it carries a `Flag`."""
    custom = next((m for m in info.metadata if isinstance(m, Flag)), None)
    return custom.name if custom else "--" + name.replace("_", "-")


def env_names(model: type[Component], name: str, info: FieldInfo) -> list[str]:
    """The environment variables a field is read from, in the order they win."""
    if isinstance(info.validation_alias, AliasChoices):
        return [str(c).upper() for c in info.validation_alias.choices]
    return [f"{model.model_config.get('env_prefix', '')}{name}".upper()]


def _canonical(model: type[Component], values: Mapping[str, Any]) -> dict[str, Any]:
    """Keys as field names (a source may key a value by the alias it matched)."""
    names = {}
    for name, info in model.model_fields.items():
        names[name] = name
        if isinstance(info.validation_alias, AliasChoices):
            for choice in info.validation_alias.choices:
                names[str(choice).lower()] = name
    return {names.get(k.lower(), k): v for k, v in values.items()}


def file_values(model: type[Component], path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path}: not found")
    try:
        loaded = YamlConfigSettingsSource(model, yaml_file=path)()
    except Exception as exc:  # yaml's errors name the line; pass them on as configuration errors
        raise ConfigError(f"config file {path}: {exc}") from exc
    if named := next((k for k in loaded if not isinstance(k, str)), None):
        raise ConfigError(f"config file {path}: a setting's name is a string, not {named!r}")
    raw = _canonical(model, loaded)  # keyed by alias
    for key in raw:
        if key not in model.model_fields:
            raise ConfigError(f"config file {path}: unknown setting {key!r} for {_component(model)}")
    return dict(raw)


def env_values(
    model: type[Component], environ: Mapping[str, str] | None = None
) -> dict[str, tuple[Any, str]]:
    """Values the environment sets, each with the variable it came from."""
    environ = os.environ if environ is None else environ
    source = EnvSettingsSource(model)
    if environ is not os.environ:
        source.env_vars = {k.lower(): v for k, v in environ.items()}
    try:
        values = _canonical(model, source())
    except Exception as exc:  # e.g. a list-valued variable that is not JSON
        raise ConfigError(f"environment: {exc}") from exc
    upper = {k.upper(): k for k in environ}
    found = {}
    for name, value in values.items():
        var = next(v for v in env_names(model, name, model.model_fields[name]) if v in upper)
        found[name] = (value, upper[var])
    return found


def resolve(
    model: type[Component], *, config_file: Path | None = None, flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Resolved:  # fmt: skip
    """The component's settings from its defaults, then the file, the environment and the flags given
    (flags: field name -> value, only those given on the command line)."""
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if config_file is not None:
        for name, value in file_values(model, config_file).items():
            merged[name], sources[name] = value, f"file {config_file}"
    for name, (value, var) in env_values(model, environ).items():
        merged[name], sources[name] = value, f"env {var}"
    for name, value in (flags or {}).items():
        merged[name], sources[name] = value, f"flag {flag_name(name, model.model_fields[name])}"
    try:
        config = model(**merged)
    except ValidationError as exc:
        raise ConfigError(_explain(model, exc, sources)) from None
    return Resolved(config, {name: sources.get(name, DEFAULT) for name in model.model_fields})


def _component(model: type[Component]) -> str:
    name = " ".join((model.__doc__ or model.__name__).split())  # one line, however the docstring wraps
    return name.split("(", 1)[0].strip().removeprefix("The ").rstrip(".")


def _explain(model: type[Component], exc: ValidationError, sources: Mapping[str, str]) -> str:
    """One line per bad setting: the field, what is wrong and where the value came from."""
    lines = []
    for error in exc.errors(include_url=False):
        key = str(error["loc"][0]) if error["loc"] else ""
        name = next(iter(_canonical(model, {key: None})))
        message = error["msg"].removeprefix("Value error, ")
        if name in model.model_fields:
            info = model.model_fields[name]
            unset = f"not set: give {flag_name(name, info)} or {env_names(model, name, info)[0]}"
            where = sources.get(name) or unset
            secret = info.annotation is SecretStr
            given = f" (got {error['input']!r})" if name in sources and not secret else ""
            lines.append(f"{name}: {message}{given} [{where}]")
        else:  # a check across fields
            lines.append(message)
    return f"invalid {_component(model)} settings:\n  " + "\n  ".join(lines)
