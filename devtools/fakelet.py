"""Simulated GPU nodes for the local control plane: a small fake kubelet.

It registers Node objects that look like 8-GPU nodes, keeps them Ready (node status and the Lease in
`kube-node-lease`), runs the pods the scheduler binds to them (Running and Ready at once; pods that may
not restart finish after `faultline.io/sim-run-seconds` with `faultline.io/sim-exit-code`), and finishes
deleting terminating pods once their grace period has passed (the API server keeps pods with finalizers
until those are removed). A node can be rebooted (NotReady for a while, then Ready with a new boot id)
or killed (it stops heartbeating, as a dead kubelet would). A janitor reboot Job's pod reboots its node
when it starts: the fakelet knows it by the label the janitor puts on its repair pods for the drainer
(`faultline.io/repair: reboot`); a test's pod annotation `faultline.io/sim-action` (`none`, `reboot`)
says otherwise.

Why our own and not kubemark or kwok: it is one small Python module with no extra build, reboot and kill
are plain method calls that tests drive directly, and it runs inside the test process or `faultline dev
cluster up` with no container runtime.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultline import kube
from faultline.errors import ConflictError, NotFoundError
from workers import janitor

log = logging.getLogger(__name__)

RUN_SECONDS = "faultline.io/sim-run-seconds"
SIM_ACTION = "faultline.io/sim-action"  # a test's word on what running this pod does: "reboot" or "none"
EXIT_CODE = "faultline.io/sim-exit-code"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
LEASE_SECONDS = 40
HEARTBEAT_S = 2.0
POLL_S = 0.2


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _ts(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class SimNode:
    name: str
    ip: str
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    down_until: float = 0.0  # rebooting: NotReady until then
    dead: bool = False  # killed: no heartbeats at all
    ready_reported: bool | None = None
    booted_at: dt.datetime = field(default_factory=_now)

    @property
    def up(self) -> bool:
        return not self.dead and time.monotonic() >= self.down_until


def node_manifest(node: SimNode, gpus: int) -> dict[str, Any]:
    capacity = {
        "cpu": "96",
        "memory": "1056Gi",
        "pods": "110",
        "ephemeral-storage": "3500Gi",
        "nvidia.com/gpu": str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "sim.gpu-8x",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.memory": "81559",
                "faultline.io/simulated": "true",
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


class Fakelet:
    """Runs N simulated nodes against the API server in a background thread."""

    def __init__(
        self, api: kube.ApiClient, names: list[str], *, gpus: int = 8, kubeconfig: Path | None = None
    ) -> None:
        """`kubeconfig`: the credentials faultline's own hook pods run with (the chart's Secrets and CRD
        hooks are carried out by this process, `_run_faultline_hook`); without it they only finish."""
        self.api = api
        self.kubeconfig = kubeconfig
        # Bodies are plain JSON-shaped dicts, which the client accepts; typed as Any on purpose.
        self.leases: Any = kube.coordination(api)
        self.gpus = gpus
        self.nodes = {n: SimNode(n, f"10.244.{i // 250}.{i % 250 + 1}") for i, n in enumerate(names)}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._finishing: dict[str, float] = {}  # pod uid -> monotonic time it finishes running
        self._acted: set[str] = set()  # pods whose reboot (or hook) was carried out
        self._exit_codes: dict[str, int] = {}  # pod uid -> exit code of what this process carried out
        self._lock = threading.Lock()
        self.errors = 0
        self.last_pass = 0.0  # monotonic time the loop last finished a pass over the pods (diagnostics)
        self.reboots: list[tuple[str, float]] = []  # (node, monotonic time) of each reboot, in order

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        for node in self.nodes.values():
            self._register(node)
            self._heartbeat(node, force=True)
        self._thread = threading.Thread(target=self._run, name="fakelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    @property
    def running(self) -> bool:
        """Whether its loop still runs."""
        return self._thread is not None and self._thread.is_alive()

    def add(self, name: str, *, provider_id: str = "") -> SimNode:
        """One more simulated node, registered now with its `spec.providerID` (which a Node takes only
        once), and simulated like the others until `remove`."""
        with self._lock:
            i = len(self.nodes)
        node = SimNode(name, f"10.245.{i // 250}.{i % 250 + 1}")
        body = node_manifest(node, self.gpus)
        if provider_id:
            body["spec"]["providerID"] = provider_id
        kube.nodes.create(self.api, body)
        self._heartbeat(node, force=True)
        with self._lock:
            self.nodes[name] = node
        return node

    def remove(self, name: str) -> None:
        """Stop simulating the node and delete its Node."""
        with self._lock:
            self.nodes.pop(name, None)
        with contextlib.suppress(NotFoundError):
            kube.nodes.delete(self.api, name)

    def reboot(self, name: str, down_seconds: float = 3.0) -> str:
        """Take the node NotReady for `down_seconds`, then back Ready with a new boot id (returned)."""
        with self._lock:
            node = self.nodes[name]
            node.down_until = time.monotonic() + down_seconds
            node.boot_id = str(uuid.uuid4())
            node.booted_at = _now()
            boot_id = node.boot_id
            self.reboots.append((name, time.monotonic()))
        self._heartbeat(node, force=True)
        return boot_id

    def kill(self, name: str) -> None:
        """The node stops heartbeating; its Ready condition goes Unknown once the lease expires."""
        with self._lock:
            self.nodes[name].dead = True

    def revive(self, name: str) -> None:
        with self._lock:
            self.nodes[name].dead = False
        self._heartbeat(self.nodes[name], force=True)

    # -- the loop ------------------------------------------------------------------------------------
    def _run(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_beat:
                    for node in list(self.nodes.values()):
                        self._heartbeat(node)
                    next_beat = time.monotonic() + HEARTBEAT_S
                self._sync_pods()
                self.last_pass = time.monotonic()
            except Exception:  # keep simulating; the API server may be restarting
                self.errors += 1
                log.exception("fakelet loop failed")
                time.sleep(1)
            self._stop.wait(POLL_S)

    def _register(self, node: SimNode) -> None:
        with contextlib.suppress(ConflictError):  # registered before
            kube.nodes.create(self.api, node_manifest(node, self.gpus))

    def _heartbeat(self, node: SimNode, *, force: bool = False) -> None:
        if node.dead:
            return
        now = _now()
        up = node.up
        changed = force or node.ready_reported != up
        ready = {
            "type": "Ready",
            "status": "True" if up else "False",
            "reason": "KubeletReady" if up else "KubeletNotReady",
            "message": "simulated kubelet is posting ready status" if up else "node is rebooting",
            "lastHeartbeatTime": _ts(now),
        }
        if changed:
            ready["lastTransitionTime"] = _ts(now)
        conditions = [ready] + [
            {
                "type": t,
                "status": "False",
                "reason": r,
                "message": "simulated",
                "lastHeartbeatTime": _ts(now),
                **({"lastTransitionTime": _ts(now)} if force else {}),
            }
            for t, r in (
                ("MemoryPressure", "KubeletHasSufficientMemory"),
                ("DiskPressure", "KubeletHasNoDiskPressure"),
                ("PIDPressure", "KubeletHasSufficientPID"),
            )
        ]
        status: dict[str, Any] = {"conditions": conditions}
        if force or changed:
            status["nodeInfo"] = {
                "bootID": node.boot_id,
                "machineID": node.name,
                "systemUUID": node.name,
                "kernelVersion": "6.8.0-sim",
                "osImage": "faultline simulated node",
                "containerRuntimeVersion": "sim://1",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            }
            status["addresses"] = [
                {"type": "InternalIP", "address": node.ip},
                {"type": "Hostname", "address": node.name},
            ]
            cap = node_manifest(node, self.gpus)["status"]["capacity"]
            status["capacity"] = cap
            status["allocatable"] = cap
        kube.nodes.patch_status(self.api, node.name, status)
        node.ready_reported = up
        if up:
            self._renew_lease(node, now)

    def _renew_lease(self, node: SimNode, now: dt.datetime) -> None:
        spec = {
            "holderIdentity": node.name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": kube.bodies.micro_time(),
        }
        what = f"Lease kube-node-lease/{node.name}"
        try:
            renew = self.leases.patch_namespaced_lease
            kube.client.send_json("patch", what, renew, node.name, "kube-node-lease", {"spec": spec})
        except NotFoundError:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": node.name, "namespace": "kube-node-lease"},
                "spec": spec,
            }
            # the namespace not created yet, or a race: the next beat
            with contextlib.suppress(NotFoundError, ConflictError):
                create = self.leases.create_namespaced_lease
                kube.client.send_json("create", what, create, "kube-node-lease", body)

    # -- pods ----------------------------------------------------------------------------------------
    def _sync_pods(self) -> None:
        # plain JSON, not the client's model objects: building those for thousands of pods five times a
        # second costs a core (measured in the drain benchmark)
        pods = [_Json(p) for p in kube.pods.list_all(self.api, field_selector="spec.nodeName!=")]
        now_mono = time.monotonic()
        for pod in pods:
            node = self.nodes.get(pod.spec.node_name)
            if node is None or node.dead:
                continue
            meta = pod.metadata
            if meta.deletion_timestamp is not None:
                self._finish_deletion(pod)
                continue
            phase = pod.status.phase if pod.status else None
            if phase in ("Succeeded", "Failed"):
                continue
            if phase != "Running":
                self._set_running(pod, node)
                repair = (meta.labels or {}).get(janitor.REPAIR_LABEL)  # what a janitor Job's pod carries out
                action = (meta.annotations or {}).get(SIM_ACTION) or repair
                if action == "reboot" and meta.uid not in self._acted:
                    self._acted.add(meta.uid)
                    self.reboot(node.name)
                if pod.spec.restart_policy in ("Never", "OnFailure"):
                    run_for = float((meta.annotations or {}).get(RUN_SECONDS, "1"))
                    self._finishing[meta.uid] = now_mono + run_for
                    if (
                        _is_faultline_hook(pod)
                        and self.kubeconfig is not None
                        and meta.uid not in self._acted
                    ):
                        self._acted.add(meta.uid)
                        self._run_faultline_hook(pod)
                continue
            if node.up != _pod_ready(pod):
                self._set_running(pod, node)
            finish = self._finishing.get(meta.uid)
            if finish is not None and now_mono >= finish:
                code = self._exit_codes.pop(meta.uid, None) or int(
                    (meta.annotations or {}).get(EXIT_CODE, "0")
                )
                self._set_finished(pod, code)
                del self._finishing[meta.uid]

    def _run_faultline_hook(self, pod: Any) -> None:
        """One of the chart's hook pods (`faultline chart-secrets`, `faultline chart-crds`), carried out as
        its container would be: `faultline` with the container's args, its ConfigMap volumes as
        directories, the pod's namespace, and this cluster's credentials. Its exit code ends the pod."""
        try:
            code, said = self._hook_exit(pod)
        except Exception as exc:  # noqa: BLE001 - the pod fails, as its container would
            code, said = 1, f"{type(exc).__name__}: {exc}"
        if code:
            log.warning("fakelet: hook pod %s/%s failed: %s", pod.metadata.namespace, pod.metadata.name, said)
            self._exit_codes[pod.metadata.uid] = code

    def _hook_exit(self, pod: Any) -> tuple[int, str]:
        namespace = pod.metadata.namespace
        (container,) = pod.spec.containers
        args = [str(a) for a in container.args or []]
        with tempfile.TemporaryDirectory(prefix="fakelet-hook-") as tmp:
            volumes = {v.name: v for v in pod.spec.volumes or []}
            for mount in container.volume_mounts or []:
                volume = volumes.get(mount.name)
                if volume is None or volume.config_map is None:
                    continue
                cm = kube.core(self.api).read_namespaced_config_map(volume.config_map.name, namespace)
                local = Path(tmp) / mount.name
                local.mkdir()
                for key, text in (cm.data or {}).items():
                    (local / key).write_text(text)
                args = [a.replace(mount.mount_path, str(local)) for a in args]
            env = {**os.environ, "POD_NAMESPACE": namespace, "FAULTLINE_KUBECONFIG": str(self.kubeconfig)}
            argv = [sys.executable, "-m", "faultline", *args]  # the chart's own hook args
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
        return done.returncode, done.stderr[-2000:]

    def _containers(self, pod: Any, state: dict[str, Any], ready: bool) -> list[dict[str, Any]]:
        return [
            {
                "name": c.name,
                "image": c.image or "sim",
                "imageID": f"sim://{c.image}",
                "containerID": f"sim://{pod.metadata.uid}-{c.name}",
                "ready": ready,
                "started": "running" in state,
                "restartCount": 0,
                "state": state,
            }
            for c in pod.spec.containers
        ]

    def _set_running(self, pod: Any, node: SimNode) -> None:
        now = _ts(_now())
        ready = "True" if node.up else "False"
        status = {
            "phase": "Running",
            "hostIP": node.ip,
            "podIP": node.ip,
            "startTime": now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
                {"type": "Ready", "status": ready, "lastTransitionTime": now},
            ],
            "containerStatuses": self._containers(pod, {"running": {"startedAt": now}}, node.up),
        }
        self._patch_status(pod, status)

    def _set_finished(self, pod: Any, code: int) -> None:
        now = _ts(_now())
        terminated = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": now,
                "finishedAt": now,
            }
        }
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                {
                    "type": "ContainersReady",
                    "status": "False",
                    "reason": "PodCompleted",
                    "lastTransitionTime": now,
                },
            ],
            "containerStatuses": self._containers(pod, terminated, False),
        }
        self._patch_status(pod, status)

    def _finish_deletion(self, pod: Any) -> None:
        meta = pod.metadata
        grace = meta.deletion_grace_period_seconds or 0
        deadline = meta.deletion_timestamp  # the API server sets it to request time + grace
        if deadline is not None and _now() < deadline.replace(tzinfo=dt.UTC) and grace > 0:
            return
        # grace 0 in the body: the client drops a zero grace_period_seconds query parameter
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta.uid}}
        with contextlib.suppress(NotFoundError, ConflictError):  # gone, or replaced by a pod of the same name
            kube.pods.delete(self.api, meta.namespace, meta.name, body=body)
        self._finishing.pop(meta.uid, None)

    def _patch_status(self, pod: Any, status: dict[str, Any]) -> None:
        with contextlib.suppress(NotFoundError, ConflictError):
            kube.pods.patch_status(self.api, pod.metadata.namespace, pod.metadata.name, status)


HOOKS = ("secrets", "crds")  # the chart's hook Jobs that run `faultline` (`_run_faultline_hook`)


def _is_faultline_hook(pod: Any) -> bool:
    labels = pod.metadata.labels or {}
    return (
        labels.get("app.kubernetes.io/name") == "faultline"
        and labels.get("app.kubernetes.io/component") in HOOKS
    )


class _Json:
    """A JSON object read with the generated client's attribute names (`node_name` for `nodeName`);
    nested objects wrapped too, label and annotation maps as they are, `deletion_timestamp` parsed."""

    __slots__ = ("_d",)

    def __init__(self, d: dict[str, Any]) -> None:
        self._d = d

    def __getattr__(self, name: str) -> Any:
        head, *rest = name.split("_")
        value = self._d.get(head + "".join(w.capitalize() for w in rest))
        if name in ("annotations", "labels") or value is None:
            return value
        if name == "deletion_timestamp":
            return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).replace(tzinfo=None)
        if isinstance(value, dict):
            return _Json(value)
        if isinstance(value, list):
            return [_Json(v) if isinstance(v, dict) else v for v in value]
        return value


def _pod_ready(pod: Any) -> bool:
    for cond in (pod.status.conditions or []) if pod.status else []:
        if cond.type == "Ready":
            return bool(cond.status == "True")
    return False
