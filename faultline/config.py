"""Typed configuration, one frozen model per component, resolved only in the CLI and handed down."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class AgentConfig(BaseModel):
    """The node agent (`faultline agent`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str = Field(min_length=1, description="the Node this agent watches (downward API spec.nodeName)")
    mongodb_uri: SecretStr = Field(
        description="MongoDB connection string; masked in dumps (may hold a password)"
    )
    database: str = Field(default="faultline", description="MongoDB database name")
    kubeconfig: Path | None = Field(default=None, description="kubeconfig file; None: in-cluster credentials")
    gpu_backend: Literal["sim", "nvml", "dcgm"] = Field(
        default="sim", description="where GPU events come from"
    )
    dcgm_host: str = Field(default="localhost:5555", description="DCGM host engine (dcgm backend)")
    sim_dir: Path | None = Field(default=None, description="simulator control directory (sim backend)")
    sim_scenario: Path | None = Field(default=None, description="simulator scenario YAML (sim backend)")
    gpus: int = Field(default=8, ge=1, le=16, description="simulated GPUs (sim backend)")
    packs: tuple[Path, ...] = Field(default=(), description="extra pattern pack directories")
    journal_file: Path | None = Field(default=None, description="follow this journal file's kernel messages")
    journal_dir: Path | None = Field(default=None, description="follow the journal in this directory")
    state_dir: Path = Field(
        description="the agent's own files: the MongoDB spool (a hostPath in a DaemonSet)"
    )
    metrics_port: int = Field(default=0, ge=0, le=65535, description="port of /metrics and /healthz; 0: off")
    syslog_file: Path | None = Field(default=None, description="follow this syslog file across rotations")
    kmsg: Path | None = Field(default=None, description="read kernel messages from this kmsg device")
    sysfs_root: Path | None = Field(
        default=None, description="poll NIC ports under this sysfs root (e.g. /sys)"
    )
    nic_interval: float = Field(default=1.0, gt=0, description="seconds between NIC polls")
    snapshot_interval: float = Field(
        default=5.0, gt=0, le=60, description="seconds between recovery snapshots (what a restart replays)"
    )
    gpu_poll_interval: float = Field(
        default=1.0, gt=0, le=300, description="seconds between GPU health reads"
    )
    gpu_hung_after: float = Field(
        default=10.0, gt=0, description="a GPU backend call running this long makes the monitor unhealthy"
    )
    gpu_unresponsive_after: float = Field(
        default=300.0, gt=0, description="unhealthy this long: the driver is unresponsive (a node fault)"
    )
    ingest_socket: Path | None = Field(
        default=None, description="serve gRPC HealthIngest on this Unix socket (mode 0600); None: off"
    )
    ingest_tcp: str | None = Field(default=None, description="also serve it on HOST:PORT, with TLS only")
    ingest_tls_cert: Path | None = Field(default=None, description="TLS certificate for ingest_tcp")
    ingest_tls_key: Path | None = Field(default=None, description="TLS private key for ingest_tcp")
    ingest_tls_client_ca: Path | None = Field(
        default=None, description="require client certificates signed by this CA on ingest_tcp"
    )

    @model_validator(mode="after")
    def _tls_for_tcp(self) -> AgentConfig:
        if self.ingest_tcp and not (self.ingest_tls_cert and self.ingest_tls_key):
            raise ValueError("ingest_tcp needs ingest_tls_cert and ingest_tls_key (plain TCP is not offered)")
        return self


class QuarantineConfig(BaseModel):
    """The quarantine worker (`faultline worker quarantine`). Durations in seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mongodb_uri: SecretStr = Field(description="MongoDB connection string; masked in dumps")
    database: str = Field(default="faultline", description="MongoDB database name")
    kubeconfig: Path | None = Field(default=None, description="kubeconfig file; None: in-cluster credentials")
    rules: Path | None = Field(default=None, description="quarantine rules YAML; None: the built-in default")
    dry_run: bool = Field(default=False, description="record what would be done, change nothing")
    hold_down: float = Field(default=60.0, ge=0, description="wait this long after the last fault resolved")
    max_fault_age: float = Field(
        default=3600.0, gt=0, description="faults last seen longer ago when first claimed are not acted on"
    )
    breaker_window: float = Field(default=600.0, gt=0, description="circuit breaker sliding window")
    breaker_max_share: float | None = Field(
        default=0.1, gt=0, le=1, description="open past this share of GPU nodes quarantined in the window"
    )
    breaker_max_count: int | None = Field(
        default=None, ge=1, description="open past this many nodes quarantined in the window"
    )
    breaker_cooldown: float = Field(default=900.0, gt=0, description="open this long, then half-open")
    threads: int = Field(default=16, ge=1, le=256, description="claims worked on at once")
    qps: float = Field(default=200.0, gt=0, description="Kubernetes API writes per second (sustained)")
    burst: int = Field(default=400, ge=1, description="Kubernetes API writes at once")
    lease: float = Field(default=30.0, gt=0, description="claim lease, renewed at a third of it")
    resync_interval: float = Field(default=5.0, gt=0, description="revisit held nodes this often")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="port of /metrics; 0: off")
    owner: str | None = Field(default=None, description="this replica's name in leases (default host/pid)")


class DrainConfig(BaseModel):
    """The drainer (`faultline worker drain`). Durations in seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mongodb_uri: SecretStr = Field(description="MongoDB connection string; masked in dumps")
    database: str = Field(default="faultline", description="MongoDB database name")
    kubeconfig: Path | None = Field(default=None, description="kubeconfig file; None: in-cluster credentials")
    default_mode: Literal["Immediate", "AllowCompletion", "DeleteAfterTimeout"] = Field(
        default="Immediate", description="mode of namespaces without the faultline.io/drain-mode label"
    )
    delete_after: float = Field(default=600.0, gt=0, description="DeleteAfterTimeout: delete this long after")
    gpu_only: bool = Field(default=False, description="move only pods that request nvidia.com/gpu")
    threads: int = Field(default=8, ge=1, le=256, description="nodes drained at once")
    qps: float = Field(default=200.0, gt=0, description="Kubernetes API writes per second (sustained)")
    burst: int = Field(default=400, ge=1, description="Kubernetes API writes at once")
    lease: float = Field(default=30.0, gt=0, description="claim lease, renewed at a third of it")
    poll: float = Field(default=1.0, gt=0, description="seconds between looks at a node being drained")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="port of /metrics; 0: off")
    owner: str | None = Field(default=None, description="this replica's name in leases (default host/pid)")


