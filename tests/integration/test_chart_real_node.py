"""The chart proven with real pods (issue 13 item 5): `helm install oci://<loopback registry>/faultline`
(the chart pushed beside the image) into the local cluster with a real kubelet node, the project's image by
digest, the session's FerretDB as `store.external.uri`, the agent on the simulated GPU backend (its control
directory inside the agent's state hostPath, where the test writes with `simulator.inject`), repair Jobs in
record-only mode.

(a) the agent DaemonSet pod on the real node becomes Ready, stays Ready (no restart) and reports (an XID 79
    on its simulated GPU: the fault in the store and the node's GpuHealthy condition False);
(b) `helm upgrade` turning the workers on one at a time, as docs/install/helm.md says, each a real pod on the
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

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from faultline import kube
from faultline.conditions import OWNED_TYPES
from faultline.errors import NotFoundError, TransientError
from sources import simulator
from tests.integration import chartutil
from tests.integration.chartutil import NODE
from workers import rules

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),  # the first real-node test starts the cluster: tools built, image pushed
    pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)"),
]
RELEASE = "fl"
WORKERS = ("quarantine", "drain", "remediation", "janitor")


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
    sim_nodes = list(real_cluster.node_names)

    def request() -> dict[str, Any] | None:
        found = [r for r in kube.resources.list_requests(api) if r["spec"]["node"] == NODE]
        return found[0] if found else None

    def after() -> None:
        """The simulated nodes uncordoned, the real node's RemediationRequests deleted."""
        for sim in sim_nodes:
            kube.nodes.patch(api, sim, {"spec": {"unschedulable": None}})
        for rr in kube.resources.list_requests(api):
            if rr["spec"].get("node") == NODE:
                kube.custom(api).delete_cluster_custom_object(
                    kube.resources.RR_GROUP, kube.resources.RR_VERSION, kube.resources.RR_PLURAL,
                    rr["metadata"]["name"],
                )  # fmt: skip

    with chartutil.Release(real_cluster, helm_env, RELEASE, ns, values=tmp_path / "values.yaml", db=db,
                           namespaces=(workload,), after=after) as release:  # fmt: skip
        # -- (a) install: the agent alone, a real pod on the real node -----------------------------------
        release.install(chartutil.chart_values(real_cluster, uri, database, state), ready=("agent",),
                        create_namespace=True)  # fmt: skip
        agent = release.pod("agent")
        assert agent is not None and agent["spec"]["nodeName"] == NODE
        image = agent["status"]["containerStatuses"][0]
        assert image["imageID"].endswith(real_cluster.real.image.split("@")[1])
        assert [p["spec"]["nodeName"] for p in release.pods()] == [NODE]  # the agent only

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
        chartutil.advertise_gpus(api, 8)
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
            release.upgrade(chartutil.chart_values(real_cluster, uri, database, state, workers=on),
                            ready=(worker,))  # fmt: skip
            pod = release.pod(worker)
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
                           lambda: not chartutil.faultline_marks(kube.nodes.read(api, NODE), running=True), 150,
                           interval=0.5)  # fmt: skip
        except TransientError as exc:
            raise AssertionError(release.diagnosis()) from exc
        procs.wait_for("GpuHealthy True again", lambda: gpu_condition().get("status") == "True", 60)
        for pod in release.pods():  # no component was restarted through the whole scenario
            said = (pod["metadata"]["name"], pod["status"])
            assert chartutil.restarts(pod) == [0] and chartutil.ready(pod), said

        # -- (c) uninstall: the post-delete hook takes back what the components left ---------------------
        kube.nodes.patch(api, NODE, {"spec": {"unschedulable": True}})  # an operator's cordon: it stays
        release.uninstall()
        for node in kube.nodes.list_all(api):
            name = node["metadata"]["name"]
            marks = [m for m in chartutil.faultline_marks(node)
                     if not (m == "cordoned" and name in {*sim_nodes, NODE})]  # fmt: skip
            assert not marks, (name, marks)
            assert not set(kube.nodes.conditions(api, name)) & OWNED_TYPES, name
        assert kube.nodes.read(api, NODE)["spec"].get("unschedulable") is True
        assert not kube.apps(api).list_namespaced_deployment(ns).items
        assert not kube.apps(api).list_namespaced_daemon_set(ns).items
        assert not kube.batch(api).list_namespaced_job(ns).items  # the repair Job and the hook's own
        assert request() is None
