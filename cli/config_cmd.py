"""`faultline config show COMPONENT [--config FILE] [flags]`: a component's effective settings and where
each value came from (default, file, env, flag), resolved exactly as the component itself resolves them."""

from __future__ import annotations

import datetime as dt
import inspect
import sys
from typing import Annotated, Any, Literal

import typer
import yaml
from pydantic import SecretStr
from pydantic_core import to_jsonable_python

from cli import flags, options, settings
from faultline import config

app = typer.Typer(help="Inspect faultline's settings.", no_args_is_help=True)
show_app = typer.Typer(
    help="Print a component's effective settings and where each came from (default, file, env, flag); "
    "secrets masked. Takes the component's own --config and flags.",
    no_args_is_help=True,
)
app.add_typer(show_app, name="show")


def render(resolved: settings.Resolved) -> list[str]:
    """`field  value  source` lines, aligned; secrets masked, durations written as durations."""
    cfg = resolved.config
    rows = [
        (name, flags.format_value(getattr(cfg, name)), resolved.sources[name])
        for name in type(cfg).model_fields
    ]
    width = max(len(r[0]) for r in rows)
    value_width = min(max(len(r[1]) for r in rows), 60)
    return [f"{n:<{width}}  {v:<{value_width}}  {s}" for n, v, s in rows]


def as_file(resolved: settings.Resolved) -> dict[str, Any]:
    """The settings as a config file holds them (secrets masked, durations as 30s/10m/7d)."""
    out: dict[str, Any] = {}
    for name in type(resolved.config).model_fields:
        raw = getattr(resolved.config, name)
        written = isinstance(raw, dt.timedelta | SecretStr)  # as 30s / 10m, and masked
        out[name] = flags.format_value(raw) if written else to_jsonable_python(raw)
    return out


def show(resolved: settings.Resolved, output: Literal["table", "yaml"]) -> None:
    if output == "yaml":
        sys.stdout.write(yaml.safe_dump(as_file(resolved), sort_keys=False))
    else:
        sys.stdout.write("\n".join(render(resolved)) + "\n")


_OUTPUT = inspect.Parameter(
    "output", inspect.Parameter.KEYWORD_ONLY, default="table",
    annotation=Annotated[Literal["table", "yaml"],
                         typer.Option("--output", help="table (value and source) or yaml (a config file).")],
)  # fmt: skip

for _name, _model in config.COMPONENTS.items():
    options.register(show_app, _name, _model, show, (_model.__doc__ or _name).strip(), extra=(_OUTPUT,))