class RemediationConfig(BaseModel):
    """The remediation worker (`faultline worker remediation`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mongodb_uri: SecretStr = Field(description="MongoDB connection string; masked in dumps")
    database: str = Field(default="faultline", description="MongoDB database name")
    kubeconfig: Path | None = Field(default=None, description="kubeconfig file; None: in-cluster credentials")
    require_drain: bool = Field(default=True, description="repair only nodes the drainer emptied")
    max_attempts_per_fault: int = Field(default=3, ge=1, description="repairs per fault before the last step")
    repeat_offender: int = Field(
        default=3, ge=1, description="more repairs than this in the window: last step"
    )
    window: float = Field(default=7 * 86400.0, gt=0, description="repeat-offender window, seconds")
    can_replace: bool = Field(
        default=False, description="a cloud provider can replace nodes (last step REPLACE)"
    )
    template: Path | None = Field(
        default=None, description="an external remediator's CR template (YAML) instead of RemediationRequests"
    )
    external_timeout: float = Field(
        default=1800.0, gt=0, description="template: wait this long for the faults to clear, then escalate"
    )
    threads: int = Field(default=4, ge=1, le=64, description="claims worked on at once")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="port of /metrics; 0: off")
    owner: str | None = Field(default=None, description="this replica's name in leases (default host/pid)")


class JanitorConfig(BaseModel):
    """The janitor (`faultline worker janitor`). Durations in seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mongodb_uri: SecretStr = Field(description="MongoDB connection string; masked in dumps")
    database: str = Field(default="faultline", description="MongoDB database name")
    kubeconfig: Path | None = Field(default=None, description="kubeconfig file; None: in-cluster credentials")
    namespace: str = Field(default="faultline-system", description="where repair Jobs run")
    service_account: str = Field(default="faultline-janitor", description="the repair Jobs' ServiceAccount")
    image: str = Field(default="ghcr.io/faultline/janitor:latest", description="the repair Jobs' image")
    reboot_timeout: float = Field(
        default=1200.0, gt=0, description="wait this long for a new boot id + Ready"
    )
    job_timeout: float = Field(default=600.0, gt=0, description="wait this long for a GPU reset Job")
    validate_timeout: float = Field(default=600.0, gt=0, description="wait this long for healthy reports")
    threads: int = Field(default=4, ge=1, le=64, description="repairs carried out at once")
    lease: float = Field(default=30.0, gt=0, description="claim lease, renewed at a third of it")
    poll: float = Field(default=2.0, gt=0, description="seconds between looks at a node or Job")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="port of /metrics; 0: off")
    owner: str | None = Field(default=None, description="this replica's name in leases (default host/pid)")
    cloud: Literal["none", "aws", "gcp", "azure", "oci"] = Field(
        default="none", description="the cloud provider API that replaces (and may reboot) nodes"
    )
    reboot_via: Literal["job", "cloud"] = Field(
        default="job", description="reboot by a Job on the node, or by the provider's API (for hung nodes)"
    )
    cloud_endpoint: str | None = Field(
        default=None, description="the provider API's base URL (other partitions, sovereign clouds, proxies)"
    )
    aws_region: str | None = Field(default=None, description="AWS region; None: from the node's zone")
    oci_config: Path = Field(default=Path("~/.oci/config"), description="OCI API key config file")
    oci_profile: str = Field(default="DEFAULT", description="profile in the OCI config file")

    @model_validator(mode="after")
    def _cloud_reboot_needs_cloud(self) -> JanitorConfig:
        if self.reboot_via == "cloud" and self.cloud == "none":
            raise ValueError("reboot_via=cloud needs a cloud provider (cloud)")
        return self
