"""Command-line options generated from a component's settings model: one `--<field>` per field (help from
the field's description, the environment names and the default), plus `--config FILE`. The command body
receives the resolved, validated model (`cli.settings.resolve`), never the raw options."""

from __future__ import annotations

import datetime as dt
import inspect
import json
import logging
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from cli import settings
from faultline import config
from faultline.config import Component
from faultline.errors import ConfigError

C = TypeVar("C", bound=Component)
log = logging.getLogger(__name__)

CONFIG_HELP = "YAML file of settings (field: value); the environment and flags override it."


def _base(annotation: Any) -> Any:
    """`X | None` -> X; `Annotated[X, ...]` -> X."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, type(int | None)) and len(args) == 1:
        return _base(args[0])
    return annotation


def _is_duration(info: FieldInfo) -> bool:
    """A `Duration` (a timedelta) or `Seconds` (float seconds written as a duration), also optional."""
    inner = [m for a in typing.get_args(info.annotation) for m in getattr(a, "__metadata__", ())]
    return _base(info.annotation) is dt.timedelta or any(
        getattr(m, "func", None) is config.parse_seconds for m in [*info.metadata, *inner]
    )


def metavar(info: FieldInfo) -> str:
    base = _base(info.annotation)
    if _is_duration(info):
        return "DURATION"
    if typing.get_origin(base) is Literal:
        return "[" + "|".join(str(a) for a in typing.get_args(base)) + "]"
    if base is SecretStr:
        return "SECRET"
    if typing.get_origin(base) is dict:
        return "JSON"
    names = {int: "INT", float: "NUMBER", Path: "PATH", str: "TEXT"}
    if typing.get_origin(base) is tuple:
        return names.get(typing.get_args(base)[0], "TEXT")
    return names.get(base, "TEXT")


def format_value(value: Any) -> str:
    """A value as a person writes it in a file or a flag (durations as 30s/10m/7d, secrets masked)."""
    if isinstance(value, dt.timedelta):
        return format_duration(value.total_seconds())
    if isinstance(value, SecretStr):
        return str(value)  # pydantic's mask
    if isinstance(value, tuple | list | dict):  # a part's model inside (anomaly_fields) as its fields
        return json.dumps(value, default=lambda v: v.model_dump() if isinstance(v, BaseModel) else str(v))
    if value is None:
        return "-"
    return str(value)


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds * 1000)}ms" if seconds < 1 and (seconds * 1000) % 1 == 0 else f"{seconds:g}s"


def _help(model: type[Component], name: str, info: FieldInfo) -> str:
    text = (info.description or name).rstrip(".")
    text = text[:1].upper() + text[1:]
    envs = ", ".join(settings.env_names(model, name, info))
    default = ""
    if not info.is_required():
        default = f" Default: {format_value(info.get_default(call_default_factory=True))}."
    return f"{text}.{default} Env: {envs}."


def _parameter(model: type[Component], name: str, info: FieldInfo) -> inspect.Parameter:
    base = _base(info.annotation)
    flag = settings.flag_name(name, info)
    option: Any
    if base is bool:
        annotation: Any = bool | None
        option = typer.Option(f"{flag}/--no-{flag[2:]}", help=_help(model, name, info), show_default=False)
    elif typing.get_origin(base) is tuple:
        annotation = list[str] | None
        option = typer.Option(flag, help=_help(model, name, info) + " (repeatable)", metavar=metavar(info),
                              show_default=False)  # fmt: skip
    else:
        annotation = str | None
        option = typer.Option(flag, help=_help(model, name, info), metavar=metavar(info), show_default=False)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[annotation, option])  # fmt: skip


def flags_given(model: type[Component], values: dict[str, Any]) -> dict[str, Any]:
    """The options given on the command line (typer passes None, or [] for repeatables, for the others)."""
    given = {}
    for name, value in values.items():
        if value is None or value == []:
            continue
        if typing.get_origin(_base(model.model_fields[name].annotation)) is dict:
            try:
                given[name] = json.loads(value)
            except ValueError as exc:
                flag = settings.flag_name(name, model.model_fields[name])
                raise ConfigError(f"{name}: not JSON: {value!r} [flag {flag}]") from exc
        else:
            given[name] = value
    return given


def parameters(model: type[Component]) -> list[inspect.Parameter]:
    """`--config` and one option per field of the model."""
    file_option = inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[Path | None, typer.Option("--config", help=CONFIG_HELP,
                                                                               metavar="FILE")])  # fmt: skip
    return [file_option, *(_parameter(model, n, i) for n, i in model.model_fields.items())]


def resolved(model: type[C], values: dict[str, Any]) -> settings.Resolved:
    config_file = values.pop("config", None)
    return settings.resolve(model, config_file=config_file, flags=flags_given(model, values))


def register(
    group: typer.Typer, name: str, model: type[C], body: Callable[..., None], help_text: str | None = None,
    extra: tuple[inspect.Parameter, ...] = (),
) -> None:  # fmt: skip
    """Register `name` in `group` with options generated from `model` (and `extra` options of the command's
    own); `body(resolved, **extra_values)` gets the resolved settings."""

    def callback(**values: Any) -> None:
        own = {p.name: values.pop(p.name) for p in extra}
        config_file = values.pop("config", None)
        body(settings.resolve(model, config_file=config_file, flags=flags_given(model, values)), **own)

    callback.__signature__ = inspect.Signature([*parameters(model), *extra])  # type: ignore[attr-defined]
    callback.__doc__ = help_text
    group.command(name)(callback)


def summary(resolved: settings.Resolved) -> dict[str, Any]:
    """For the start-up log line: the settings that are not defaults (secrets masked) and their sources."""
    given = {n: src for n, src in resolved.sources.items() if src != settings.DEFAULT}
    values = {n: format_value(getattr(resolved.config, n)) for n in given}
    return {"settings": values, "sources": given}


Body = Callable[[C], None]


def command(group: typer.Typer, name: str, model: type[C]) -> Callable[[Body[C]], Body[C]]:
    """Register `body(config)` as `name` in `group`, with options generated from `model`; the body's
    docstring is the command's help."""

    def decorate(body: Body[C]) -> Body[C]:
        def run(resolved: settings.Resolved) -> None:
            log.debug("settings", extra={"component": name, **summary(resolved)})
            body(typing.cast(C, resolved.config))

        register(group, name, model, run, body.__doc__)
        return body

    return decorate
