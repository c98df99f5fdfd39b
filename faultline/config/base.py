"""What every component's settings model is made of: the base class, durations and the shared fields.

A component's model is one frozen pydantic-settings class. The CLI (`cli.settings`) resolves it from three
sources over the defaults, each overriding the one before: the YAML config file (`--config`), the
environment (`FAULTLINE_<FIELD>`, plus the unprefixed names pods already set: `MONGODB_URI`, `KUBECONFIG`,
`NODE_NAME`), then the command-line flags (`--<field>`), which the CLI generates from these fields. So a
setting is defined once, here, with its unit and its reason.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AliasChoices, BaseModel, BeforeValidator, Field, SecretStr
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "FAULTLINE_"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


# The longest duration any setting takes: longer is a typo, not a wait, and a time plus it must stay a
# time (an infinite or 1e20 s value raised OverflowError out of the models instead of a clear error)
MAX_SECONDS = 100 * 365 * 86400.0


def parse_seconds(value: object) -> float:
    """`"10m"` -> 600.0: a number of seconds, or a string with an optional ms/s/m/h/d unit (no unit:
    seconds), or a timedelta; finite and at most 100 years. Bounds (positive, at least ...) are each
    field's own."""
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):  # a bool is an int to Python, never a duration to a person
        raise ValueError(f"not a duration: {value!r}")
    elif isinstance(value, int | float):
        seconds = float(value) if abs(value) <= MAX_SECONDS else math.inf  # float() of a huge int overflows
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise ValueError(f"not a duration: {value!r} (write e.g. 30s, 10m, 7d, or a number of seconds)")
    if not abs(seconds) <= MAX_SECONDS:  # also NaN
        raise ValueError(f"not a duration: {value!r} (at most 100 years)")
    return seconds


def _timedelta(value: object) -> dt.timedelta:
    return dt.timedelta(seconds=parse_seconds(value))


Duration = Annotated[dt.timedelta, BeforeValidator(_timedelta)]
"""A duration: "30s", "10m", "7d", "250ms" or a number of seconds."""

Seconds = Annotated[float, BeforeValidator(parse_seconds)]
"""A duration kept as float seconds (the agent's intervals, read on its hot paths): same spellings."""


def alias(name: str, *unprefixed: str) -> AliasChoices:
    """Environment names of a field: `FAULTLINE_<NAME>` first, then established unprefixed names (such as
    `MONGODB_URI`); the field's own name stays valid in files and flags (`populate_by_name`)."""
    return AliasChoices(f"{ENV_PREFIX}{name}".lower(), *(u.lower() for u in unprefixed))


class Flag:
    """Field metadata: the command-line flag, where it is not `--<field-name>` (e.g. `--pack` for `packs`)."""

    def __init__(self, name: str) -> None:
        self.name = name


class Component(BaseSettings):
    """Base of each component's settings. Frozen; unknown keys are errors (a typo must not be ignored).
    Built only through `cli.settings.resolve`, which reads the file and the environment with
    pydantic-settings' sources and records where each value came from; building the model directly
    validates exactly the values given (no hidden environment reads)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", populate_by_name=True, case_sensitive=False,
        validate_default=True,
    )  # fmt: skip

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:  # fmt: skip
        del settings_cls, env_settings, dotenv_settings, file_secret_settings  # read by cli.settings
        return (init_settings,)


class Part(BaseModel):
    """A part of a component's settings that is handed down on its own (a worker's tunables)."""

    # arbitrary types: a worker's Settings extend its part with objects loaded from the rest (a provider)
    model_config = SettingsConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


P = TypeVar("P", bound=BaseModel)


def part(config: BaseModel, model: type[P], **extra: Any) -> P:
    """`model` built from the fields of `config` that `model` declares, plus `extra` (objects the caller
    loaded from the settings: rules, templates, a cloud provider): nothing is copied by hand."""
    values = {name: getattr(config, name) for name in model.model_fields if name in type(config).model_fields}
    return model(**{**values, **extra})  # what was loaded from a setting replaces it (rules: file -> rules)


# Shared fields: each defined here once and inherited by the components that have them.


class StoreFields(BaseModel):
    mongodb_uri: SecretStr = Field(
        validation_alias=alias("mongodb_uri", "MONGODB_URI"),
        description="MongoDB connection string (mongodb://...); masked in dumps: it may hold a password",
    )
    database: str = Field(default="faultline", min_length=1, description="MongoDB database name")


class EvidenceFields(BaseModel):
    evidence_key: Path | None = Field(
        default=None,
        description="the cluster components' evidence key file (the chart mounts it from a Secret no node "
        "agent can read): signs the faults this component writes and checks those the cluster components "
        "signed (`faultline.evidence`); unset: none",
    )


class VerifyFields(EvidenceFields):
    require_evidence: bool = Field(
        default=False,
        description="act only on faults whose writer is proven: signed by the agent of the fault's own node "
        "(its key published on its Node) or by a cluster component (evidence_key); others are refused and "
        "counted. The chart turns it on",
    )


class KubeFields(BaseModel):
    kubeconfig: Path | None = Field(
        default=None, validation_alias=alias("kubeconfig", "KUBECONFIG"),
        description="kubeconfig file (path); unset: the pod's in-cluster credentials",
    )  # fmt: skip


class MetricsFields(BaseModel):
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="TCP port of /metrics and /healthz; 0: not served"
    )
    metrics_address: str = Field(
        default="0.0.0.0",  # noqa: S104 - in a pod the kubelet's probes and Prometheus come from outside
        min_length=1,
        description="address /metrics and /healthz listen on: 0.0.0.0 (every IPv4 interface: a pod's "
        "probes reach it on the pod IP), :: (IPv6 and IPv4), or one address such as 127.0.0.1",
    )
    stall_timeout: Duration = Field(
        default=dt.timedelta(seconds=120),
        ge=dt.timedelta(seconds=1),
        description="how long one of the component's loops (a claimer, a watch, the dataflow, the "
        "webhook's server) may make no progress before /healthz answers 503 and the kubelet restarts "
        "the pod; longer than any one call's own timeout, so an outage waited out is not a stall",
    )


class WorkerFields(MetricsFields):
    owner: str | None = Field(
        default=None,
        description="this replica's name in claim leases; unset: host/pid (unique per process, so a "
        "restarted replica never mistakes another's lease for its own)",
    )
