"""A component's command-line flags without the CLI framework: what `cli.options` generates for typer, read
here from the same settings model, for the one command that runs on every GPU node.

`faultline agent` starts from here (`cli.main`): typer, click and rich (the help screens, the tables) are
3.5 MiB of an agent's resident memory that it never uses while it runs. The flags are the same ones with
the same meaning: `--<field>` (or the field's `Flag`), `--<field> VALUE` or `--<field>=VALUE`, `--x` /
`--no-x` for a yes/no setting, a tuple's flag repeated, and `--config FILE`. `--help` goes to the full
command line, which prints the help.
"""

from __future__ import annotations

import datetime as dt
import json
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, SecretStr

from cli import settings
from faultline.config import Component
from faultline.errors import ConfigError

CONFIG_FLAG = "--config"


def base_type(annotation: Any) -> Any:
    """`X | None` -> X; `Annotated[X, ...]` -> X."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, type(int | None)) and len(args) == 1:
        return base_type(args[0])
    return annotation


def flags_given(model: type[Component], values: dict[str, Any]) -> dict[str, Any]:
    """The options given on the command line (typer passes None, or [] for repeatables, for the others)."""
    given = {}
    for name, value in values.items():
        if value is None or value == []:
            continue
        if typing.get_origin(base_type(model.model_fields[name].annotation)) is dict:
            try:
                given[name] = json.loads(value)
            except ValueError as exc:
                flag = settings.flag_name(name, model.model_fields[name])
                raise ConfigError(f"{name}: not JSON: {value!r} [flag {flag}]") from exc
        else:
            given[name] = value
    return given


def parse(model: type[Component], command: str, args: Sequence[str]) -> tuple[Path | None, dict[str, Any]]:
    """`args` (after the command's name) as (the --config file, field -> value as typer would pass it:
    None where not given, a list for a repeatable, a bool for a yes/no setting). Bad flags are a
    ConfigError naming the flag."""
    by_flag: dict[str, tuple[str, str]] = {}  # flag -> (field, "value" | "true" | "false" | "repeat")
    values: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        flag, base = settings.flag_name(name, info), base_type(info.annotation)
        if base is bool:
            by_flag[flag], by_flag[f"--no-{flag[2:]}"] = (name, "true"), (name, "false")
        else:
            by_flag[flag] = (name, "repeat" if typing.get_origin(base) is tuple else "value")
        values[name] = [] if by_flag[flag][1] == "repeat" else None
    config_file: Path | None = None
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--" or not arg.startswith("-"):  # `--` ends the options; no command takes arguments
            extra = rest[:1] if arg == "--" else [arg]
            if extra:
                raise ConfigError(f"faultline {command} takes options only, not {extra[0]!r}")
            break
        flag, has_value, inline = arg.partition("=")
        if not flag.startswith("--") or (flag not in by_flag and flag != CONFIG_FLAG):
            raise ConfigError(
                f"no such option {flag!r} for faultline {command} (faultline {command} --help lists them)"
            )
        kind = "value" if flag == CONFIG_FLAG else by_flag[flag][1]
        if kind in ("true", "false"):
            if has_value:
                raise ConfigError(f"option {flag} takes no value (got {arg!r})")
            values[by_flag[flag][0]] = kind == "true"
            continue
        if has_value:
            value = inline
        elif rest:
            value = rest.pop(0)
        else:
            raise ConfigError(f"option {flag} needs a value")
        if flag == CONFIG_FLAG:
            config_file = Path(value)
        elif kind == "repeat":
            values[by_flag[flag][0]].append(value)
        else:
            values[by_flag[flag][0]] = value  # the last one given wins, as on the full command line
    return config_file, values


def resolve(model: type[Component], command: str, args: Sequence[str]) -> settings.Resolved:
    config_file, values = parse(model, command, args)
    return settings.resolve(model, config_file=config_file, flags=flags_given(model, values))


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


def summary(resolved: settings.Resolved) -> dict[str, Any]:
    """For the start-up log line: the settings that are not defaults (secrets masked) and their sources."""
    given = {n: src for n, src in resolved.sources.items() if src != settings.DEFAULT}
    values = {n: format_value(getattr(resolved.config, n)) for n in given}
    return {"settings": values, "sources": given}
