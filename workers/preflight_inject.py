"""The admission webhook's decision, pure: an AdmissionReview (v1) request for a Pod in, the response out
(allowed, or refused with a message; a JSONPatch adding the preflight init container when it applies).

A pod gets the init container when all of these hold:
- it is a Pod being created, in a namespace labelled faultline.io/preflight=enabled (the webhook's
  namespaceSelector makes the API server ask only for those; the labels are checked here again);
- some container requests nvidia.com/gpu (limits, or requests);
- it does not opt out (annotation faultline.io/preflight: "false");
- it does not have the init container already (a re-invocation, or a pod made from one that had it).

The injected volumes are the host's (the agent's ingest socket, the journal, the simulator's directory), so
their names (`RESERVED_VOLUME_PREFIX`, "faultline-preflight-...") are faultline's alone. A pod that brings a
volume under such a name (a crafted "journal" the check would read, next to the real socket it would
report to) or has a container of its own mount one (an application reading the host's journal or writing
to the agent's socket) is refused, naming the volume or container. The one exception is a pod faultline
injected already (a re-invocation): its init container is the webhook's (name, image, args, no command),
the only one that mounts a reserved name, its FAULTLINE_* environment is the one it would give, and its
reserved volumes are exactly the ones it would inject.

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
# every volume the injection adds is named with this prefix (ingest, journal-<i>, sim): a pod's own volume
# or mount under it is refused, so nothing but the injected init container sees the host paths behind them
RESERVED_VOLUME_PREFIX = preflight.RESERVED_VOLUME_PREFIX


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
    image_pull_secrets: tuple[str, ...] = ()  # added to the pod's own (a private registry's)


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
    refused = _reserved_misuse(spec, settings)
    if refused:
        return refused
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
    container = _container(settings, checks, count, str(annotations.get(preflight.MODEL, "")), member_of)
    ours = [c for c in inits if c.get("name") == preflight.CONTAINER]
    if ours:  # already there; its image, args and volumes were checked above, its settings are checked here
        if ours[0].get("envFrom") or _settings_env(ours[0]) != _settings_env(container):
            return (
                f"init container {preflight.CONTAINER!r} is reserved for faultline's preflight: its "
                f"FAULTLINE_* environment is not the one the webhook gives it"
            )
        if (why := preflight.container_problem(ours[0], tuple(settings.args))) is not None:
            return f"init container {preflight.CONTAINER!r} is reserved for faultline's preflight: {why}"
        return []
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
    # where the object monitor looks for failed preflights' findings (a hint: it believes a container only
    # by the image digest the kubelet ran); JSON Patch's "~1" is the key's "/"
    patch += _pull_secrets(spec, settings)
    label = preflight.INJECTED_LABEL.replace("~", "~0").replace("/", "~1")
    if isinstance(meta.get("labels"), dict):
        patch.append({"op": "add", "path": f"/metadata/labels/{label}", "value": "true"})
    else:
        patch.append({"op": "add", "path": "/metadata/labels", "value": {preflight.INJECTED_LABEL: "true"}})
    return patch


def _pull_secrets(spec: Mapping[str, Any], settings: InjectSettings) -> list[dict[str, Any]]:
    """The patch adding the registry's pull Secrets the pod does not name already."""
    have = {s.get("name") for s in spec.get("imagePullSecrets") or []}
    pulls = [{"name": n} for n in settings.image_pull_secrets if n not in have]
    if pulls and spec.get("imagePullSecrets"):
        return [{"op": "add", "path": "/spec/imagePullSecrets/-", "value": p} for p in pulls]
    return [{"op": "add", "path": "/spec/imagePullSecrets", "value": pulls}] if pulls else []


def _settings_env(container: Mapping[str, Any]) -> list[str]:
    """The container's FAULTLINE_* variables (the preflight's settings: which journal it reads, which
    socket it reports to), comparable. Other variables (another webhook's) are not faultline's business."""
    env = container.get("env") or []
    return sorted(
        json.dumps(e, sort_keys=True) for e in env if str(e.get("name", "")).startswith("FAULTLINE_")
    )


def _reserved(name: object) -> bool:
    return isinstance(name, str) and name.startswith(RESERVED_VOLUME_PREFIX)


def _reserved_misuse(spec: Mapping[str, Any], settings: InjectSettings) -> str:
    """Why the pod's use of the reserved volume names is refused ("" : it is not). A pod that has the
    webhook's init container already may carry the reserved volumes this webhook makes, mounted by that
    container only; any other pod may carry none."""
    inits = spec.get("initContainers") or []
    ours = [c for c in inits if c.get("name") == preflight.CONTAINER]
    if ours:
        own = ours[0]
        if len(ours) > 1 or own.get("image") != settings.image or own.get("command"):
            return (
                f"init container {preflight.CONTAINER!r} is reserved for faultline's preflight: this one "
                f"is not the webhook's (image {settings.image}, no command)"
            )
        if list(own.get("args") or []) != list(settings.args):
            return (
                f"init container {preflight.CONTAINER!r} is reserved for faultline's preflight: its args "
                f"are not the webhook's {list(settings.args)}"
            )
    injected = {v["name"]: v["hostPath"] for v in _volumes(settings)} if ours else {}
    for volume in spec.get("volumes") or []:
        name = volume.get("name")
        if not _reserved(name):
            continue
        want = injected.get(name)
        host = volume.get("hostPath") or {}
        if want is None or set(volume) != {"name", "hostPath"} or host.get("path") != want["path"]:
            return (
                f"volume {name!r}: the names {RESERVED_VOLUME_PREFIX}* are reserved for the volumes "
                f"faultline's preflight adds (rename this volume)"
            )
    for part in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(part) or []:
            if part == "initContainers" and c.get("name") == preflight.CONTAINER:
                continue
            for mount in c.get("volumeMounts") or []:
                if _reserved(mount.get("name")):
                    return (
                        f"container {c.get('name')!r} mounts volume {mount.get('name')!r}: the names "
                        f"{RESERVED_VOLUME_PREFIX}* are reserved for faultline's preflight init container"
                    )
    return ""


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _volumes(settings: InjectSettings) -> list[dict[str, Any]]:
    out = []
    if settings.ingest_socket is not None:
        out.append(
            {
                "name": f"{RESERVED_VOLUME_PREFIX}ingest",
                "hostPath": {"path": str(settings.ingest_socket.parent), "type": "Directory"},
            }
        )
    for i, directory in enumerate(settings.journal_dirs):
        out.append({"name": f"{RESERVED_VOLUME_PREFIX}journal-{i}", "hostPath": {"path": str(directory)}})
    if settings.sim_dir is not None:
        out.append(
            {
                "name": f"{RESERVED_VOLUME_PREFIX}sim",
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
        mounts.append(
            {"name": f"{RESERVED_VOLUME_PREFIX}ingest", "mountPath": str(settings.ingest_socket.parent)}
        )
    for i, directory in enumerate(settings.journal_dirs):
        mounts.append(
            {"name": f"{RESERVED_VOLUME_PREFIX}journal-{i}", "mountPath": str(directory), "readOnly": True}
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
            {"name": f"{RESERVED_VOLUME_PREFIX}sim", "mountPath": str(settings.sim_dir), "readOnly": True}
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
