"""The chart proven with real pods (issue 13 item 5): `helm install oci://<loopback registry>/faultline`
(the chart pushed beside the image) into the local cluster with a real kubelet node, the project's image by
digest, the session's FerretDB as `store.external.uri`, the agent on the simulated GPU backend (its control
directory inside the agent's state hostPath, where the test writes with `simulator.inject`), repair Jobs in
record-only mode.

(a) the agent DaemonSet pod on the real node becomes Ready, stays Ready (no restart) and reports (an XID 79
    on its simulated GPU: the fault in the store and the node's GpuHealthy condition False);
(b) `helm upgrade` switching the workers on one at a time, as the README says, each one real pod on the
    real node (the workers' nodeSelector and tolerations put them there, cordoned or not), and each step
    doing its part before the next: quarantine cordons and taints the real node; drain evicts a real pod the
    test started there (asking for a GPU: the drain is gpuOnly, so it leaves faultline's own pods);
    remediation creates a RemediationRequest; the janitor's repair Job pod runs on the real node and only
    records ("would run"), the repair is validated and the node released;
(c) `helm uninstall`: the post-delete hook (`faultline uninstall`, a real pod) takes back what the
    components left: no pod, Job or RemediationRequest of the release, none of the agent's conditions, no
    faultline taint, label or annotation on any node, and an operator's cordon kept.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from devtools import procs, realnode, tools
from devtools.cluster import LocalCluster
from faultline import kube
from faultline.conditions import OWNED_TYPES
from faultline.errors import NotFoundError, TransientError
from sources import simulator
from workers import rules

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),  # the first real-node test starts the cluster: tools built, image pushed
    pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)"),
]
NODE = "real-node-01"
RELEASE = "fl"
WORKERS = ("quarantine", "drain", "remediation", "janitor")
# the local cluster's own node labels (not faultline's product): which node is real, which simulated
CLUSTER_LABELS = frozenset({realnode.LABEL, "faultline.io/simulated"})
CHART_VERSION = yaml.safe_load((tools.REPO / "charts" / "faultline" / "Chart.yaml").read_text())["version"]


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


def helm(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([str(tools.binary("helm")), *args], capture_output=True, text=True, env=env,
                          check=False, timeout=180)  # fmt: skip
    assert done.returncode == 0, f"helm {' '.join(args[:2])}: {done.stderr.strip()}"
    return done.stdout


def chart_values(
    cluster: LocalCluster, uri: str, database: str, state: Path, *, workers: tuple[str, ...] = ()
) -> dict[str, Any]:
    assert cluster.real is not None
    repository, _, digest = cluster.real.image.partition("@")
    fast = {"lease": "10s", "resync_interval": "500ms"}
    # the workers run on the real node even when faultline has cordoned and tainted it
    place = {"nodeSelector": {"kubernetes.io/hostname": NODE},
             "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
                             {"key": rules.FAULT_TAINT, "operator": "Exists"}]}  # fmt: skip
    return {
        "image": {"repository": repository, "digest": digest},
        "cleanup": {"nodeSelector": {"kubernetes.io/hostname": NODE}},
        "store": {"database": database, "external": {"uri": uri}},
        "agent": {
            "gpuBackend": "sim",
            "stateDir": str(state),
            "ingestSocket": str(state.parent / "ingest" / "ingest.sock"),
            "sysfsRoot": "",  # the host's NICs (and the pods' veths) are not this test's subject
            "terminationGracePeriodSeconds": 10,
            "nodeSelector": {"nvidia.com/gpu.present": None, "kubernetes.io/hostname": NODE},
            "config": {"sim_dir": str(state / "sim"), "gpu_poll_interval": "500ms",
                       "repair_poll_interval": "500ms", "snapshot_interval": "2s"},
        },
        "quarantine": {"enabled": "quarantine" in workers, "replicas": 1, "holdDown": "3s",
                       "breaker": {"maxShare": ""}, "config": fast, **place},  # one GPU node: no breaker
        "drain": {"enabled": "drain" in workers, "replicas": 1, "gpuOnly": True,
                  "config": {**fast, "poll": "300ms"}, **place},
        "remediation": {"enabled": "remediation" in workers, "replicas": 1, "config": fast, **place},
        "janitor": {"enabled": "janitor" in workers, "replicas": 1, "rebootTimeout": "60s",
                    "validateTimeout": "45s", "config": {"lease": "10s", "poll": "300ms", "record_only": True},
                    **place},
    }  # fmt: skip


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def release_pods(api: Any, ns: str, release: str = RELEASE) -> list[dict[str, Any]]:
    pods = kube.pods.list_all(api, field_selector=f"metadata.namespace={ns}")
    return [
        p for p in pods if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/instance") == release
    ]


def component_pod(api: Any, ns: str, component: str, release: str = RELEASE) -> dict[str, Any] | None:
    """The component's pod that is not being deleted (None while there is none)."""
    for pod in release_pods(api, ns, release):
        labels = pod["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/component") == component and not pod["metadata"].get(
            "deletionTimestamp"
        ):
            return pod
    return None


