"""Settings of the exporter (`faultline export`): where fault changes and repair steps go, and which."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from faultline.config.base import Component, Duration, MetricsFields, StoreFields

_NAME = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"  # a volume name with -token: at most 63


class SinkFilter(BaseModel):
    """Which events a sink gets (every condition given must hold; none given: every event)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kinds: list[Literal["fault", "repair"]] | None = Field(
        default=None, description="fault changes, repair steps, or both (unset)"
    )
    actions: list[str] | None = Field(
        default=None, description="only faults and repairs with one of these actions (e.g. CONTACT_SUPPORT)"
    )
    fatal: bool | None = Field(default=None, description="only fatal faults (true) or non-fatal ones (false)")
    codes: list[str] | None = Field(default=None, description="only these fault codes (e.g. XID-79)")


class SinkSpec(BaseModel):
    """One receiver: an HTTP(S) endpoint, the format it takes, how to authenticate, which events."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=_NAME, description="the sink's name (its stored position and metrics label)")
    url: str = Field(pattern=r"^https?://", description="where events are POSTed")
    format: Literal["cloudevents", "webhook"] = Field(
        default="cloudevents",
        description='cloudevents: structured CloudEvents 1.0 JSON; webhook: {"text": ...} for chat tools',
    )
    bearer_token_file: Path | None = Field(default=None, description="a file holding a bearer token to send")
    hmac_secret_file: Path | None = Field(
        default=None,
        description="a file holding a secret: the body's HMAC-SHA256 goes in X-Faultline-Signature",
    )
    filter: SinkFilter = Field(default_factory=SinkFilter)
    timeout: Duration = Field(
        default=dt.timedelta(seconds=10), gt=dt.timedelta(0), description="one POST's limit"
    )
    backoff_max: Duration = Field(
        default=dt.timedelta(minutes=5), gt=dt.timedelta(0), description="the longest wait between retries"
    )


class ExportConfig(Component, StoreFields, MetricsFields):
    """The exporter (`faultline export`): fault changes and repair steps as CloudEvents or webhook posts."""

    sinks: list[SinkSpec] = Field(
        min_length=1, description="where events go (a list; see docs/operations/export.md)"
    )
    cluster: str = Field(
        default="kubernetes",
        min_length=1,
        max_length=200,
        description="the cluster's name (the events' source)",
    )
    poll: Duration = Field(default=dt.timedelta(seconds=5), gt=dt.timedelta(0), description="between looks")

    @model_validator(mode="after")
    def _unique(self) -> ExportConfig:
        names = [s.name for s in self.sinks]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"sink names must be unique: {', '.join(dupes)}")
        return self
