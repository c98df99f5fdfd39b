"""The scaffolding the chart's tests on the real-node cluster share: the real node, the chart from the
cluster's loopback registry, the values that run faultline there, and one release's cycle (`Release`).

A test uses a release as a context manager:

    with chartutil.Release(real_cluster, helm_env, "fl", ns, values=tmp_path / "values.yaml", db=db) as release:
        release.install(values, ready=("agent",))   # helm install, then the pods Ready (or what went wrong)
        ...                                          # the test's own steps and assertions
        release.uninstall()                          # helm uninstall --wait, then no pod of the release left

and whatever happens in between, leaving it uninstalls the release (if it is still there), deletes the
test's namespaces and waits until they are gone, runs the test's own `after`, and takes back what the test
may have left on the real node (`release_real_node`).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from devtools import procs, realnode, tools
from devtools.cluster import LocalCluster
from faultline import evidence, kube
from faultline.conditions import OWNED_TYPES
from faultline.errors import NotFoundError, TransientError
from workers import rules

NODE = "real-node-01"
# the local cluster's own node labels (not faultline's product): which node is real, which simulated
CLUSTER_LABELS = frozenset({realnode.LABEL, "faultline.io/simulated"})
CHART_VERSION = yaml.safe_load((tools.REPO / "charts" / "faultline" / "Chart.yaml").read_text())["version"]
HELM_TIMEOUT_S = 180.0  # one helm command (an install pulls the chart; an uninstall waits for its hook)


def helm(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([str(tools.binary("helm")), *args], capture_output=True, text=True, env=env,
                          check=False, timeout=HELM_TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, f"helm {' '.join(args[:2])}: {done.stderr.strip()}"
    return done.stdout


def advertise_gpus(api: Any, count: int | None) -> None:
    """The real node's nvidia.com/gpu capacity, as a device plugin would advertise it (None: none)."""
    gpus = {"nvidia.com/gpu": None if count is None else str(count)}
    kube.nodes.patch_status(api, NODE, {"capacity": gpus, "allocatable": gpus})


def release_real_node(api: Any) -> None:
    """What a test may have left on the real node, taken back: faultline's labels, annotations and taints,
    a cordon, the advertised GPUs, the agent's conditions."""
    node = kube.nodes.read(api, NODE)
    kube.nodes.patch(api, NODE, {
        "metadata": {
            "labels": {k: None for k in node["metadata"].get("labels") or {}
                       if k.startswith("faultline.io/") and k not in CLUSTER_LABELS},
            "annotations": {k: None for k in node["metadata"].get("annotations") or {}
                            if k.startswith("faultline.io/")},
        },
        "spec": {"unschedulable": None,
                 "taints": [t for t in node["spec"].get("taints") or []
                            if not t["key"].startswith("faultline.io/")] or None},
    })  # fmt: skip
    advertise_gpus(api, None)
    left = [t for t in kube.nodes.conditions(api, NODE) if t in OWNED_TYPES]
    kube.nodes.write_conditions(api, NODE, [], left)

    def untainted() -> bool:  # the node lifecycle controller takes its cordon taint away after a moment
        taints = kube.nodes.read(api, NODE)["spec"].get("taints") or []
        return not any(t["key"] == "node.kubernetes.io/unschedulable" for t in taints)

    procs.wait_for("the cordon's taint gone from the real node", untainted, 60, interval=0.2)


