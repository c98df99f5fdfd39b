"""Command-line options generated from a component's settings model: one `--<field>` per field (help from
the field's description, the environment names and the default), plus `--config FILE`. The command body
receives the resolved, validated model (`cli.settings.resolve`), never the raw options."""

from __future__ import annotations

import datetime as dt
import inspect
import logging
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from cli import settings
from cli.flags import base_type, flags_given, format_value, summary
from faultline import config
from faultline.config import Component

C = TypeVar("C", bound=Component)
log = logging.getLogger(__name__)

CONFIG_HELP = "YAML file of settings (field: value); the environment and flags override it."


def _is_duration(info: FieldInfo) -> bool:
    """A `Duration` (a timedelta) or `Seconds` (float seconds written as a duration), also optional."""
    inner = [m for a in typing.get_args(info.annotation) for m in getattr(a, "__metadata__", ())]
    return base_type(info.annotation) is dt.timedelta or any(
        getattr(m, "func", None) is config.parse_seconds for m in [*info.metadata, *inner]
    )


def metavar(info: FieldInfo) -> str:
    base = base_type(info.annotation)
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


def _help(model: type[Component], name: str, info: FieldInfo) -> str:
    text = (info.description or name).rstrip(".")
    text = text[:1].upper() + text[1:]
    envs = ", ".join(settings.env_names(model, name, info))
    default = ""
    if not info.is_required():
        default = f" Default: {format_value(info.get_default(call_default_factory=True))}."
    return f"{text}.{default} Env: {envs}."


def _parameter(model: type[Component], name: str, info: FieldInfo) -> inspect.Parameter:
    base = base_type(info.annotation)
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
