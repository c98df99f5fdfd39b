"""Preflight's contract: what the admission webhook (`workers.webhook`) and the init container it injects
(`faultline preflight`) agree on, and what a check concludes.

    webhook ── annotations, labels ──> decides ──> init container with env PREFLIGHT_ENV (+ the settings)
    init container ── checks (sources.preflight) ──> Finding list ──> exit code, termination message,
                     gang record (workers.gang), health events through the node's ingest socket

The check names are here, not with the checks, because the webhook (a worker, which never imports
`sources`) must refuse a pod that asks for a check that does not exist, by name, at admission.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from faultline.models import Action, code_problem

# The checks, in the order they run. `dcgm` runs DCGM's diagnostics (at the configured level) only when
# a level is set and a host engine answers; the others are quick reads of the GPU backend or the kernel log.
CHECKS: dict[str, str] = {
    "count": "the GPUs the pod was given are all visible, and of the expected model",
    "remap": "no row remapping or page retirement pending, and no remapping failure",
    "ecc": "no uncorrectable ECC error since the driver loaded (or the last GPU reset)",
    "nvlink": "every NVLink the GPU has is up",
    "pcie": "each GPU's PCIe link is as wide (and, when asked, as fast) as its maximum",
    "xid": "no fatal XID (or other fatal GPU line) in the kernel log since boot, on the pod's GPUs",
    "dcgm": "DCGM diagnostics pass (when a level is configured and a host engine answers)",
}

# Namespace label and pod annotations (ARCHITECTURE §6: prefix faultline.io)
NAMESPACE_LABEL = "faultline.io/preflight"  # = ENABLED: the webhook's namespaceSelector
ENABLED = "enabled"
OPT_OUT = "faultline.io/preflight"  # pod annotation: "false" skips preflight for this pod
SELECT = "faultline.io/preflight-checks"  # pod annotation: comma-separated check names
MODEL = "faultline.io/preflight-gpu-model"  # pod annotation: the GPU model expected (a substring)
GANG = "faultline.io/gang"  # label or annotation: names the pod's gang explicitly
GANG_SIZE = "faultline.io/gang-size"  # annotation: how many pods the gang has
CONTAINER = "faultline-preflight"  # the init container's name
RESERVED_VOLUME_PREFIX = f"{CONTAINER}-"  # every volume the webhook injects is named so
GPU_RESOURCE = "nvidia.com/gpu"
# characters of the preflight's termination message: the kubelet keeps 4096 bytes of /dev/termination-log,
# and `kubectl describe pod` prints it whole
TERMINATION_MESSAGE = 1024
# The findings that are the node's fault, for the object monitor (`workers.preflight_findings`), on the
# termination message's last line after the people's reason: the kubelet keeps 4096 bytes in all
FINDINGS_MARK = "faultline-findings: "
FINDINGS_LIMIT = 2900  # characters of that line
FINDINGS_MAX = 64  # findings read from one message at most
INJECTED_LABEL = "faultline.io/preflight-injected"  # = "true" on pods the webhook injected (a hint to list)
_PCI = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?")

# What the webhook puts in the init container's environment (the preflight settings' names)
ENV_CHECKS = "FAULTLINE_CHECKS"
ENV_EXPECTED_GPUS = "FAULTLINE_EXPECTED_GPUS"
ENV_EXPECTED_MODEL = "FAULTLINE_EXPECTED_MODEL"
ENV_GANG = "FAULTLINE_GANG"
ENV_GANG_SIZE = "FAULTLINE_GANG_SIZE"


def parse_checks(text: str) -> tuple[str, ...]:
    """`"ecc, remap,XID"` -> ("ecc", "remap", "xid"), in CHECKS order, duplicates dropped; ValueError
    naming each unknown name and the valid ones, or for an empty list."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        listed = ", ".join(repr(n) for n in unknown)
        raise ValueError(f"unknown check {listed}; valid checks: {', '.join(CHECKS)}")
    if not names:
        raise ValueError(
            f'no check named; valid checks: {", ".join(CHECKS)} (opt out with {OPT_OUT}: "false")'
        )
    return tuple(n for n in CHECKS if n in names)


@dataclass(frozen=True)
class Finding:
    """Why a check failed. `node_fault`: the node is at fault (reported through the node's ingest so the
    pipeline quarantines it); False for what is the pod's or the scheduler's business (a GPU model other
    than the one asked for). `gpu`: the GPU's PCI bus id, "" for the node."""

    check: str
    code: str  # e.g. PREFLIGHT-REMAP-PENDING, PREFLIGHT-XID-79
    message: str
    gpu: str = ""
    action: Action = Action.COMPONENT_RESET
    node_fault: bool = True


