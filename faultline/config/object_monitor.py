"""The object monitor's settings (`faultline object-monitor`)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from faultline.config.base import (
    Component,
    Duration,
    EvidenceFields,
    Flag,
    KubeFields,
    MetricsFields,
    Part,
    StoreFields,
    alias,
)

_SECOND = dt.timedelta(seconds=1)


class ObjectMonitorTuning(Part):
    """What `workers.object_monitor.Settings` takes from the component's settings."""

    evaluate_interval: Duration = Field(
        default=dt.timedelta(seconds=30), ge=_SECOND,
        description="read the rules that say `now` again on every cached object this often (duration; "
        "about 1.5 ms per object and rule)",
    )  # fmt: skip
    resync_interval: Duration = Field(
        default=dt.timedelta(minutes=5), ge=_SECOND,
        description="read the monitor's open faults back from the store and write what differs this often "
        "(duration): faults someone else resolved while their condition holds open again",
    )  # fmt: skip
    watch_timeout: Duration = Field(
        default=dt.timedelta(minutes=5), ge=_SECOND,
        description="longest watch request (duration; each is given a random 50-100% of it, so watches "
        "of many replicas do not reconnect at once); the watch resumes from its last resourceVersion",
    )  # fmt: skip
    retry_max: Duration = Field(
        default=dt.timedelta(seconds=30), ge=_SECOND,
        description="longest wait (duration) between tries of a watch or a store write that failed",
    )  # fmt: skip
    events: bool = Field(default=True, description="post an Event on the Node when a fault opens or resolves")
    analyzer_feed: bool = Field(
        default=False,
        description="also write the store's feed that the cluster analyzer reads, as writer "
        "`object-monitor` (where one runs: the chart sets it with analyzer.enabled)",
    )


class ObjectMonitorConfig(
    Component, StoreFields, KubeFields, MetricsFields, EvidenceFields, ObjectMonitorTuning
):
    """The object monitor (`faultline object-monitor`): watches the kinds its rules name and holds a
    fault open on a node while a rule's predicate is true for an object."""

    rules: Annotated[tuple[Path, ...], Flag("--rules")] = Field(
        default=(),
        description="object rule files or directories (repeatable), loaded after the built-in rules: their "
        "rules replace built-in ones by id, their `overrides` change them",
    )
    builtin_rules: bool = Field(default=True, description="load the built-in object rules")
    preflight_findings: bool = Field(
        default=False,
        description="turn the findings of failed preflight init containers into faults of their nodes "
        "(`workers.preflight_findings`; the chart sets it with preflight.report)",
    )
    preflight_digests: tuple[str, ...] = Field(
        default=(),
        description="image digests (sha256:<64 hex>) whose preflight containers are believed; empty: the "
        "digest of the image this monitor runs, read from its own pod (pod_name, pod_namespace)",
    )
    pod_name: str | None = Field(
        default=None, validation_alias=alias("pod_name", "POD_NAME"),
        description="this monitor's own pod (the downward API's metadata.name): its image is faultline's",
    )  # fmt: skip
    pod_namespace: str | None = Field(
        default=None, validation_alias=alias("pod_namespace", "POD_NAMESPACE"),
        description="the namespace of this monitor's own pod (the downward API's metadata.namespace)",
    )  # fmt: skip

    @field_validator("preflight_digests")
    @classmethod
    def _digests(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for digest in value:
            if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                raise ValueError(f"{digest[:80]!r} is not an image digest (sha256:<64 hex digits>)")
        return value
