"""The workers' settings: for each, the `...Tuning` part its worker class takes (`workers.<name>.Settings`
extends it with the objects loaded from the rest) and the component model the CLI resolves."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from faultline.config.base import (
    Component,
    Duration,
    EvidenceFields,
    KubeFields,
    Part,
    StoreFields,
    VerifyFields,
    WorkerFields,
)

_SECOND = dt.timedelta(seconds=1)
_ZERO = dt.timedelta(0)
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_QUALIFIED = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
# what a held node carries by default: Karpenter (v1) does not voluntarily disrupt a Node annotated
# karpenter.sh/do-not-disrupt, nor the cluster autoscaler scale down one annotated scale-down-disabled
HOLD_ANNOTATIONS = {
    "karpenter.sh/do-not-disrupt": "true",
    "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
}
# other remediators' markers on a node they are taking away (`workers.others` reads them)
YIELD_TO = (
    "taint:karpenter.sh/disrupted",  # Karpenter v1
    "taint:karpenter.sh/disruption",  # Karpenter before v1
    "taint:ToBeDeletedByClusterAutoscaler",
)


def _lease() -> Duration:
    return Field(
        default=dt.timedelta(seconds=30), ge=_SECOND,
        description="claim lease (duration), renewed at a third of it: a replica that dies holds its work "
        "this long before another takes it over",
    )  # fmt: skip


def _qps() -> float:
    return Field(
        default=200.0,
        gt=0,
        description="Kubernetes API writes per second, sustained (protects the API server)",
    )


def _burst() -> int:
    return Field(default=400, ge=1, description="Kubernetes API writes allowed at once above the rate")


class QuarantineTuning(Part):
    hold_down: Duration = Field(
        default=dt.timedelta(seconds=60), ge=_ZERO,
        description="release a node this long (duration) after its last fault resolved (flapping faults)",
    )  # fmt: skip
    max_fault_age: Duration = Field(
        default=dt.timedelta(hours=1), gt=_ZERO,
        description="faults last seen longer ago (duration) when first claimed are recorded, not acted on "
        "(a backlog after an outage)",
    )  # fmt: skip
    dry_run: bool = Field(default=False, description="record what would be done, change no node")
    lease: Duration = _lease()
    threads: int = Field(default=16, ge=1, le=256, description="claims worked on at once (threads)")
    resync_interval: Duration = Field(
        default=dt.timedelta(seconds=5), gt=_ZERO,
        description="revisit held nodes and reread the work list this often (duration)",
    )  # fmt: skip
    gpu_count_ttl: Duration = Field(
        default=dt.timedelta(seconds=30), gt=_ZERO,
        description="reuse the count of GPU nodes (the breaker's denominator) this long (duration)",
    )  # fmt: skip
    agent_stale_after: Duration = Field(
        default=dt.timedelta(minutes=15), ge=dt.timedelta(minutes=5),
        description="set a node's faultline conditions Unknown when its agent has not reported for this "
        "long (duration; the agent reports at least every 4 minutes); at least 5m",
    )  # fmt: skip
    hold_annotations: dict[str, str] = Field(
        default_factory=lambda: dict(HOLD_ANNOTATIONS),
        description="annotations put on a node while faultline holds it (its repair included) and removed "
        "at release, unless someone else set them first: other systems told to leave the node alone "
        "(Karpenter's do-not-disrupt, the cluster autoscaler's scale-down-disabled); {}: none",
    )  # fmt: skip
    qps: float = _qps()
    burst: int = _burst()

    @field_validator("hold_annotations")
    @classmethod
    def _annotation_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _QUALIFIED.fullmatch(key) or len(key.rpartition("/")[2]) > 63:
                raise ValueError(f"hold_annotations: {key!r} is not an annotation key ([prefix/]name)")
        return value


class QuarantineConfig(Component, StoreFields, KubeFields, WorkerFields, VerifyFields, QuarantineTuning):
    """The quarantine worker (`faultline worker quarantine`)."""

    rules: Path | None = Field(
        default=None, description="quarantine rules YAML file; unset: the built-in rules"
    )
    breaker_window: Duration = Field(
        default=dt.timedelta(minutes=10), gt=_ZERO,
        description="circuit breaker's sliding window (duration) over which quarantines are counted",
    )  # fmt: skip
    breaker_max_share: float | None = Field(
        default=0.1, gt=0, le=1,
        description="open the breaker past this share (0-1) of GPU nodes quarantined in the window; "
        "null: no share limit",
    )  # fmt: skip
    breaker_max_count: int | None = Field(
        default=None, ge=1, description="open the breaker past this many nodes quarantined in the window"
    )
    breaker_max_held_share: float | None = Field(
        default=0.1, gt=0, le=1,
        description="trip the breaker rather than hold more than this share (0-1) of the GPU nodes at "
        "once (a storm that comes slower than the window still stops there); null: no share cap",
    )  # fmt: skip
    breaker_max_held: int = Field(
        default=50, ge=0,
        description="trip the breaker rather than hold more than this many nodes at once (the bound on "
        "a large fleet, where 10 % is many nodes); 0: no cap",
    )  # fmt: skip


class DrainTuning(Part):
    default_mode: Literal["Immediate", "AllowCompletion", "DeleteAfterTimeout"] = Field(
        default="Immediate", description="drain mode of namespaces without the faultline.io/drain-mode label"
    )
    delete_after: Duration = Field(
        default=dt.timedelta(minutes=10), gt=_ZERO,
        description="DeleteAfterTimeout: delete pods this long (duration) after their eviction was asked",
    )  # fmt: skip
    gpu_only: bool = Field(default=False, description="move only pods that request nvidia.com/gpu")
    system_namespaces: tuple[str, ...] = Field(
        default=("kube-system",),
        description="namespaces whose pods are never evicted (recorded as skipped); the chart adds its "
        "own namespace",
    )
    partial_gpu_drain: bool = Field(
        default=False,
        description="when every fault behind a quarantine is on named GPUs and needs at most a GPU reset, "
        "move only the pods using those GPUs (from the node agent's pod-resources mapping; the agent "
        "needs pod_resources_socket)",
    )
    partial_wait: Duration = Field(
        default=dt.timedelta(minutes=2), ge=_ZERO,
        description="partial drains: wait this long (duration) for the agent's GPU -> pod mapping read "
        "since the cordon, then drain the whole node",
    )  # fmt: skip
    lease: Duration = _lease()
    threads: int = Field(default=8, ge=1, le=256, description="nodes drained at once (threads)")
    poll: Duration = Field(
        default=dt.timedelta(seconds=1),
        gt=_ZERO,
        description="between looks at a node being drained (duration)",
    )
    backoff_max: Duration = Field(
        default=dt.timedelta(seconds=30), gt=_ZERO,
        description="longest wait (duration) before retrying an eviction a PodDisruptionBudget refused",
    )  # fmt: skip
    resync_interval: Duration = Field(
        default=dt.timedelta(seconds=2), gt=_ZERO, description="reread the work list this often (duration)"
    )
    namespace_ttl: Duration = Field(
        default=dt.timedelta(seconds=30), gt=_ZERO,
        description="reuse a namespace's drain-mode label this long (duration)",
    )  # fmt: skip
    qps: float = _qps()
    burst: int = _burst()

    @field_validator("system_namespaces")
    @classmethod
    def _namespace_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in names if not _NAMESPACE.fullmatch(n)]
        if bad:
            raise ValueError(f"not namespace names (lowercase RFC 1123 labels): {', '.join(map(repr, bad))}")
        return names


class DrainConfig(Component, StoreFields, KubeFields, WorkerFields, DrainTuning):
    """The drainer (`faultline worker drain`)."""


class RemediationTuning(Part):
    require_drain: bool = Field(default=True, description="repair only nodes the drainer emptied")
    external_timeout: Duration = Field(
        default=dt.timedelta(minutes=30), gt=_ZERO,
        description="template CRs: wait this long (duration) for the faults to clear, then escalate",
    )  # fmt: skip
    lease: Duration = _lease()
    threads: int = Field(default=4, ge=1, le=64, description="claims worked on at once (threads)")
    resync_interval: Duration = Field(
        default=dt.timedelta(seconds=2), gt=_ZERO, description="reread the work list this often (duration)"
    )
    yield_to: tuple[str, ...] = Field(
        default=YIELD_TO,
        description="markers of another system repairing or removing a node (taint:KEY, "
        "condition:TYPE=STATUS, label:KEY[=VALUE], annotation:KEY[=VALUE]): while a node carries one, no "
        "repair round is decided for it (it stays held); the default: Karpenter's and the cluster "
        "autoscaler's disruption taints",
    )  # fmt: skip


class RepairCaps(Part):
    """The repair ladder's limits (`workers.remedies.Caps`)."""

    max_attempts_per_fault: int = Field(
        default=3, ge=1, description="repairs per fault (count) before the last step of the ladder"
    )
    repeat_offender: int = Field(
        default=3, ge=1, description="a node repaired more often (count) in the window gets the last step"
    )
    window: Duration = Field(
        default=dt.timedelta(days=7), gt=_ZERO, description="repeat-offender window (duration)"
    )
    can_replace: bool = Field(
        default=False, description="a cloud provider can replace nodes (last step REPLACE)"
    )


