"""The admission webhook's decision, pure: an AdmissionReview (v1) request for a Pod in, the response out
(allowed, or refused with a message; a JSONPatch adding the preflight init container when it applies).

A pod gets the init container when all of these hold:
- it is a Pod being created, in a namespace labelled faultline.io/preflight=enabled (the webhook's
  namespaceSelector makes the API server ask only for those; the labels are checked here again);
- some container requests nvidia.com/gpu (limits, or requests);
- it does not opt out (annotation faultline.io/preflight: "false");
- it does not have the init container already (a re-invocation, or a pod made from one that had it).

A pod whose annotations are wrong is refused, naming the annotation, the bad value and the valid ones:
faultline.io/preflight other than "true"/"false", faultline.io/preflight-checks naming an unknown check,
a gang size that is not a positive integer. Everything else is allowed unchanged.

The init container goes first among the init containers (before a model download, say), runs
`faultline preflight` from the webhook's own image, requests as many nvidia.com/gpu as the pod's
effective request (the larger of the app containers' sum and any init container's), so the device plugin
hands it the GPUs the pod's containers will get (devices given to an init container are reused by the
containers after it), and learns its node, pod and namespace from the downward API.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultline import preflight
from workers import gang

ALLOWED_OPT = {"true": True, "false": False}


@dataclass(frozen=True)
class InjectSettings:
    """How the init container is made (from the webhook's settings)."""

    image: str
    pull_policy: str = "IfNotPresent"
    checks: tuple[str, ...] = tuple(preflight.CHECKS)
    gang_keys: tuple[str, ...] = ()
    gang_size_keys: tuple[str, ...] = ()
    gang_round_keys: tuple[str, ...] = ()
    ingest_socket: Path | None = None  # the agent's socket on the host; None: nothing is reported
    journal_dirs: tuple[Path, ...] = ()  # host journal directories mounted read-only (the xid check)
    sim_dir: Path | None = None  # the GPU simulator's control directory on the host; None: NVML
    env: Mapping[str, str] = field(default_factory=dict)  # more settings of the preflight, FAULTLINE_<NAME>
    resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # cpu/memory requests/limits
    args: tuple[str, ...] = ("preflight",)


def gpu_count(spec: Mapping[str, Any]) -> int:
    """The pod's effective nvidia.com/gpu request: max(sum over app containers, max over init containers);
    0 when none asks (or a value is not an integer: the API server's validation refuses it later)."""

    def one(container: Mapping[str, Any]) -> int:
        res = container.get("resources") or {}
        for part in ("limits", "requests"):
            value = (res.get(part) or {}).get(preflight.GPU_RESOURCE)
            if value is not None:
                text = str(value).strip()
                return int(text) if text.isdigit() else 0
        return 0

    apps = sum(one(c) for c in spec.get("containers") or [])
    inits = max((one(c) for c in spec.get("initContainers") or []), default=0)
    return max(apps, inits)


def review(
    body: Mapping[str, Any], settings: InjectSettings, *, namespace_labels: Mapping[str, str] | None
) -> dict[str, Any]:
    """The AdmissionReview to answer `body` with. `namespace_labels`: the pod's namespace's labels as
    read now (None: they could not be read; the API server's namespaceSelector already chose it)."""
    request = body.get("request") or {}
    uid = str(request.get("uid", ""))
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    decision = _decide(request, settings, namespace_labels)
    if isinstance(decision, str):  # refused
        response.update(allowed=False, status={"code": 400, "reason": "BadRequest", "message": decision})
    elif decision:
        response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(decision).encode()).decode())
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _decide(
    request: Mapping[str, Any], settings: InjectSettings, namespace_labels: Mapping[str, str] | None
) -> list[dict[str, Any]] | str:
    """The patch ([] : allowed unchanged) or the refusal's message."""
    kind = request.get("kind") or {}
    if (kind.get("group", ""), kind.get("kind")) != ("", "Pod") or request.get("operation") != "CREATE":
        return []
    if request.get("subResource"):
        return []
    if namespace_labels is not None and namespace_labels.get(preflight.NAMESPACE_LABEL) != preflight.ENABLED:
        return []
    pod = request.get("object") or {}
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    count = gpu_count(spec)
    if count == 0:
        return []
    opt = str(annotations.get(preflight.OPT_OUT, "true")).strip().lower()
    if opt not in ALLOWED_OPT:
        return (
            f'annotation {preflight.OPT_OUT}: {annotations.get(preflight.OPT_OUT)!r} is not "true" or '
            f'"false" ("false" skips faultline\'s preflight for this pod)'
        )
    if not ALLOWED_OPT[opt]:
        return []
    checks = settings.checks
    if preflight.SELECT in annotations:
        try:
            checks = preflight.parse_checks(str(annotations[preflight.SELECT]))
        except ValueError as exc:
            return f"annotation {preflight.SELECT}: {exc}"
    try:
        member_of = gang.identify(
            labels,
            annotations,
            keys=settings.gang_keys,
            size_keys=settings.gang_size_keys,
            round_keys=settings.gang_round_keys,
        )
    except ValueError as exc:
        return f"gang of this pod: {exc}"
    inits = spec.get("initContainers") or []
    if any(c.get("name") == preflight.CONTAINER for c in inits):
        return []  # already there
    container = _container(settings, checks, count, str(annotations.get(preflight.MODEL, "")), member_of)
    patch: list[dict[str, Any]] = []
    if inits:
        patch.append({"op": "add", "path": "/spec/initContainers/0", "value": container})
    else:
        patch.append({"op": "add", "path": "/spec/initContainers", "value": [container]})
    volumes = _volumes(settings)
    taken = {v.get("name") for v in spec.get("volumes") or []}
    new = [v for v in volumes if v["name"] not in taken]
    if new and spec.get("volumes"):
        patch += [{"op": "add", "path": "/spec/volumes/-", "value": v} for v in new]
    elif new:
        patch.append({"op": "add", "path": "/spec/volumes", "value": new})
    return patch


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _volumes(settings: InjectSettings) -> list[dict[str, Any]]:
    out = []
    if settings.ingest_socket is not None:
        out.append(
            {
                "name": "faultline-preflight-ingest",
                "hostPath": {"path": str(settings.ingest_socket.parent), "type": "Directory"},
            }
        )
    for i, directory in enumerate(settings.journal_dirs):
        out.append({"name": f"faultline-preflight-journal-{i}", "hostPath": {"path": str(directory)}})
    if settings.sim_dir is not None:
        out.append(
            {
                "name": "faultline-preflight-sim",
                "hostPath": {"path": str(settings.sim_dir), "type": "Directory"},
            }
        )
    return out


