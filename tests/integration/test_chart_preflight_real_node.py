"""Preflight as real pods (issue 18): `helm install oci://<loopback registry>/faultline` with
`preflight.enabled` (the default failurePolicy, Ignore) beside the agent (simulated GPUs) and the quarantine
worker, into the local cluster with a real kubelet node; the webhook's Deployment runs on that node, and
the API server calls it for real, through its Service.

(a) the webhook pod becomes Ready and is never restarted; it made its CA and serving certificate in its
    Secret and set that CA as the caBundle of the chart's MutatingWebhookConfiguration;
(b) in a namespace labelled faultline.io/preflight=enabled, a pod asking for the node's 8 nvidia.com/gpu
    (the test advertises them on the real node, as a device plugin would) gets the `faultline preflight`
    init container, which runs on the node against the simulated GPUs of `preflight.simDir` (a node
    directory the agent does not follow, so only preflight's report can tell the pipeline about them); on
    healthy GPUs it exits 0, says so in its log and sends nothing, and the pod's container runs;
(c) a GPU pod in an unlabelled namespace gets no init container and runs;
(d) with a row remapping pending on one GPU, the init container of a pod in the labelled namespace (run
    as user 65532, no host path but the simulator's directory, nothing reported by itself) exits 1 with
    the readable reason as its termination message in the pod's status, the findings on its last line; the
    pod's container is never created; the object monitor, believing the container because the kubelet
    ran it from faultline's image digest, writes PREFLIGHT-REMAP-PENDING as a signed fault of the node,
    so the quarantine worker (evidence required, the chart's default) cordons and taints the node;
(e) `helm uninstall`: no webhook configuration, webhook Secret or pod of the release is left, and the
    post-delete hook took the quarantine back.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from faultline import kube, preflight
from faultline.errors import NotFoundError, TransientError
from faultline.kube import lite
from faultline.kube import preflight as ops
from sources import simulator
from tests.integration import chartutil
from tests.integration.chartutil import NODE
from workers import rules

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),  # the first real-node test starts the cluster: tools built, image pushed
    pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)"),
]
RELEASE = "flp"
GPUS = 8  # the simulated board's, and what each of the test's pods asks for
REMAP = (
    "preflight remap failed: PREFLIGHT-REMAP-PENDING on GPU 0000:3a:00: a row remapping waits for a GPU reset"
)


def _values(cluster: LocalCluster, uri: str, database: str, state: Path, sim_dir: Path) -> dict[str, Any]:
    """The real-node chart test's agent and quarantine worker, and preflight: one webhook replica on the
    real node, checking the simulated GPUs of `sim_dir`."""
    values = chartutil.chart_values(cluster, uri, database, state, workers=("quarantine",))
    values["preflight"] = {"enabled": True, "replicas": 1, "simDir": str(sim_dir),
                           "nodeSelector": {"kubernetes.io/hostname": NODE}}  # fmt: skip
    # the object monitor reads failed preflights' findings (its built-in rules are not this test's subject)
    values["objectMonitor"] = {"enabled": True, "builtinRules": False,
                               "nodeSelector": {"kubernetes.io/hostname": NODE},
                               "tolerations": [{"operator": "Exists"}]}  # fmt: skip
    return values


def _gpu_pod(name: str, image: str) -> dict[str, Any]:
    """A pod asking for all the node's GPUs, placed by the scheduler (the simulated nodes are cordoned)."""
    return {
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE}, "restartPolicy": "Never",
                 "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "train", "image": image,
                                 "resources": {"limits": {"nvidia.com/gpu": str(GPUS)}}}]},
    }  # fmt: skip


def _phase(api: Any, ns: str, name: str) -> str:
    return str(kube.pods.read(api, ns, name).get("status", {}).get("phase", ""))


def _gone(api: Any, ns: str, name: str) -> bool:
    try:
        kube.pods.read(api, ns, name)
    except NotFoundError:
        return True
    return False


def _namespace(api: Any, name: str, labels: dict[str, str]) -> None:
    core = kube.core(api)
    core.create_namespace({"metadata": {"name": name, "labels": labels}})  # type: ignore[arg-type]
    procs.wait_for(f"namespace {name}'s ServiceAccount",
                   lambda: bool(core.read_namespaced_service_account("default", name)), 30)  # fmt: skip


def _preflight_events(db: Any) -> list[dict[str, Any]]:
    return list(db["health_events"].find({"node": NODE, "code": {"$regex": "^PREFLIGHT-"}}, {"_id": 0}))