class RemediationConfig(
    Component, StoreFields, KubeFields, WorkerFields, VerifyFields, RemediationTuning, RepairCaps
):
    """The remediation worker (`faultline worker remediation`)."""

    template: Path | None = Field(
        default=None,
        description="an external remediator's CR template (YAML file) written instead of RemediationRequests",
    )


_REBOOT = ("nsenter", "-t", "1", "-m", "-u", "-i", "-n", "--", "systemctl", "reboot")


class JanitorTuning(Part):
    namespace: str = Field(default="faultline-system", min_length=1, description="where repair Jobs run")
    service_account: str = Field(default="faultline-janitor", description="the repair Jobs' ServiceAccount")
    image_pull_secrets: tuple[str, ...] = Field(
        default=(),
        description="the repair Jobs' image pull Secrets (in their namespace): a private registry's",
    )
    image: str = Field(
        default="ghcr.io/faultline/faultline:latest",
        description="the repair Jobs' image: faultline's own (one image for every component); the chart "
        "sets the reference it runs, by digest where given",
    )
    reboot_command: tuple[str, ...] = Field(
        default=_REBOOT, min_length=1, description="the reboot Job's command (run in the host's namespaces)"
    )
    gpu_client_labels: tuple[str, ...] = Field(
        default=(
            "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.dcgm",
            "nvidia.com/gpu.deploy.dcgm-exporter",
        ),
        description="node labels whose DaemonSets hold the GPUs (the GPU Operator's operands): each that is "
        "true is set to paused-for-gpu-reset while a GPU reset runs, and back after (faultline's agent "
        "steps aside too)",
    )  # fmt: skip
    reset_command: tuple[str, ...] = Field(
        default=(),
        validate_default=True,
        description="the GPU reset Job's command, given the GPUs' bus ids; empty: the built-in script",
    )
    bug_report_dir: str = Field(
        default="/var/lib/faultline/bug-reports", pattern=r"^(/[^\x00]*)?$",
        description="where a repair Job leaves the node's nvidia-bug-report output before it acts (a host "
        "path the node agent reads: its state directory's bug-reports/); empty: no bug report",
    )  # fmt: skip
    bug_report_timeout: Duration = Field(
        default=dt.timedelta(minutes=5), gt=_ZERO,
        description="the longest nvidia-bug-report.sh may run before the repair goes ahead without it",
    )  # fmt: skip
    record_only: bool = Field(
        default=False,
        description="repair Jobs print the command they would run and exit 0, unprivileged and outside the "
        "host's namespaces; a reboot then counts as done when its Job succeeds (for test machines: a real "
        "node of the local cluster must never be rebooted or reset)",
    )
    reboot_timeout: Duration = Field(
        default=dt.timedelta(minutes=20), gt=_ZERO,
        description="wait this long (duration) for a new boot id and Ready after a reboot",
    )  # fmt: skip
    job_timeout: Duration = Field(
        default=dt.timedelta(minutes=10),
        gt=_ZERO,
        description="wait this long (duration) for a GPU reset Job",
    )
    validate_timeout: Duration = Field(
        default=dt.timedelta(minutes=10), gt=_ZERO,
        description="wait this long (duration) for healthy reports after a repair",
    )  # fmt: skip
    poll: Duration = Field(
        default=dt.timedelta(seconds=2), gt=_ZERO, description="between looks at a node or Job (duration)"
    )
    lease: Duration = _lease()
    threads: int = Field(
        default=4,
        ge=1,
        le=64,
        description="repairs looked at at once (threads); a repair that waits holds none",
    )
    job_annotations: dict[str, str] = Field(default_factory=dict, description="annotations on repair Jobs")
    reboot_via: Literal["job", "cloud"] = Field(
        default="job", description="reboot by a Job on the node, or by the provider's API (for hung nodes)"
    )
    cloud_retries: int = Field(
        default=3, ge=1, description="tries (count) of a provider call that fails transiently"
    )
    user_actions: tuple[Literal["GPU_RESET", "REBOOT", "REPLACE"], ...] = Field(
        default=("GPU_RESET", "REBOOT"),
        description="what a RemediationRequest created by a person may ask for; empty: every such "
        "request is refused. REPLACE (terminate the instance for a new one) is not in the default: a "
        "person opts in to it here",
    )
    max_repairs_in_flight: int = Field(
        default=10, ge=0,
        description="fleet-wide cap on repair rounds carried out at once (reboots, GPU resets, "
        "replacements) over every janitor replica; a round over it waits, it does not fail; 0: no cap",
    )  # fmt: skip
    max_replacements_in_flight: int = Field(
        default=2, ge=0,
        description="fleet-wide cap on cloud replacements (terminate/replace, which cannot be undone) at "
        "once; a round over it waits; 0: no cap",
    )  # fmt: skip
    user_cordon: bool = Field(
        default=True,
        description="cordon the node while a person's RemediationRequest is carried out, and uncordon it "
        "after unless it was cordoned already (draining stays the operator's: kubectl drain first)",
    )


class JanitorConfig(
    Component, StoreFields, KubeFields, WorkerFields, EvidenceFields, JanitorTuning, RepairCaps
):
    """The janitor (`faultline worker janitor`). The repair caps apply to the RemediationRequests people
    create (give it the remediation worker's values)."""

    cloud: Literal["none", "aws", "gcp", "azure", "oci"] = Field(
        default="none", description="the cloud provider API that replaces (and may reboot) nodes"
    )
    cloud_endpoint: str | None = Field(
        default=None, description="the provider API's base URL (other partitions, sovereign clouds, proxies)"
    )
    aws_region: str | None = Field(default=None, description="AWS region; unset: from the node's zone")
    oci_config: Path = Field(default=Path("~/.oci/config"), description="OCI API key config file")
    oci_profile: str = Field(default="DEFAULT", description="profile in the OCI config file")

    @model_validator(mode="after")
    def _cloud_reboot_needs_cloud(self) -> JanitorConfig:
        if self.reboot_via == "cloud" and self.cloud == "none":
            raise ValueError("reboot_via=cloud needs a cloud provider (cloud)")
        return self
