"""The object monitor's settings (`faultline object-monitor`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

from pydantic import Field

from faultline.config.base import (
    Component,
    Duration,
    EvidenceFields,
    Flag,
    KubeFields,
    MetricsFields,
    Part,
    StoreFields,
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
