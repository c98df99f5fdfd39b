"""Settings of the small commands that only read or maintain the store."""

from __future__ import annotations

import datetime as dt
import getpass
import os

from pydantic import Field

from faultline.config.base import Component, Duration, KubeFields, StoreFields, alias


class StatusConfig(Component, StoreFields):
    """`faultline status`: the breaker and the nodes faultline holds."""


def _os_user() -> str:
    return os.environ.get("USER") or getpass.getuser()


class BreakerResetConfig(Component, StoreFields):
    """`faultline breaker reset`: close the quarantine's tripped circuit breaker (who and why recorded)."""

    reason: str = Field(min_length=1, max_length=500, description="why it is safe to quarantine again")
    by: str = Field(
        default_factory=_os_user, min_length=1, max_length=200,
        description="who resets it (recorded); default: the OS user ($USER)",
    )  # fmt: skip


class RetentionConfig(Component, StoreFields):
    """`faultline store retention`: delete old health events (FerretDB and DocumentDB have no TTL index)."""

    older_than: Duration = Field(
        default=dt.timedelta(days=14), ge=dt.timedelta(hours=1),
        description="delete health events older than this (duration); at least 1h, so the analyzer and "
        "`explain` keep recent history",
    )  # fmt: skip


class UninstallConfig(Component, KubeFields):
    """`faultline uninstall`: take back faultline's marks from the cluster once the release's components
    are gone (the chart's post-delete hook)."""

    namespace: str = Field(
        default="faultline-system", min_length=1, validation_alias=alias("namespace", "POD_NAMESPACE"),
        description="the release's namespace: where its pods ran and the repair Jobs are",
    )  # fmt: skip
    repair_namespace: str = Field(
        default="", description="where the janitor ran repair Jobs (janitor.namespace); empty: `namespace`"
    )
    instance: str = Field(
        min_length=1, description="the release's name (its pods' label app.kubernetes.io/instance)"
    )
    wait: Duration = Field(
        default=dt.timedelta(minutes=2), gt=dt.timedelta(0),
        description="how long to wait for the release's pods to stop before giving up (duration)",
    )  # fmt: skip
