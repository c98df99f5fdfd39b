"""The cluster analyzer's settings (`faultline analyzer`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

from pydantic import Field

from faultline.config.base import Component, Duration, Flag, KubeFields, Seconds, StoreFields, WorkerFields

_SECOND = dt.timedelta(seconds=1)


class AnalyzerConfig(Component, StoreFields, KubeFields, WorkerFields):
    """The cluster analyzer (`faultline analyzer`): one replica active at a time (a lease in the store),
    the others standing by."""

    packs: Annotated[tuple[Path, ...], Flag("--pack")] = Field(
        default=(), description="extra pattern pack directories or files (repeatable); their cluster "
        "patterns override built-ins by id",
    )  # fmt: skip
    builtin: bool = Field(default=True, description="run the built-in cluster patterns too")
    node_labels: bool = Field(
        default=True,
        description="read the nodes' labels from the Kubernetes API (for label: keys and label matches; "
        "needs nodes list)",
    )
    labels_refresh: Duration = Field(
        default=dt.timedelta(minutes=1),
        ge=_SECOND,
        description="re-read the nodes' labels this often (duration)",
    )
    poll: Seconds = Field(
        default=0.5, gt=0, le=60, description="between reads of the feed while caught up (duration)"
    )
    batch: int = Field(default=256, ge=1, le=10_000, description="feed documents read at most at once")
    checkpoint_interval: Seconds = Field(
        default=5.0, gt=0, le=600,
        description="between checkpoints of the windows (duration): what a restart reads again at most",
    )  # fmt: skip
    lease: Duration = Field(
        default=dt.timedelta(seconds=30), ge=dt.timedelta(seconds=5),
        description="the active replica's lease (duration), renewed at a third of it: a replica that dies "
        "is replaced this long after",
    )  # fmt: skip
    feed_keep: Duration = Field(
        default=dt.timedelta(hours=1), ge=dt.timedelta(minutes=1),
        description="delete feed documents the analyzer has read once they are this old (duration)",
    )  # fmt: skip
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Bytewax worker threads (the windows' partitions are spread over them)",
    )