def diagnosis(api: Any, ns: str, db: Any, release: str = RELEASE) -> str:
    """What the node, the RemediationRequests, the store and each component's log say (a failed wait)."""
    node = kube.nodes.read(api, NODE)
    said = [f"node marks: {faultline_marks(node)}", f"conditions: {kube.nodes.conditions(api, NODE)}"]
    said += [f"RR: {r['spec']} {r.get('status')}" for r in kube.resources.list_requests(api)]
    for name in ("faults", "repairs", "nodes"):
        said += [f"{name}: {doc}" for doc in db[name].find({}, {"_id": 0}).limit(10)]
    for pod in release_pods(api, ns, release):
        log = kube.core(api).read_namespaced_pod_log(pod["metadata"]["name"], ns, tail_lines=25)
        said.append(f"--- {pod['metadata']['name']}:\n{log}")
    return "\n".join(said)


def faultline_marks(node: dict[str, Any]) -> list[str]:
    meta, spec = node["metadata"], node["spec"]
    marks = [
        f"label {k}"
        for k in meta.get("labels") or {}
        if k.startswith("faultline.io/") and k not in CLUSTER_LABELS
    ]
    marks += [f"annotation {k}" for k in meta.get("annotations") or {} if k.startswith("faultline.io/")]
    marks += [f"taint {t['key']}" for t in spec.get("taints") or [] if t["key"].startswith("faultline.io/")]
    if spec.get("unschedulable"):
        marks.append("cordoned")
    return marks