def chart_values(
    cluster: LocalCluster, uri: str, database: str, state: Path, *, workers: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The project's image by digest, the store at `uri`, the agent on the real node (simulated GPUs, its
    state in `state`) and `workers` on, each on the real node even when faultline has cordoned and tainted
    it; repair Jobs only record."""
    assert cluster.real is not None
    repository, _, digest = cluster.real.image.partition("@")
    fast = {"lease": "10s", "resync_interval": "500ms"}
    place = {"nodeSelector": {"kubernetes.io/hostname": NODE},
             "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
                             {"key": rules.FAULT_TAINT, "operator": "Exists"}]}  # fmt: skip
    return {
        "image": {"repository": repository, "digest": digest},
        "cleanup": {"nodeSelector": {"kubernetes.io/hostname": NODE}},
        "secretsHook": {"nodeSelector": {"kubernetes.io/hostname": NODE}},
        "store": {"database": database, "external": {"uri": uri}},
        "agent": {
            "gpuBackend": "sim",
            "stateDir": str(state),
            "ingestSocket": str(state.parent / "ingest" / "ingest.sock"),
            "sysfsRoot": "",  # the host's NICs (and the pods' veths) are not this test's subject
            "terminationGracePeriodSeconds": 10,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "config": {"sim_dir": str(state / "sim"), "gpu_poll_interval": "500ms",
                       "repair_poll_interval": "500ms", "repair_idle_poll_interval": "2s", "snapshot_interval": "2s"},
        },
        "quarantine": {"enabled": "quarantine" in workers, "replicas": 1, "holdDown": "3s",
                       "breaker": {"maxShare": "", "maxHeldShare": ""},  # one GPU node: no breaker
                       "config": fast, **place},
        "drain": {"enabled": "drain" in workers, "replicas": 1, "gpuOnly": True,
                  "config": {**fast, "poll": "300ms"}, **place},
        "remediation": {"enabled": "remediation" in workers, "replicas": 1, "config": fast, **place},
        "janitor": {"enabled": "janitor" in workers, "replicas": 1, "rebootTimeout": "60s",
                    "validateTimeout": "45s", "config": {"lease": "10s", "poll": "300ms", "record_only": True},
                    **place},
        # retention's CronJob on the real node, on a schedule no test reaches (a test that wants a run
        # starts a Job from it: test_chart_monitors_real_node)
        "retention": {"schedule": "0 0 1 1 *", "nodeSelector": {"kubernetes.io/hostname": NODE}},
    }  # fmt: skip


CHART = Path(__file__).resolve().parents[2] / "charts" / "faultline"
CLUSTER_SCOPED = (
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


def rendered_for_test(release: str, namespace: str, template: str, *sets: str) -> list[dict[str, Any]]:
    """One template of the chart (`helm template --show-only`), its cluster-scoped objects renamed with the
    test's namespace (and the references to them), so tests sharing the session's cluster do not meet."""
    args = [str(tools.binary("helm")), "template", release, str(CHART), "--namespace", namespace,
            "--show-only", template, *(a for s in sets for a in ("--set", s))]  # fmt: skip
    docs = [
        d
        for d in yaml.safe_load_all(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
        if d
    ]
    for doc in docs:
        if doc["kind"] in CLUSTER_SCOPED:
            doc["metadata"]["name"] += f"-{namespace}"
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding") and doc["roleRef"]["kind"] == "ClusterRole":
            doc["roleRef"]["name"] += f"-{namespace}"
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            doc["spec"]["policyName"] += f"-{namespace}"
    return docs


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def restarts(pod: dict[str, Any]) -> list[int]:
    return [s["restartCount"] for s in pod["status"].get("containerStatuses") or []]


def faultline_marks(node: dict[str, Any], *, running: bool = False) -> list[str]:
    """What faultline left on the Node; `running`: while the release runs, the agent's published key is its
    identity, not a mark (uninstall takes it too)."""
    meta, spec = node["metadata"], node["spec"]
    marks = [
        f"label {k}"
        for k in meta.get("labels") or {}
        if k.startswith("faultline.io/") and k not in CLUSTER_LABELS
    ]
    marks += [f"annotation {k}" for k in meta.get("annotations") or {}
              if k.startswith("faultline.io/") and not (running and k == evidence.KEY_ANNOTATION)]  # fmt: skip
    marks += [f"taint {t['key']}" for t in spec.get("taints") or [] if t["key"].startswith("faultline.io/")]
    if spec.get("unschedulable"):
        marks.append("cordoned")
    return marks


class Release:
    """One release of the chart (`oci://<the cluster's loopback registry>/faultline`) in the test's
    namespace: `install`, `upgrade` and `uninstall` it, read its pods; leaving it (a `with` block) takes
    everything back, whatever happened (see the module doc). `values`: the file each install or upgrade
    writes its values to; `db`: the store database the release uses (told when a wait fails); `namespaces`:
    the test's other namespaces, deleted with the release's; `after`: the test's own cleanup, once the
    namespaces are gone."""

    def __init__(
        self, cluster: LocalCluster, env: dict[str, str], name: str, namespace: str, *, values: Path,
        db: Any = None, namespaces: Sequence[str] = (), after: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        assert cluster.real is not None
        self.env, self.name, self.namespace, self.values, self.db = env, name, namespace, values, db
        self.namespaces = (namespace, *namespaces)
        self.after = after
        self.api = cluster.api()
        self.kubeconfig = str(cluster.kubeconfig)
        self.chart = f"oci://{cluster.real.registry.address}/faultline"

    # -- the cycle ------------------------------------------------------------------------------------------
    def install(
        self, values: dict[str, Any], *, ready: Sequence[str] = (), create_namespace: bool = False,
        timeout: float = 180,
    ) -> float:  # fmt: skip
        """`helm install` with `values`, then wait (`timeout` s) until the pod of each component in `ready`
        is Ready. The monotonic time helm returned at (for the tests' measures)."""
        self.values.write_text(yaml.safe_dump(values))
        self._helm("install", self.name, self.chart, "--version", CHART_VERSION, "--plain-http",
                   *(("--create-namespace",) if create_namespace else ()), "-f", str(self.values))  # fmt: skip
        installed = time.monotonic()
        self.wait_ready(ready, timeout)
        return installed

    def upgrade(self, values: dict[str, Any], *, ready: Sequence[str] = (), timeout: float = 180) -> None:
        """`helm upgrade` to `values`, then wait until the pod of each component in `ready` is Ready."""
        self.values.write_text(yaml.safe_dump(values))
        self._helm("upgrade", self.name, self.chart, "--version", CHART_VERSION, "--plain-http",
                   "-f", str(self.values))  # fmt: skip
        self.wait_ready(ready, timeout)

    def wait_ready(self, components: Sequence[str], timeout: float = 180) -> None:
        """Wait until each component's pod is Ready; an AssertionError telling the node, the store and the
        release's pods (their logs) when one is not in time."""
        if not components:
            return
        try:
            procs.wait_for(f"{', '.join(components)} Ready",
                           lambda: all(ready(self.pod(c) or {}) for c in components), timeout, interval=1)  # fmt: skip
        except TransientError as exc:
            raise AssertionError(self.diagnosis()) from exc

    def uninstall(self, timeout: float = 90) -> None:
        """`helm uninstall --wait` (its post-delete hook run), then wait until no pod of the release is left."""
        self._helm("uninstall", self.name, "--wait")
        procs.wait_for("no pod of the release", lambda: not self.pods(), timeout, interval=0.5)

    # -- reading it -----------------------------------------------------------------------------------------
    def pods(self) -> list[dict[str, Any]]:
        pods = kube.pods.list_all(self.api, field_selector=f"metadata.namespace={self.namespace}")
        return [p for p in pods if _label(p, "app.kubernetes.io/instance") == self.name]

    def pod(self, component: str) -> dict[str, Any] | None:
        """The component's pod that is not being deleted (None while there is none)."""
        for pod in self.pods():
            if _label(pod, "app.kubernetes.io/component") == component and not pod["metadata"].get(
                "deletionTimestamp"
            ):
                return pod
        return None

    def diagnosis(self) -> str:
        """What the real node, the RemediationRequests, the store (`db`) and each pod of the release say:
        its state and log tail and, for a restarted container, why it ended and its log before."""
        node = kube.nodes.read(self.api, NODE)
        said = [f"node marks: {faultline_marks(node)}"]
        said += [f"conditions: {kube.nodes.conditions(self.api, NODE)}"]
        with contextlib.suppress(NotFoundError):  # no RemediationRequest CRD: the chart brings it
            said += [f"RR: {r['spec']} {r.get('status')}" for r in kube.resources.list_requests(self.api)]
        if self.db is not None:
            for name in ("faults", "repairs", "nodes"):
                said += [f"{name}: {doc}" for doc in self.db[name].find({}, {"_id": 0}).limit(10)]
        core = kube.core(self.api)
        for pod in self.pods():
            name = pod["metadata"]["name"]
            said.append(f"--- {name} {pod['status'].get('phase')} restarts {restarts(pod)}")
            with contextlib.suppress(ApiException):
                said.append(core.read_namespaced_pod_log(name, self.namespace, tail_lines=25))
            for status in pod["status"].get("containerStatuses") or []:
                if status["restartCount"]:
                    said.append(f"--- {name} before its restart: {status.get('lastState')}")
                    with contextlib.suppress(ApiException):
                        said.append(
                            core.read_namespaced_pod_log(name, self.namespace, previous=True, tail_lines=30)
                        )
        return "\n".join(said)

    # -- taking it all back ---------------------------------------------------------------------------------
    def __enter__(self) -> Release:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        core = kube.core(self.api)
        try:
            subprocess.run([str(tools.binary("helm")), "uninstall", self.name, "--kubeconfig", self.kubeconfig,
                            "--namespace", self.namespace, "--wait", "--ignore-not-found"], env=self.env,
                           capture_output=True, check=False, timeout=HELM_TIMEOUT_S)  # fmt: skip
            for name in self.namespaces:
                with contextlib.suppress(ApiException):  # not created
                    core.delete_namespace(name, propagation_policy="Background")

            def namespaces_gone() -> bool:
                names = {n.metadata.name for n in core.list_namespace().items if n.metadata is not None}
                return not names & set(self.namespaces)

            procs.wait_for("the test's namespaces gone", namespaces_gone, 120, interval=1)
        finally:
            try:
                if self.after is not None:
                    self.after()
            finally:
                release_real_node(self.api)

    def _helm(self, *args: str) -> str:
        return helm(self.env, *args, "--kubeconfig", self.kubeconfig, "--namespace", self.namespace)


def _label(obj: dict[str, Any], key: str) -> str | None:
    return (obj["metadata"].get("labels") or {}).get(key)