@pytest.mark.usefixtures("sim_nodes_cordoned")
def test_the_webhook_and_its_init_container_run_as_real_pods_on_a_real_node(
    real_cluster: LocalCluster, real_store: str, store_db: tuple[str, Any], helm_env: dict[str, str],
    tmp_path: Path,
) -> None:  # fmt: skip
    real = real_cluster.real
    assert real is not None
    assert not real.proxy_off, f"Services are not routed on this cluster's real node: {real.proxy_off}"
    started = time.monotonic()
    api = real_cluster.api()
    core = kube.core(api)
    client = lite.Client.connect(real_cluster.kubeconfig)
    database, db = store_db
    suffix = uuid.uuid4().hex[:6]
    ns, enabled, plain = f"flp-{suffix}", f"train-{suffix}", f"plain-{suffix}"
    state = tmp_path / "node" / "state"
    (state / "sim").mkdir(parents=True)
    sim_dir = tmp_path / "node" / "preflight-sim"  # what preflight checks; the agent follows state/sim
    sim_dir.mkdir()
    uri = f"mongodb://{real_store}/?retryWrites=false&directConnection=true"
    webhook_config, secret = f"{RELEASE}-preflight", f"{RELEASE}-webhook-tls"
    seconds: dict[str, float] = {}
    with chartutil.Release(real_cluster, helm_env, RELEASE, ns, values=tmp_path / "values.yaml", db=db,
                           namespaces=(enabled, plain), after=client.close) as release:  # fmt: skip
        # -- (a) install: the webhook Ready on the real node, its certificates made and trusted ---------------
        chartutil.advertise_gpus(api, GPUS)
        installed = release.install(_values(real_cluster, uri, database, state, sim_dir),
                                    ready=("webhook", "agent", "quarantine", "object-monitor"),
                                    create_namespace=True)  # fmt: skip
        seconds["install to Ready"] = time.monotonic() - installed
        webhook = release.pod("webhook")
        assert webhook is not None and webhook["spec"]["nodeName"] == NODE
        assert webhook["status"]["containerStatuses"][0]["imageID"].endswith(real.image.split("@")[1])
        procs.wait_for("the caBundle set by the webhook",
                       lambda: ops.webhook_ca_bundles(client, webhook_config)[0] != [b""], 60, interval=0.5)  # fmt: skip
        found = ops.read_secret(client, ns, secret)
        assert found is not None
        certificates = found[0]
        assert {"ca.crt", "ca.key", "tls.crt", "tls.key"} <= set(certificates), sorted(certificates)
        assert ops.webhook_ca_bundles(client, webhook_config)[0] == [certificates["ca.crt"]]
        (hook,) = client.request(
            "GET", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{webhook_config}"
        )["webhooks"]
        assert hook["failurePolicy"] == "Ignore"  # the chart's default
        assert hook["clientConfig"]["service"] == {"name": f"{RELEASE}-webhook", "namespace": ns,
                                                   "path": "/mutate", "port": 443}  # fmt: skip

        # -- (b) a labelled namespace: healthy GPUs pass, the pod's container runs ---------------------------
        _namespace(api, enabled, {preflight.NAMESPACE_LABEL: preflight.ENABLED})
        admitted = time.monotonic()
        core.create_namespaced_pod(enabled, _gpu_pod("passes", real.pause))  # type: ignore[arg-type]
        procs.wait_for("the pod that passed preflight running",
                       lambda: _phase(api, enabled, "passes") == "Running", 120, interval=0.5)  # fmt: skip
        seconds["created to running, preflight passed"] = time.monotonic() - admitted
        pod = kube.pods.read(api, enabled, "passes")
        init = pod["spec"]["initContainers"][0]
        assert (init["name"], init["image"]) == (preflight.CONTAINER, real.image)
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["faultline-preflight-sim"]["hostPath"]["path"] == str(sim_dir)
        assert set(volumes) == {"faultline-preflight-sim"}  # no socket, no journal: no other host path
        assert init["securityContext"]["runAsUser"] == 65532 and init["securityContext"]["runAsNonRoot"]
        assert pod["metadata"]["labels"][preflight.INJECTED_LABEL] == "true"
        (status,) = pod["status"]["initContainerStatuses"]
        done = status["state"]["terminated"]
        assert (status["name"], done["exitCode"], done["reason"], status["restartCount"]) == (
            preflight.CONTAINER, 0, "Completed", 0,
        ), status  # fmt: skip
        assert status["containerID"].startswith("containerd://")
        assert status["imageID"].endswith(real.image.split("@")[1])
        assert not done.get("message")  # success writes nothing
        assert "running" in pod["status"]["containerStatuses"][0]["state"]
        log = core.read_namespaced_pod_log("passes", enabled, container=preflight.CONTAINER)
        assert f"preflight: passed ({', '.join(preflight.CHECKS)})" in log, log
        assert _preflight_events(db) == []  # and sends nothing
        core.delete_namespaced_pod("passes", enabled)  # gone once the kubelet has stopped it: GPUs free
        procs.wait_for("the pod that passed gone", lambda: _gone(api, enabled, "passes"), 60, interval=0.5)

        # -- (c) an unlabelled namespace: no init container, the pod runs ------------------------------------
        _namespace(api, plain, {})
        core.create_namespaced_pod(plain, _gpu_pod("unchecked", real.pause))  # type: ignore[arg-type]
        procs.wait_for("the pod of the unlabelled namespace running",
                       lambda: _phase(api, plain, "unchecked") == "Running", 120, interval=0.5)  # fmt: skip
        pod = kube.pods.read(api, plain, "unchecked")
        assert "initContainers" not in pod["spec"] and "volumes" not in pod["spec"], pod["spec"]
        core.delete_namespaced_pod("unchecked", plain)
        procs.wait_for("the unchecked pod gone", lambda: _gone(api, plain, "unchecked"), 60, interval=0.5)

        # -- (d) a pending row remapping: the init container fails, the report quarantines the node --------
        simulator.inject(NODE, 2, kind="field", name="remapped_rows_pending", value=1, directory=sim_dir)
        admitted = time.monotonic()
        core.create_namespaced_pod(enabled, _gpu_pod("blocked", real.pause))  # type: ignore[arg-type]
        procs.wait_for("the pod that failed preflight Failed",
                       lambda: _phase(api, enabled, "blocked") == "Failed", 120, interval=0.5)  # fmt: skip
        seconds["created to failed, preflight failed"] = time.monotonic() - admitted
        pod = kube.pods.read(api, enabled, "blocked")
        (status,) = pod["status"]["initContainerStatuses"]
        done = status["state"]["terminated"]
        assert (status["name"], done["exitCode"]) == (preflight.CONTAINER, 1), status
        assert done["message"].startswith(REMAP), done["message"]
        assert [f.code for f in preflight.read_findings(done["message"])] == ["PREFLIGHT-REMAP-PENDING"]
        apps = pod["status"].get("containerStatuses") or []
        assert not [c for c in apps if "containerID" in c or "running" in c["state"]], apps  # never created

        def quarantined() -> bool:
            node = kube.nodes.read(api, NODE)
            taints = {(t["key"], t.get("value")) for t in node["spec"].get("taints") or []}
            return (
                bool(node["spec"].get("unschedulable"))
                and (rules.FAULT_TAINT, "PREFLIGHT-REMAP-PENDING") in taints
            )

        try:
            procs.wait_for("the preflight finding in the store", lambda: bool(_preflight_events(db)), 30,
                           interval=0.5)  # fmt: skip
            procs.wait_for("the real node cordoned and tainted", quarantined, 60, interval=0.5)
        except TransientError as exc:
            raise AssertionError(release.diagnosis()) from exc
        seconds["created to quarantined"] = time.monotonic() - admitted
        (event,) = _preflight_events(db)
        # recorded by the object monitor from the pod's status, naming the pod
        assert (event["code"], event["healthy"], event["metadata"]["source"], event["agent"]) == (
            "PREFLIGHT-REMAP-PENDING", False, "preflight", "faultline-object-monitor",
        ), event  # fmt: skip
        assert event["metadata"]["pod"] == f"{enabled}/blocked", event
        fault = db["faults"].find_one({"node": NODE, "code": "PREFLIGHT-REMAP-PENDING"})
        assert fault is not None
        assert fault["evidence"]["by"] == "cluster:object-monitor", fault
        assert (fault["fatal"], fault["action"], fault["entity"]) == (
            True, "COMPONENT_RESET", {"type": "GPU", "id": "0000:3a:00"},
        )  # fmt: skip
        for pod in release.pods():  # none was restarted through the whole scenario
            said = (pod["metadata"]["name"], pod["status"])
            assert chartutil.restarts(pod) == [0] and chartutil.ready(pod), said

        # -- (e) uninstall: no webhook configuration left, the quarantine taken back --------------------------
        release.uninstall()
        configurations = client.request(
            "GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
        )
        left = [c["metadata"]["name"] for c in configurations["items"]
                if c["metadata"]["name"] == webhook_config
                or (c["metadata"].get("labels") or {}).get("app.kubernetes.io/instance") == RELEASE]  # fmt: skip
        assert not left, left
        # the TLS Secret is the Secrets hook's, not the release's: uninstall leaves it (a reinstall reuses it)
        left_secret = ops.read_secret(client, ns, secret)
        assert left_secret is not None and {"tls.crt", "tls.key"} <= set(left_secret[0])
        assert not kube.apps(api).list_namespaced_deployment(ns).items
        assert not chartutil.faultline_marks(kube.nodes.read(api, NODE))
        seconds["test"] = time.monotonic() - started
        print("\npreflight on a real node: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
