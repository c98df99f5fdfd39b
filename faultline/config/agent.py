"""The node agent's settings (`faultline agent`)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from faultline.config.base import Component, Flag, KubeFields, MetricsFields, Seconds, StoreFields, alias


class AgentConfig(Component, StoreFields, KubeFields, MetricsFields):
    """The node agent (`faultline agent`). Its intervals are float seconds (they feed its polling loops)
    but are written like any duration ("500ms", "5s")."""

    node: str = Field(
        min_length=1, validation_alias=alias("node", "NODE_NAME"),
        description="the Node this agent watches (downward API spec.nodeName)",
    )  # fmt: skip
    gpu_backend: Literal["sim", "nvml", "dcgm"] = Field(
        default="sim", description="where GPU events come from"
    )
    dcgm_host: str = Field(default="localhost:5555", description="DCGM host engine HOST:PORT (dcgm backend)")
    sim_dir: Path | None = Field(default=None, description="simulator control directory (sim backend)")
    sim_scenario: Path | None = Field(default=None, description="simulator scenario YAML file (sim backend)")
    gpus: int = Field(default=8, ge=1, le=16, description="simulated GPUs (count, sim backend)")
    packs: Annotated[tuple[Path, ...], Flag("--pack")] = Field(
        default=(), description="extra pattern pack directories (repeatable); they override built-ins by id"
    )
    journal_file: Path | None = Field(default=None, description="follow this journal file's kernel messages")
    journal_dir: Path | None = Field(default=None, description="follow the journal in this directory")
    state_dir: Path = Field(
        description="the agent's own files: MongoDB spool, recovery snapshots (a hostPath in a DaemonSet); "
        "unset: faultline-agent-<node> in the temporary directory"
    )
    spool_max_bytes: int = Field(
        default=64 << 20, ge=1 << 20, le=1 << 40,
        description="bound of the store spool under state_dir, in bytes (default 64 MiB, a quarter of the "
        "chart's 256 MiB memory limit; a drain holds one 4 MiB segment at a time, whatever the bound): "
        "once full, health events are refused first (at 3/4 of it), then fault writes, each counted in "
        "faultline_spool_dropped_total",
    )  # fmt: skip
    syslog_file: Path | None = Field(default=None, description="follow this syslog file across rotations")
    syslog_trusted: bool = Field(
        default=False,
        description="believe syslog_file's `kernel` tags: only for a file that nothing but the kernel's "
        "logger writes to (e.g. rsyslog's `kern.*  /var/log/kern.log`); in a shared file any local user's "
        "`logger -t kernel 'NVRM: Xid ... 79'` would open a fatal fault. Off: its lines are counted in "
        "faultline_untrusted_kernel_lines_total, never a fault (the journal and kmsg say who wrote a line)",
    )
    kmsg: Path | None = Field(default=None, description="read kernel messages from this kmsg device")
    sysfs_root: Path | None = Field(
        default=None, description="poll NIC ports under this sysfs root (e.g. /sys)"
    )
    nic_interval: Seconds = Field(default=1.0, ge=0.05, description="between NIC polls (duration)")
    snapshot_interval: Seconds = Field(
        default=5.0, gt=0, le=60,
        description="between recovery snapshots (duration): what a restarted agent replays at most",
    )  # fmt: skip
    gpu_poll_interval: Seconds = Field(
        default=1.0, gt=0, le=300, description="between GPU health reads (duration)"
    )
    gpu_hung_after: Seconds = Field(
        default=10.0,
        gt=0,
        description="a GPU backend call running this long (duration) makes the monitor unhealthy",
    )
    gpu_unresponsive_after: Seconds = Field(
        default=300.0, gt=0,
        description="unhealthy this long (duration): the driver is unresponsive (a node fault)",
    )  # fmt: skip
    repair_poll_interval: Seconds = Field(
        default=5.0, gt=0, le=300,
        description="between reads of this node's verified repairs in MongoDB while one of its repairs is "
        "open (duration): how soon after the janitor's reset or reboot the GPUs are re-read to confirm it",
    )  # fmt: skip
    repair_idle_poll_interval: Seconds = Field(
        default=30.0, gt=0, le=600,
        description="between those reads while none of this node's repairs is open (duration; never "
        "shorter than repair_poll_interval): the agent's steady read of the store (at 10,000 nodes, 333 "
        "reads a second at 30s)",
    )  # fmt: skip
    pod_resources_socket: Path | None = Field(
        default=None,
        description="the kubelet's pod-resources socket (/var/lib/kubelet/pod-resources/kubelet.sock): "
        "record which pods use which GPU, for the drainer's partial GPU drains; unset: off",
    )
    pod_resources_interval: Seconds = Field(
        default=10.0, ge=1, le=300,
        description="between reads of the kubelet's pod resources (duration); the store is written only "
        "when they or the node's quarantine changed",
    )  # fmt: skip
    ingest_socket: Path | None = Field(
        default=None, description="serve gRPC HealthIngest on this Unix socket (mode 0600); unset: off"
    )
    ingest_tcp: str | None = Field(
        default=None,
        description="also serve it on HOST:PORT, with mutual TLS only (needs ingest_tls_cert, ingest_tls_key "
        "and ingest_tls_client_ca: whoever reaches the port must prove who it is)",
    )
    ingest_tls_cert: Path | None = Field(default=None, description="TLS certificate file for ingest_tcp")
    ingest_tls_key: Path | None = Field(default=None, description="TLS private key file for ingest_tcp")
    ingest_tls_client_ca: Path | None = Field(
        default=None, description="clients of ingest_tcp must present a certificate this CA file signed"
    )
    nvsentinel_socket: Path | None = Field(
        default=None,
        description="also serve NVSentinel's platform-connector gRPC service (HealthEventOccurredV1) on "
        "this Unix socket (mode 0600), for NVSentinel's health monitors; unset: off",
    )

    analyzer_feed: bool = Field(
        default=False,
        description="also write the store's feed that the cluster analyzer reads (where one runs: the "
        "chart sets it with analyzer.enabled); it costs each write one more insert",
    )
    health_samples: Seconds | None = Field(
        default=None, ge=1, le=3600,
        description="every this long (duration; the chart sets 60s with analyzer.anomaly.enabled), store one "
        "health sample per GPU: its fields as read, as numbers, for the cluster analyzer's anomaly scores "
        "(a healthy event that opens no fault); unset: none",
    )  # fmt: skip
    scheduled_events: bool = Field(
        default=False,
        description="on an Azure node (its providerID says), relay its Scheduled Events from the instance "
        "metadata service to the store for the maintenance monitor, and post the early starts it asks for",
    )
    scheduled_events_interval: Seconds = Field(
        default=10.0, ge=1, le=300,
        description="between reads of the Scheduled Events (duration); the store is written when they "
        "changed, and at least every minute",
    )  # fmt: skip
    imds_endpoint: str = Field(
        default="http://169.254.169.254", min_length=1,
        description="the instance metadata service's base URL (Azure's link-local address)",
    )  # fmt: skip

    @model_validator(mode="before")
    @classmethod
    def _default_state_dir(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("state_dir") is None and values.get("node"):
            return {**values, "state_dir": Path(tempfile.gettempdir()) / f"faultline-agent-{values['node']}"}
        return values

    @model_validator(mode="after")
    def _tls_for_tcp(self) -> AgentConfig:
        mutual_tls = self.ingest_tls_cert and self.ingest_tls_key and self.ingest_tls_client_ca
        if self.ingest_tcp and not mutual_tls:
            raise ValueError(
                "ingest_tcp needs ingest_tls_cert, ingest_tls_key and ingest_tls_client_ca (mutual TLS: "
                "neither plain TCP nor clients without a certificate are accepted)"
            )
        if self.nvsentinel_socket is not None and self.nvsentinel_socket == self.ingest_socket:
            raise ValueError("nvsentinel_socket and ingest_socket must be different paths")
        return self
