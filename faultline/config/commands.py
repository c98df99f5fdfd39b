"""Settings of the small commands that only read or maintain the store."""

from __future__ import annotations

import datetime as dt
import getpass
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from faultline.config.base import Component, Duration, KubeFields, StoreFields, alias

_KEY = r"^[-._a-zA-Z0-9]{1,253}$"  # a Secret's data key
_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"


class StatusConfig(Component, StoreFields):
    """`faultline status`: the breaker and the nodes faultline holds."""


class ExplainConfig(Component, StoreFields, KubeFields):
    """`faultline explain NODE`: why faultline holds a node (or does not), what comes next, what to do."""

    rules: Path | None = Field(
        default=None,
        description="the quarantine's rules YAML file (which rules match each fault); unset: built-in rules",
    )  # fmt: skip


class ReportConfig(Component, StoreFields):
    """`faultline report`: the fleet's reliability over a window (faults, times, repairs, offenders)."""

    window: Duration = Field(
        default=dt.timedelta(days=30),
        gt=dt.timedelta(0),
        description="how far back the report looks (duration)",
    )
    repeat_offender: int = Field(
        default=2, ge=2, le=1000, description="faults of one GPU in the window that make it a repeat offender"
    )


class RmaConfig(Component, StoreFields):
    """`faultline rma NODE|GPU`: write the RMA evidence bundles of a node, or of a GPU, as a tarball."""

    file: Path | None = Field(
        default=None, description="the tarball to write; unset: rma-<node or GPU>-<time>.tar.gz here"
    )


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
    bug_reports_older_than: Duration = Field(
        default=dt.timedelta(days=90), ge=dt.timedelta(days=1),
        description="delete nvidia-bug-report outputs collected longer ago than this (duration; up to 12 MiB "
        "each): the RMA bundles keep their listing, a tarball written later lacks the report",
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


class ChartSecret(BaseModel):
    """One Secret `faultline chart-secrets` makes once and never overwrites (`workers.chart_secrets`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=_NAME)
    random: dict[str, int] = Field(default_factory=dict, description="key: length of a random value (16-512)")
    fixed: dict[str, str] = Field(default_factory=dict, description="key: value, set when missing")
    derived: dict[str, str] = Field(
        default_factory=dict, description="key: template of ${other keys}, rewritten from them on every run"
    )
    labels: dict[str, str] = Field(default_factory=dict)

    def model_post_init(self, context: object) -> None:
        for key, length in self.random.items():
            if not 16 <= length <= 512:
                raise ValueError(f"secret {self.name}: random key {key!r}: length {length} is not 16-512")
        for key in [*self.random, *self.fixed, *self.derived]:
            if not re.fullmatch(_KEY, key):
                raise ValueError(f"secret {self.name}: {key!r} is not a Secret key")


class ChartCrdsConfig(Component, KubeFields):
    """`faultline chart-crds`: bring the CRDs faultline defines to this version (the chart's pre-upgrade
    hook: Helm never upgrades a chart's CRDs)."""


class ChartSecretsConfig(Component, KubeFields):
    """`faultline chart-secrets`: make the chart's Secrets that are missing, complete the others (its
    pre-install and pre-upgrade hook)."""

    namespace: str = Field(
        default="faultline-system", min_length=1, validation_alias=alias("namespace", "POD_NAMESPACE"),
        description="where the Secrets are (the release's namespace)",
    )  # fmt: skip
    secrets: list[ChartSecret] = Field(
        default_factory=list, description="the Secrets (name, random, fixed, derived, labels)"
    )
    namespace_labels: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="labels set on these namespaces where they have none of that key (the Pod Security "
        "level the release's pods need); a label someone set is never changed",
    )
