"""Settings of preflight: the admission webhook (`faultline webhook`) and the init container it injects
(`faultline preflight`)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from faultline import preflight
from faultline.config.base import Component, Duration, KubeFields, MetricsFields, Seconds, alias
from faultline.models import Action

GANG_KEYS = (
    preflight.GANG,
    "jobset.sigs.k8s.io/jobset-name",
    "leaderworkerset.sigs.k8s.io/group-key",
    "training.kubeflow.org/job-name",
    "kueue.x-k8s.io/pod-group-name",
    "scheduling.k8s.io/group-name",
    "volcano.sh/job-name",
)
GANG_SIZE_KEYS = (
    preflight.GANG_SIZE,
    "leaderworkerset.sigs.k8s.io/size",
    "kueue.x-k8s.io/pod-group-total-count",
)
GANG_ROUND_KEYS = ("jobset.sigs.k8s.io/restart-attempt",)
# what the init container may be told through `preflight_settings` (FAULTLINE_<NAME>): the preflight's own
# fields, less those the webhook sets from the pod itself
_SET_BY_WEBHOOK = {
    "node",
    "pod",
    "namespace",
    "checks",
    "expected_gpus",
    "expected_model",
    "gang",
    "gang_size",
    "ingest_socket",
    "journal_dirs",
    "sim_dir",
}


def _checks(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return preflight.parse_checks(value)
    if isinstance(value, list | tuple):
        return preflight.parse_checks(",".join(str(v) for v in value))
    raise ValueError(f"not a list of checks: {value!r}")


class PreflightConfig(Component, KubeFields):
    """The preflight init container (`faultline preflight`), as the webhook injects it."""

    node: str = Field(
        min_length=1,
        validation_alias=alias("node", "NODE_NAME"),
        description="the Node the pod runs on (downward API spec.nodeName)",
    )
    pod: str = Field(
        default="",
        validation_alias=alias("pod", "POD_NAME"),
        description="the pod's name (downward API metadata.name): its member name in its gang",
    )
    namespace: str = Field(
        default="",
        validation_alias=alias("namespace", "POD_NAMESPACE"),
        description="the pod's namespace (downward API metadata.namespace): where its gang's Lease is",
    )
    checks: tuple[str, ...] = Field(
        default=tuple(preflight.CHECKS),
        description=f"the checks to run, of {', '.join(preflight.CHECKS)}",
    )
    gpu_backend: Literal["nvml", "sim"] = Field(
        default="nvml", description="how the GPUs are read: nvml (the pod's GPUs) or sim (the simulator)"
    )
    sim_dir: Path | None = Field(default=None, description="simulator control directory (sim backend)")
    gpus: int = Field(default=8, ge=1, le=16, description="simulated GPUs (count, sim backend)")
    expected_gpus: int | None = Field(
        default=None,
        ge=1,
        description="GPUs the pod was given (count; the webhook sets it); unset: not checked",
    )
    expected_model: str = Field(
        default="",
        description="a part of the GPU model's name the pod asks for (case-insensitive); empty: any",
    )
    pcie_generation: bool = Field(
        default=False,
        description="also fail a PCIe link slower than its maximum generation (idle GPUs lower their link "
        "speed to save power, so only where the GPUs are held at full speed)",
    )
    nvlink_min_active: int | None = Field(
        default=None,
        ge=0,
        description="pass a GPU with at least this many active NVLinks (count) even when others are "
        "inactive; unset: any inactive link fails",
    )
    xid_min_action: Action = Field(
        default=Action.RESTART_VM,
        description="the xid check fails on kernel-log faults since boot whose repair is at least this (what "
        "a GPU reset repairs may have been repaired since: the remap and ecc checks judge it)",
    )
    journal_dirs: tuple[Path, ...] = Field(
        default=(),
        description="read the kernel's journal of this boot from these directories (the xid check)",
    )
    kmsg: Path | None = Field(
        default=None,
        description="read the kernel's ring buffer from this kmsg device or file (the xid check)",
    )
    dcgm_host: str = Field(
        default="", description="DCGM host engine HOST:PORT for diagnostics (the dcgm check); empty: none"
    )
    dcgm_diag_level: int = Field(
        default=0, ge=0, le=4, description="DCGM diagnostics level, as dcgmi diag -r (1 quick - 4); 0: none"
    )
    check_timeout: Seconds = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="the checks fail as PREFLIGHT-HUNG when they take longer (duration): a GPU call that "
        "does not return is a hung driver",
    )
    fail_on_error: bool = Field(
        default=False,
        description="a checker's own error (the checks could not run: not a finding on the GPUs) fails the "
        "pod; false: a one-line warning in the log and termination message, and the pod starts unchecked",
    )
    ingest_socket: Path | None = Field(
        default=None,
        description="the node agent's gRPC ingest socket: findings are reported there; unset: not",
    )
    termination_log: Path = Field(
        default=Path("/dev/termination-log"),
        description="where the reason for a failure is written (the pod's status)",
    )
    gang: str = Field(default="", description="the pod's gang (the webhook sets it); empty: none")
    gang_size: int | None = Field(
        default=None, ge=1, description="members the gang has (count); unset: unknown"
    )
    gang_timeout: Seconds = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="how long a member that passed waits for the rest (duration)",
    )
    gang_timeout_action: Literal["fail", "proceed"] = Field(
        default="fail", description="what a member does when its gang did not all pass in gang_timeout"
    )
    gang_poll: Seconds = Field(
        default=1.0,
        ge=0.05,
        le=60,
        description="between reads of the gang's Lease (duration); at least size/50 s, so a gang reads at "
        "most about 50 times a second in all",
    )
    gang_failure_hold: Seconds = Field(
        default=120.0,
        ge=1,
        description="a failed round of a gang stays failed this long (duration) for members that arrive "
        "later; after it, the next member opens a new round",
    )

    _check_names = field_validator("checks", mode="before")(_checks)

    @model_validator(mode="after")
    def _gang_needs_pod(self) -> PreflightConfig:
        if self.gang and not (self.pod and self.namespace):
            raise ValueError(
                "gang needs pod and namespace (POD_NAME and POD_NAMESPACE from the downward API)"
            )
        return self


class WebhookConfig(Component, KubeFields, MetricsFields):
    """The preflight admission webhook (`faultline webhook`)."""

    address: str = Field(default="0.0.0.0", min_length=1, description="address the HTTPS server listens on")  # noqa: S104
    port: int = Field(default=8443, ge=1, le=65535, description="HTTPS port (POST /mutate, GET /healthz)")
    namespace: str = Field(
        default="faultline-system",
        min_length=1,
        validation_alias=alias("namespace", "POD_NAMESPACE"),
        description="the webhook's own namespace: where its TLS Secret is",
    )
    service: str = Field(
        default="faultline-webhook",
        min_length=1,
        description="the webhook's Service: its certificate names it",
    )
    hosts: tuple[str, ...] = Field(
        default=(), description="more names or addresses the certificate is valid for (e.g. 127.0.0.1)"
    )
    tls_source: Literal["secret", "files"] = Field(
        default="secret",
        description="secret: the webhook makes and rotates its CA and certificate in tls_secret and sets "
        "the configuration's caBundle; files: read tls_cert/tls_key (cert-manager issues them and injects "
        "the CA)",
    )
    tls_secret: str = Field(
        default="faultline-webhook-tls", min_length=1, description="the TLS Secret's name"
    )
    tls_cert: Path | None = Field(default=None, description="certificate file (tls_source files)")
    tls_key: Path | None = Field(default=None, description="private key file (tls_source files)")
    webhook_config: str = Field(
        default="",
        description="the MutatingWebhookConfiguration whose caBundle this webhook sets; empty: none",
    )
    ca_validity: Duration = Field(
        default=dt.timedelta(days=3650), ge=dt.timedelta(days=1), description="how long a new CA is valid"
    )
    cert_validity: Duration = Field(
        default=dt.timedelta(days=365),
        ge=dt.timedelta(hours=1),
        description="how long a new serving certificate is valid (never past its CA)",
    )
    rotate_before: Duration = Field(
        default=dt.timedelta(days=30),
        gt=dt.timedelta(0),
        description="renew a certificate (or the CA) once less than this is left of it",
    )
    check_interval: Seconds = Field(
        default=60.0,
        ge=1,
        le=86400,
        description="between certificate syncs (duration): renewals, the rotated certificate served, the "
        "caBundle set again (after an upgrade reset it)",
    )
    namespace_ttl: Seconds = Field(
        default=10.0, ge=0, le=3600, description="how long a namespace's labels are reused (duration)"
    )
    max_concurrent: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="admission requests answered at once (a thread each); a connection past this is closed "
        "unanswered and counted, so a flood of slow clients cannot exhaust threads or memory",
    )
    image: str = Field(min_length=1, description="the init container's image: the webhook's own")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="the init container's imagePullPolicy"
    )
    checks: tuple[str, ...] = Field(
        default=tuple(preflight.CHECKS),
        description=f"the checks of a pod that names none ({preflight.SELECT}), of "
        f"{', '.join(preflight.CHECKS)}",
    )
    gang_keys: tuple[str, ...] = Field(
        default=GANG_KEYS,
        description="labels or annotations naming a pod's gang, the first the pod carries wins",
    )
    gang_size_keys: tuple[str, ...] = Field(
        default=GANG_SIZE_KEYS, description="labels or annotations giving the gang's size (the first present)"
    )
    gang_round_keys: tuple[str, ...] = Field(
        default=GANG_ROUND_KEYS,
        description="labels or annotations that make each value a gang of its own (a job's restart attempt)",
    )
    ingest_socket: Path | None = Field(
        default=Path("/run/faultline/ingest.sock"),
        description="the node agent's ingest socket on the hosts (agent.ingestSocket), mounted into the init "
        "container; unset: findings are not reported (the pod still fails)",
    )
    journal_dirs: tuple[Path, ...] = Field(
        default=(Path("/var/log/journal"), Path("/run/log/journal")),
        description="host journal directories mounted read-only into the init container (the xid check); "
        "empty: no kernel log is read",
    )
    sim_dir: Path | None = Field(
        default=None,
        description="the GPU simulator's control directory on the hosts (tests and the demo), mounted "
        "read-only into the init container, which then checks the simulated GPUs (gpu_backend sim); unset: "
        "the pod's GPUs through NVML",
    )
    preflight_settings: dict[str, str] = Field(
        default_factory=dict,
        description="more settings of the init container by name (faultline config show preflight), e.g. "
        "{gang_timeout: 10m, dcgm_diag_level: '1', dcgm_host: '$(HOST_IP):5555'}",
    )
    image_pull_secrets: tuple[str, ...] = Field(
        default=(),
        description="image pull Secrets added to each pod the init container is injected into (a private "
        "registry's; each must exist in that pod's namespace); one the pod names already is not added twice",
    )
    init_resources: dict[str, dict[str, str]] = Field(
        default_factory=lambda: {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "256Mi"},
        },
        description="the init container's cpu/memory requests and limits (its nvidia.com/gpu are the pod's)",
    )

    _check_names = field_validator("checks", mode="before")(_checks)

    @field_validator("preflight_settings", mode="before")
    @classmethod
    def _as_environment(cls, value: object) -> object:
        """Values as the init container's environment carries them: true/false, numbers as written,
        lists as JSON (what the preflight's settings read from FAULTLINE_<NAME>)."""
        if not isinstance(value, dict):
            return value
        out = {}
        for key, item in value.items():
            if isinstance(item, bool):
                out[key] = "true" if item else "false"
            elif isinstance(item, int | float):
                out[key] = str(item)
            elif isinstance(item, list | tuple | dict):
                out[key] = json.dumps(item)
            else:
                out[key] = item
        return out

    @field_validator("preflight_settings")
    @classmethod
    def _known_settings(cls, value: dict[str, str]) -> dict[str, str]:
        known = set(PreflightConfig.model_fields) - _SET_BY_WEBHOOK
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown preflight settings {unknown}; settable: {', '.join(sorted(known))}")
        return value

    @field_validator("ingest_socket", "journal_dirs", "sim_dir")
    @classmethod
    def _host_paths(cls, value: Path | tuple[Path, ...] | None) -> Path | tuple[Path, ...] | None:
        """Mounted from the host: the kubelet takes absolute paths only."""
        for path in value if isinstance(value, tuple) else [value]:
            if path is not None and not path.is_absolute():
                raise ValueError(f"a path on the host must be absolute, not {str(path)!r}")
        return value

    @field_validator("init_resources")
    @classmethod
    def _resources(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        bad = sorted(set(value) - {"requests", "limits"})
        if bad:
            raise ValueError(f"{bad}: only requests and limits")
        for part, values in value.items():
            if "nvidia.com/gpu" in values:
                raise ValueError(f"{part}: nvidia.com/gpu is the pod's own count, not a setting")
        return value

    @model_validator(mode="after")
    def _tls(self) -> WebhookConfig:
        if self.tls_source == "files" and not (self.tls_cert and self.tls_key):
            raise ValueError("tls_source files needs tls_cert and tls_key")
        return self

    @model_validator(mode="after")
    def _simulated(self) -> WebhookConfig:
        backend = self.preflight_settings.get("gpu_backend", "sim")
        if self.sim_dir is not None and backend != "sim":
            raise ValueError(
                f"sim_dir has the init container check simulated GPUs; preflight_settings gpu_backend "
                f"{backend!r} contradicts it"
            )
        return self