def test_the_chart_from_the_registry_runs_detects_quarantines_repairs_and_uninstalls_on_a_real_node(
    real_cluster: LocalCluster, real_store: str, store_db: tuple[str, Any], helm_env: dict[str, str],
    tmp_path: Path,
) -> None:  # fmt: skip
    assert real_cluster.real is not None
    api = real_cluster.api()
    core = kube.core(api)
    database, db = store_db
    suffix = uuid.uuid4().hex[:6]
    ns, workload = f"fl-{suffix}", f"work-{suffix}"
    state = tmp_path / "node" / "state"
    (state / "sim").mkdir(parents=True)
    uri = f"mongodb://{real_store}/?retryWrites=false&directConnection=true"
    chart = f"oci://{real_cluster.real.registry.address}/faultline"
    values = tmp_path / "values.yaml"
    kubeconfig = str(real_cluster.kubeconfig)
    sim_nodes = list(real_cluster.node_names)
    try:
        # -- (a) install: the agent alone, a real pod on the real node -----------------------------------
        values.write_text(yaml.safe_dump(chart_values(real_cluster, uri, database, state)))
        helm(helm_env, "install", RELEASE, chart, "--version", CHART_VERSION, "--plain-http",
             "--kubeconfig", kubeconfig, "--namespace", ns, "--create-namespace", "-f", str(values))  # fmt: skip
        procs.wait_for("the agent pod Ready on the real node",
                       lambda: ready(component_pod(api, ns, "agent") or {}), 180, interval=1)  # fmt: skip
        agent = component_pod(api, ns, "agent")
        assert agent is not None and agent["spec"]["nodeName"] == NODE
        image = agent["status"]["containerStatuses"][0]
        assert image["imageID"].endswith(real_cluster.real.image.split("@")[1])
        assert [p["spec"]["nodeName"] for p in release_pods(api, ns)] == [NODE]  # the agent only

        simulator.inject(NODE, 3, kind="xid", value=79, directory=state / "sim")

        def gpu_condition() -> dict[str, str]:
            return kube.nodes.conditions(api, NODE).get("GpuHealthy", {})

        procs.wait_for("the real node's GpuHealthy condition False (XID 79)",
                       lambda: gpu_condition().get("status") == "False", 90, interval=0.5)  # fmt: skip
        assert "XID-79" in gpu_condition()["reason"], gpu_condition()
        assert db["faults"].find_one({"node": NODE}) is not None, db.list_collection_names()

        # -- (b) upgrades: the workers on one at a time, each doing its part ---------------------------------
        for sim in sim_nodes:  # nothing of the test's lands on a simulated node
            kube.nodes.patch(api, sim, {"spec": {"unschedulable": True}})
        advertise_gpus(api, 8)
        core.create_namespace({"metadata": {"name": workload}})  # type: ignore[arg-type]
        procs.wait_for("the workload namespace's ServiceAccount",
                       lambda: bool(core.read_namespaced_service_account("default", workload)), 30)  # fmt: skip
        training = {
            "metadata": {"name": "training"},
            "spec": {"nodeName": NODE, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "train", "image": real_cluster.real.pause,
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }  # fmt: skip
        core.create_namespaced_pod(workload, training)  # type: ignore[arg-type]
        procs.wait_for("the training pod running on the real node",
                       lambda: kube.pods.read(api, workload, "training").get("status", {}).get("phase")
                       == "Running", 120, interval=0.5)  # fmt: skip

        def switch_on(worker: str) -> None:
            on = WORKERS[: WORKERS.index(worker) + 1]
            values.write_text(yaml.safe_dump(chart_values(real_cluster, uri, database, state, workers=on)))
            helm(helm_env, "upgrade", RELEASE, chart, "--version", CHART_VERSION, "--plain-http",
                 "--kubeconfig", kubeconfig, "--namespace", ns, "-f", str(values))  # fmt: skip
            procs.wait_for(f"the {worker} pod Ready on the real node",
                           lambda: ready(component_pod(api, ns, worker) or {}), 180, interval=1)  # fmt: skip
            pod = component_pod(api, ns, worker)
            assert pod is not None and pod["spec"]["nodeName"] == NODE, worker

        def quarantined() -> bool:
            node = kube.nodes.read(api, NODE)
            taints = {t["key"] for t in node["spec"].get("taints") or []}
            return bool(node["spec"].get("unschedulable")) and rules.FAULT_TAINT in taints

        def evicted() -> bool:
            try:
                pod = kube.pods.read(api, workload, "training")
            except NotFoundError:
                return True
            return pod.get("status", {}).get("phase") in ("Failed", "Succeeded")

        def request() -> dict[str, Any] | None:
            found = [r for r in kube.resources.list_requests(api) if r["spec"]["node"] == NODE]
            return found[0] if found else None

        def repair_pod() -> dict[str, Any] | None:
            for pod in kube.pods.list_all(api, field_selector=f"metadata.namespace={ns}"):
                if "job-name" in (pod["metadata"].get("labels") or {}):
                    return pod
            return None

        switch_on("quarantine")
        procs.wait_for("the real node cordoned and tainted", quarantined, 120, interval=0.5)
        assert not evicted() and request() is None  # quarantine's part only

        switch_on("drain")
        procs.wait_for("the training pod evicted", evicted, 90, interval=0.5)
        assert request() is None

        switch_on("remediation")
        procs.wait_for(
            "a RemediationRequest for the real node", lambda: request() is not None, 90, interval=0.5
        )
        rr = request()
        assert rr is not None and rr["spec"]["action"] == "REBOOT", rr
        assert repair_pod() is None and quarantined()  # no janitor yet: no repair, the node held

        switch_on("janitor")
        procs.wait_for("the repair Job's pod succeeded",
                       lambda: (repair_pod() or {}).get("status", {}).get("phase") == "Succeeded", 120,
                       interval=0.5)  # fmt: skip
        job_pod = repair_pod()
        assert job_pod is not None and job_pod["spec"]["nodeName"] == NODE
        assert job_pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
        log = core.read_namespaced_pod_log(job_pod["metadata"]["name"], ns)
        assert "faultline janitor (record only): would run reboot:" in log, log

        try:
            procs.wait_for("the real node released (repair validated, hold-down over)",
                           lambda: not faultline_marks(kube.nodes.read(api, NODE)), 150, interval=0.5)  # fmt: skip
        except TransientError as exc:
            raise AssertionError(diagnosis(api, ns, db)) from exc
        procs.wait_for("GpuHealthy True again", lambda: gpu_condition().get("status") == "True", 60)
        for pod in release_pods(api, ns):  # no component was restarted through the whole scenario
            restarts = [s["restartCount"] for s in pod["status"].get("containerStatuses") or []]
            assert restarts == [0] and ready(pod), (pod["metadata"]["name"], pod["status"])

        # -- (c) uninstall: the post-delete hook takes back what the components left ---------------------
        kube.nodes.patch(api, NODE, {"spec": {"unschedulable": True}})  # an operator's cordon: it stays
        helm(helm_env, "uninstall", RELEASE, "--kubeconfig", kubeconfig, "--namespace", ns, "--wait")
        procs.wait_for("no pod of the release", lambda: not release_pods(api, ns), 90, interval=0.5)
        for node in kube.nodes.list_all(api):
            name = node["metadata"]["name"]
            marks = [m for m in faultline_marks(node) if not (m == "cordoned" and name in {*sim_nodes, NODE})]
            assert not marks, (name, marks)
            assert not set(kube.nodes.conditions(api, name)) & OWNED_TYPES, name
        assert kube.nodes.read(api, NODE)["spec"].get("unschedulable") is True
        assert not kube.apps(api).list_namespaced_deployment(ns).items
        assert not kube.apps(api).list_namespaced_daemon_set(ns).items
        assert not kube.batch(api).list_namespaced_job(ns).items  # the repair Job and the hook's own
        assert request() is None
    finally:
        subprocess.run([str(tools.binary("helm")), "uninstall", RELEASE, "--kubeconfig", kubeconfig,
                        "--namespace", ns, "--wait", "--ignore-not-found"], env=helm_env,
                       capture_output=True, check=False, timeout=180)  # fmt: skip
        for name in (workload, ns):
            with contextlib.suppress(ApiException):  # not created
                core.delete_namespace(name, propagation_policy="Background")
        for sim in sim_nodes:
            kube.nodes.patch(api, sim, {"spec": {"unschedulable": None}})
        for rr in kube.resources.list_requests(api):
            if rr["spec"].get("node") == NODE:
                kube.custom(api).delete_cluster_custom_object(
                    kube.resources.RR_GROUP, kube.resources.RR_VERSION, kube.resources.RR_PLURAL,
                    rr["metadata"]["name"],
                )  # fmt: skip
        release_real_node(api)

        def namespaces_gone() -> bool:
            names = {n.metadata.name for n in core.list_namespace().items if n.metadata is not None}
            return not names & {ns, workload}

        procs.wait_for("the test's namespaces gone", namespaces_gone, 120, interval=1)
