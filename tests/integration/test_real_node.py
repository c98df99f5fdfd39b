"""A real node in the local cluster (kubelet, containerd, runc, bridge CNI; root only): it becomes Ready,
runs the project's image pulled from the loopback registry, its pods reach the API server and the store,
DaemonSets land on it, repair Jobs on it only record what they would do, and a crashed owner's changes
are undone by `dev cluster down`. That the machine is left as it was is asserted at the session's end
(conftest.no_host_change_left_behind)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest

from devtools import procs, realnode, realnode_check, realnode_host, session, tools
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from workers import janitor

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),  # the first test starts the cluster: tools built, image pushed
    pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)"),
]
NODE = "real-node-01"
PYTHON = "/opt/faultline/bin/python"
IN_POD = r"""
import json, ssl, subprocess, sys, urllib.request
import pymongo
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
helped = subprocess.run(["faultline", "--help"], capture_output=True, text=True)
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
review = urllib.request.Request(
    "https://kubernetes.default.svc:443/apis/authentication.k8s.io/v1/selfsubjectreviews".replace(
        "kubernetes.default.svc", __import__("os").environ["KUBERNETES_SERVICE_HOST"]),
    data=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode(),
    headers={"Authorization": "Bearer " + open(f"{sa}/token").read(), "Content-Type": "application/json"},
)
with urllib.request.urlopen(review, context=ctx, timeout=10) as resp:
    user = json.load(resp)["status"]["userInfo"]["username"]
client = pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=10000)
client[sys.argv[2]]["from_pod"].insert_one({"_id": "hello", "user": user})
print(json.dumps({"help": helped.returncode == 0 and "Usage" in helped.stdout, "user": user}))
"""


@pytest.fixture
def real_ns(real_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"real-{request.node.name[5:30].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:5]}"
    core = kube.core(real_cluster.api())
    core.create_namespace({"metadata": {"name": name}})
    procs.wait_for(
        "the default ServiceAccount", lambda: bool(core.read_namespaced_service_account("default", name)), 30
    )
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def _pod(api: Any, ns: str, name: str) -> dict[str, Any]:
    return kube.pods.read(api, ns, name)


def _phase(api: Any, ns: str, name: str, phases: set[str], timeout: float = 120) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def reached() -> bool:
        seen.update(_pod(api, ns, name))
        phase = seen.get("status", {}).get("phase")
        assert phase not in {"Failed"} - phases, f"pod {name} failed: {json.dumps(seen['status'])[:1500]}"
        return phase in phases

    procs.wait_for(f"pod {name} {'/'.join(sorted(phases))}", reached, timeout, interval=0.5)
    return seen


def test_the_real_node_is_ready_with_the_built_runtime(real_cluster: LocalCluster) -> None:
    node = kube.nodes.read(real_cluster.api(), NODE)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"] == "containerd://2.4.2"
    assert node["metadata"]["labels"][realnode.LABEL] == "true"
    assert {"type": "InternalIP", "address": real_cluster.real.ips[NODE]} in node["status"]["addresses"]  # type: ignore[union-attr]
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True", ready


def test_a_real_pod_of_the_project_image_reaches_the_api_server_and_the_store(
    real_cluster: LocalCluster, real_ns: str, real_store: str, mongo: LocalMongo
) -> None:
    assert real_cluster.real is not None
    api = real_cluster.api()
    db = f"t_real_{uuid.uuid4().hex[:8]}"
    uri = f"mongodb://{real_store}/?directConnection=true"
    pod = {
        "metadata": {"name": "probe"},
        "spec": {
            "nodeName": NODE, "restartPolicy": "Never",
            "containers": [{"name": "probe", "image": real_cluster.real.image,
                            "command": [PYTHON, "-c", IN_POD, uri, db]}],
        },
    }  # fmt: skip
    kube.core(api).create_namespaced_pod(real_ns, pod)
    done = _phase(api, real_ns, "probe", {"Succeeded"}, timeout=180)
    status = done["status"]["containerStatuses"][0]
    assert status["containerID"].startswith("containerd://")
    assert status["imageID"].endswith(real_cluster.real.image.split("@")[1])
    log = kube.core(api).read_namespaced_pod_log("probe", real_ns)  # through the kubelet's server
    said = json.loads(log.strip().splitlines()[-1])
    assert said == {"help": True, "user": f"system:serviceaccount:{real_ns}:default"}
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo.uri)
    try:
        assert client[db]["from_pod"].find_one({"_id": "hello"}) == {"_id": "hello", "user": said["user"]}
    finally:
        client.drop_database(db)
        client.close()


def test_a_daemonset_pod_runs_on_the_real_node(real_cluster: LocalCluster, real_ns: str) -> None:
    assert real_cluster.real is not None
    api = real_cluster.api()
    labels = {"app": "everywhere"}
    ds = {
        "metadata": {"name": "everywhere"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"tolerations": [{"operator": "Exists"}], "automountServiceAccountToken": False,
                         "terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "pause", "image": real_cluster.real.pause,
                                         "resources": {"limits": {"memory": "16Mi", "cpu": "50m"}}}]},
            },
        },
    }  # fmt: skip
    kube.apps(api).create_namespaced_daemon_set(real_ns, ds)

    def on_real_node() -> dict[str, Any] | None:
        for pod in kube.pods.list_all(api, field_selector=f"metadata.namespace={real_ns}"):
            if pod["spec"].get("nodeName") == NODE and pod.get("status", {}).get("phase") == "Running":
                return pod
        return None

    procs.wait_for("the DaemonSet's pod running on the real node", lambda: on_real_node() is not None, 120)
    pod = on_real_node()
    assert pod is not None
    assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    assert pod["status"]["podIP"].startswith("10.89.")
    in_ns = kube.pods.list_all(api, field_selector=f"metadata.namespace={real_ns}")
    nodes = {p["spec"].get("nodeName") for p in in_ns}
    assert nodes == {NODE, *real_cluster.node_names}  # and on the simulated node beside it


def test_repair_jobs_on_a_real_node_only_record_what_they_would_do(
    real_cluster: LocalCluster, real_ns: str, mongo_db: Any
) -> None:
    assert real_cluster.real is not None
    api = real_cluster.api()
    settings = janitor.Settings(namespace=real_ns, service_account="default", image=real_cluster.real.image,
                                record_only=True, poll=0.2)  # fmt: skip
    worker = janitor.Janitor(store.Store(mongo_db), api, settings, "test")
    boot = kube.nodes.read(api, NODE)["status"]["nodeInfo"]["bootID"]
    started = dt.datetime.now(dt.UTC)
    round_ = store.RepairRound(step="REBOOT", request="reboot-record")
    worker._job("reboot-record", NODE, settings.reboot_command, round_, ("real-node-test/none", 0),
                action="reboot")  # fmt: skip
    looks: list[tuple[str, str] | None] = []  # the janitor's looks at the Job until it finished

    def finished() -> bool:
        looks.append(worker._check_job("reboot-record", started))
        return looks[-1] is not None

    procs.wait_for("the Job finished", finished, 120)
    assert looks[-1] == ("Succeeded", "the Job succeeded (its command exited 0)")
    pods = kube.pods.list_all(api, field_selector=f"metadata.namespace={real_ns}")
    pod = next(p for p in pods if p["metadata"].get("labels", {}).get("job-name") == "reboot-record")
    assert pod["spec"]["nodeName"] == NODE
    assert not pod["spec"].get("hostPID")
    assert not pod["spec"]["containers"][0]["securityContext"].get("privileged")
    log = kube.core(api).read_namespaced_pod_log(pod["metadata"]["name"], real_ns)
    assert (
        log.strip()
        == f"faultline janitor (record only): would run reboot: {' '.join(settings.reboot_command)}"
    )
    assert kube.nodes.read(api, NODE)["status"]["nodeInfo"]["bootID"] == boot


def test_dev_cluster_down_undoes_a_crashed_real_node(tmp_path: Path, real_nodes_watched: None) -> None:
    """`dev cluster up --real-nodes 1` killed with SIGKILL mid-run (a pod running): `dev cluster down`
    stops its processes and undoes every change it made to the machine. (Another real-node cluster of
    the session may be running meanwhile: what is checked is this one's footprint.)"""
    state = tmp_path / "state.json"
    script = (
        "import sys; from pathlib import Path; from devtools import session\n"
        "session.up(1, lambda line: print(line, flush=True), state=Path(sys.argv[1]), real_nodes=1,"
        " project_image=False)\n"
    )
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "-c", script, str(state)], stdout=subprocess.PIPE, stderr=log, text=True,
        cwd=tools.REPO, start_new_session=True,
    )  # fmt: skip
    try:
        lines: dict[str, str] = {}
        assert up.stdout is not None
        for line in up.stdout:
            key, _, value = line.strip().partition("=")
            lines[key] = value
            if line.startswith("# ready"):
                break
        assert "KUBECONFIG" in lines, (tmp_path / "up.log").read_text()[-3000:]
        api = kube.api_client(Path(lines["KUBECONFIG"]))
        pod = {"metadata": {"name": "sleeper"}, "spec": {"nodeName": NODE, "automountServiceAccountToken": False,
               "containers": [{"name": "c", "image": f"{lines['REGISTRY']}/faultline/pause:1"}]}}  # fmt: skip
        kube.core(api).create_namespaced_pod("default", pod)
        _phase(api, "default", "sleeper", {"Running"})
        api.close()
        os.kill(up.pid, signal.SIGKILL)  # no cleanup of its own: its children and host changes stay
        up.wait(10)
        crashed = next(s for s in map(realnode_host.HostState.load, realnode_host.STATE_DIR.glob("slot-*.json"))
                       if s.owner == up.pid)  # fmt: skip
        ids = realnode_host.container_ids(Path(crashed.workdir))
        left = realnode_check.footprint(crashed, ids)
        for kind in ("process", "mount", "address", "bridge", "iptables chain", "cgroup", "directory"):
            assert any(item.startswith(kind) for item in left), (kind, left)
    finally:
        if up.poll() is None:
            os.kill(up.pid, signal.SIGKILL)
            up.wait(10)
        said = session.down(state=state)
        log.close()
        if up.stdout is not None:
            up.stdout.close()
    assert "undid the host changes of its real nodes" in said, said
    assert realnode_check.footprint(crashed, ids) == []