def reason(findings: list[Finding], *, limit: int = TERMINATION_MESSAGE) -> str:
    """The termination message: one line per finding, most severe first, cut to `limit` characters
    (the kubelet keeps at most 4096 bytes of /dev/termination-log)."""
    order = list(Action)
    ranked = sorted(findings, key=lambda f: (not f.node_fault, -order.index(f.action), f.check, f.gpu))
    lines = [f"preflight {f.check} failed: {f.code}{' on GPU ' + f.gpu if f.gpu else ''}: {f.message}"
             for f in ranked]  # fmt: skip
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def termination(findings: list[Finding]) -> str:
    """The termination message of a failed preflight: the reason for people (`reason`), then the node's
    findings as one JSON line after FINDINGS_MARK (code, GPU, action; as many as fit FINDINGS_LIMIT)."""
    text = reason(findings)
    items: list[dict[str, str]] = []
    for f in findings:
        if not f.node_fault:
            continue
        item = {"code": f.code, "gpu": f.gpu, "action": f.action.value, "check": f.check}
        if len(json.dumps([*items, item], separators=(",", ":"))) > FINDINGS_LIMIT - len(FINDINGS_MARK):
            break
        items.append(item)
    if not items:
        return text
    return f"{text}\n{FINDINGS_MARK}{json.dumps(items, separators=(',', ':'))}"


def read_findings(message: str) -> list[Finding]:
    """The node's findings a termination message carries (see `termination`); ValueError naming what is
    wrong with a line that is not what the preflight writes. A message without the line carries none."""
    lines = [line for line in message.splitlines() if line.startswith(FINDINGS_MARK)]
    if not lines:
        return []
    try:
        items = json.loads(lines[-1][len(FINDINGS_MARK) :])
    except ValueError as exc:
        raise ValueError(f"the findings line is not JSON: {exc}") from None
    if not isinstance(items, list) or len(items) > FINDINGS_MAX:
        raise ValueError(f"the findings line is not a list of at most {FINDINGS_MAX} findings")
    out: list[Finding] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("code", "gpu", "action")
        ):
            raise ValueError(f"finding {i}: not an object with code, gpu and action")
        code, gpu, action = item["code"], item["gpu"], item["action"]
        if not code.startswith("PREFLIGHT-"):
            raise ValueError(f"finding {i}: code {code[:80]!r} is not a PREFLIGHT- code")
        if (why := code_problem(code)) is not None:
            raise ValueError(f"finding {i}: {why}")
        if gpu and not _PCI.fullmatch(gpu):
            raise ValueError(f"finding {i}: gpu {gpu[:80]!r} is not a PCI bus id")
        if action not in {a.value for a in Action}:
            raise ValueError(
                f"finding {i}: action {action[:40]!r} is not one of {', '.join(a.value for a in Action)}"
            )
        check = str(item.get("check") or "")
        out.append(
            Finding(check if check in CHECKS or check == "timeout" else "", code, "", gpu, Action(action))
        )
    return out


# What the injected container's environment may not hold: what makes the interpreter or the loader run other
# code in faultline's image (other webhooks' variables, a proxy's say, are left alone)
CODE_ENV_PREFIXES = ("PYTHON", "LD_", "GCONV_PATH")
TERMINATION_LOG = "/dev/termination-log"
# the ServiceAccount token the API server mounts into every container (the gang's Lease is written with it)
TOKEN_VOLUME_PREFIX = "kube-api-access-"  # noqa: S105 - a volume name, no secret
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"  # noqa: S105 - a path


def container_problem(container: dict[str, object], args: tuple[str, ...] = ("preflight",)) -> str | None:
    """Why a `faultline-preflight` container is not one the webhook would make, as far as its spec shows
    (None: it could be): a command, other args, an environment that loads other code (CODE_ENV_PREFIXES),
    envFrom, a mount of a volume not reserved for it (but the ServiceAccount token's), another termination
    message path. (Its image is checked by
    its caller: the webhook against its setting, the object monitor against the digest the kubelet ran.)"""
    if container.get("command"):
        return "it has a command of its own"
    if list(container.get("args") or []) != list(args):  # type: ignore[call-overload]
        return f"its args are not {list(args)}"
    if container.get("envFrom"):
        return "it has envFrom"
    for item in container.get("env") or []:  # type: ignore[attr-defined]
        name = str(item.get("name", "")) if isinstance(item, dict) else ""
        if name.startswith(CODE_ENV_PREFIXES):
            return f"its environment has {name[:60]!r}, which would run other code than faultline's"
    for mount in container.get("volumeMounts") or []:  # type: ignore[attr-defined]
        name = str(mount.get("name", "")) if isinstance(mount, dict) else ""
        path = str(mount.get("mountPath", "")) if isinstance(mount, dict) else ""
        token = name.startswith(TOKEN_VOLUME_PREFIX) and path == TOKEN_PATH  # the API server's own mount
        if not name.startswith(RESERVED_VOLUME_PREFIX) and not token:
            return f"it mounts {name[:60]!r}, a volume the webhook never gives it"
    if container.get("terminationMessagePath") not in (None, TERMINATION_LOG):
        return "its termination message path is not the kubelet's default"
    return None