def _container(
    settings: InjectSettings, checks: Sequence[str], count: int, model: str, member_of: gang.Gang | None
) -> dict[str, Any]:
    env = [
        _field("NODE_NAME", "spec.nodeName"),
        _field("POD_NAME", "metadata.name"),
        _field("POD_NAMESPACE", "metadata.namespace"),
        _field("HOST_IP", "status.hostIP"),
        {"name": preflight.ENV_CHECKS, "value": json.dumps(list(checks))},
        {"name": preflight.ENV_EXPECTED_GPUS, "value": str(count)},
    ]
    if model:
        env.append({"name": preflight.ENV_EXPECTED_MODEL, "value": model})
    if member_of is not None:
        env.append({"name": preflight.ENV_GANG, "value": member_of.name})
        if member_of.size is not None:
            env.append({"name": preflight.ENV_GANG_SIZE, "value": str(member_of.size)})
    mounts: list[dict[str, Any]] = []
    if settings.ingest_socket is not None:
        env.append({"name": "FAULTLINE_INGEST_SOCKET", "value": str(settings.ingest_socket)})
        mounts.append({"name": "faultline-preflight-ingest", "mountPath": str(settings.ingest_socket.parent)})
    for i, directory in enumerate(settings.journal_dirs):
        mounts.append(
            {"name": f"faultline-preflight-journal-{i}", "mountPath": str(directory), "readOnly": True}
        )
    if settings.journal_dirs:
        env.append(
            {"name": "FAULTLINE_JOURNAL_DIRS", "value": json.dumps([str(d) for d in settings.journal_dirs])}
        )
    if settings.sim_dir is not None:  # simulated GPUs: the control files the host's simulator writes
        env += [
            {"name": "FAULTLINE_GPU_BACKEND", "value": "sim"},
            {"name": "FAULTLINE_SIM_DIR", "value": str(settings.sim_dir)},
        ]
        mounts.append(
            {"name": "faultline-preflight-sim", "mountPath": str(settings.sim_dir), "readOnly": True}
        )
    named = {e["name"] for e in env}
    env += [
        {"name": f"FAULTLINE_{name.upper()}", "value": value}
        for name, value in sorted(settings.env.items())
        if f"FAULTLINE_{name.upper()}" not in named
    ]
    resources: dict[str, dict[str, str]] = {part: dict(values) for part, values in settings.resources.items()}
    for part in ("limits", "requests"):
        resources.setdefault(part, {})[preflight.GPU_RESOURCE] = str(count)
    # root only where a host file needs it: the agent's socket is 0600 root and the journal root's
    root = settings.ingest_socket is not None or bool(settings.journal_dirs)
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    security.update(
        {"runAsUser": 0, "runAsNonRoot": False} if root else {"runAsUser": 65532, "runAsNonRoot": True}
    )
    container: dict[str, Any] = {
        "name": preflight.CONTAINER,
        "image": settings.image,
        "imagePullPolicy": settings.pull_policy,
        "args": list(settings.args),
        "env": env,
        "resources": resources,
        "securityContext": security,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }
    if mounts:
        container["volumeMounts"] = mounts
    return container
