"""The cluster analyzer's settings (`faultline analyzer`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from faultline.config.base import (
    Component,
    Duration,
    EvidenceFields,
    Flag,
    KubeFields,
    Part,
    Seconds,
    StoreFields,
    WorkerFields,
)

_SECOND = dt.timedelta(seconds=1)


class AnomalyField(Part):
    """One health field's anomaly score (`anomaly_fields`): whether it is scored, the score that raises
    `GPU-ANOMALY-<FIELD>`, and the floor of the deviation the score divides by (the field's unit: errors
    per hour for counters, degrees C for temperature), so a GPU whose rate never moved is not alarmed by
    its first few errors: a GPU at rate 0 raises once its recent rate reaches `threshold` x `floor`."""

    enabled: bool = Field(default=True, description="score this field")
    threshold: float = Field(default=6.0, gt=0, le=1000, description="score that raises the fault")
    floor: float = Field(default=1.0, gt=0, le=1e9, description="smallest deviation (field's unit)")


# The fields the agent's GPU backends read that anomaly scores know, with conservative defaults: the
# error counters on (a correctable error rate that climbs is what precedes row remapping and XID 48/63/
# 64), temperature off (it follows the workload, and the agent reports its thresholds as states already).
# A floor is at least 10 an hour: with a sample a minute one error is a rate of 60/h for that minute, and
# rare events (a remapped row) must take several at once to score past 6.
ANOMALY_FIELDS: dict[str, AnomalyField] = {
    "ecc_sbe_volatile": AnomalyField(floor=10.0),  # correctable ECC errors per hour
    "remapped_rows_correctable": AnomalyField(floor=10.0),  # rows remapped for correctable errors per hour
    "retired_pages_sbe": AnomalyField(floor=10.0),  # pages retired for repeated correctable errors per hour
    "nvlink_crc": AnomalyField(floor=60.0),  # NVLink CRC flit errors per hour (all links)
    "nvlink_replay": AnomalyField(floor=60.0),  # NVLink replays per hour
    "nvlink_recovery": AnomalyField(floor=10.0),  # NVLink recoveries per hour
    "pcie_replay": AnomalyField(floor=60.0),  # PCIe replays per hour
    "temperature": AnomalyField(enabled=False, floor=3.0),  # degrees C above the GPU's own normal
}


class AnalyzerConfig(Component, StoreFields, KubeFields, WorkerFields, EvidenceFields):
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
    batch: int = Field(
        default=1024, ge=1, le=10_000,
        description="feed documents read at most at once (a read fetches whole seconds of the feed; "
        "with a limit below what a second holds, the next read fetches that second again)",
    )  # fmt: skip
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
        description="Bytewax worker threads per process (the decoding of the feed and the windows' "
        "partitions are spread over them)",
    )
    processes: int = Field(
        default=1, ge=1, le=16,
        description="processes of the active replica (Bytewax's cluster mode on this machine: the first "
        "reads the feed and holds the lease, every one decodes and keeps windows; use one per core)",
    )  # fmt: skip
    process_port: int = Field(
        default=7410, ge=1024, le=65_000,
        description="with processes > 1, the first of the loopback TCP ports the replica's processes talk "
        "on (one each: this and the next ones); fixed and below Linux's ephemeral range (32768-60999), so "
        "no outgoing connection can hold one between choosing it and binding it",
    )  # fmt: skip
    peers: Annotated[tuple[str, ...], Flag("--peer")] = Field(
        default=(), max_length=64,
        description="host:port of every pod of an analyzer spread over pods (a StatefulSet's stable names, "
        "in ordinal order; repeatable): the pod at place 0 holds the lease and reads the feed, each pod "
        "runs `processes` processes on the ports from its port on; empty: one pod",
    )  # fmt: skip
    peer_index: int | None = Field(
        default=None, ge=0, le=63,
        description="with peers, this pod's place in them; default: the number that ends the host name (a "
        "StatefulSet pod's ordinal)",
    )  # fmt: skip
    anomaly: bool = Field(
        default=False, description="score each GPU's health fields with online models (river: needs the "
        "faultline[anomaly] extra) and raise non-fatal GPU-ANOMALY-<FIELD> faults that never cordon",
    )  # fmt: skip
    anomaly_fields: dict[str, AnomalyField] = Field(
        default_factory=lambda: dict(ANOMALY_FIELDS),
        description="per health field: enabled, threshold (score), floor (the field's unit); what is given "
        "overrides the defaults of that field only",
    )
    anomaly_warmup: int = Field(
        default=30, ge=2, le=100_000,
        description="samples of a GPU's field learned before its score can raise a fault",
    )  # fmt: skip
    anomaly_expire: Duration = Field(
        default=dt.timedelta(days=7), ge=dt.timedelta(hours=1),
        description="forget a GPU's models once it has sent no sample for this long (duration)",
    )  # fmt: skip

    @field_validator("peers")
    @classmethod
    def _peers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Each peer is host:port, the port one a process can listen on; no two the same."""
        for place, peer in enumerate(value):
            host, sep, port = peer.rpartition(":")
            if not sep or not host or not port.isdigit() or not 1024 <= int(port) <= 65_000:
                raise ValueError(f"peer {place} ({peer!r}) is not host:port with a port from 1024 to 65000")
        twice = sorted({p for p in value if value.count(p) > 1})
        if twice:
            raise ValueError(f"peer(s) given twice: {', '.join(twice)}")
        return value

    @field_validator("anomaly_fields", mode="before")
    @classmethod
    def _anomaly_fields(cls, value: object) -> object:
        """A field's given keys over its defaults; a name no backend reports is an error naming the known."""
        if not isinstance(value, dict):
            return value
        unknown = sorted(set(value) - set(ANOMALY_FIELDS))
        if unknown:
            raise ValueError(f"unknown health field(s) {', '.join(map(str, unknown))} "
                             f"(known: {', '.join(ANOMALY_FIELDS)})")  # fmt: skip
        out: dict[str, object] = {k: v.model_dump() for k, v in ANOMALY_FIELDS.items()}
        for name, given in value.items():
            keys = given.model_dump() if isinstance(given, AnomalyField) else given
            out[name] = {**out[name], **keys} if isinstance(keys, dict) else keys  # type: ignore[dict-item]
        return out
