"""The GPU Operator's GPU clients on a real node, stopped for a GPU reset and brought back after, by the node
labels the GPU Operator itself deploys them by (`nvidia.com/gpu.deploy.<operand>`: its DaemonSets select
nodes where the label is "true"; NVIDIA's reset procedure needs every process off the GPU first).

Stand-ins of the operands the janitor pauses by default (the device plugin, DCGM, the DCGM exporter):
DaemonSets with the GPU Operator's names and node selectors whose containers are the pause program, run by
the real kubelet, containerd and runc. The janitor's own label change (workers/gpu_clients.py, the
default `gpu_client_labels`) makes the real DaemonSet controller take each pod off the node and the real
kubelet stop its container; the change back brings new pods, Running again. An operand its admin switched
off ("false") stays off.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from faultline import kube
from faultline.config.workers import JanitorTuning
from tests.integration.chartutil import NODE
from workers import gpu_clients

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)"),
]

OPERANDS = {  # the GPU Operator's DaemonSet names and the deploy label each selects on
    "nvidia-device-plugin-daemonset": "nvidia.com/gpu.deploy.device-plugin",
    "nvidia-dcgm": "nvidia.com/gpu.deploy.dcgm",
    "nvidia-dcgm-exporter": "nvidia.com/gpu.deploy.dcgm-exporter",
}


def _daemonset(name: str, label: str, pause: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {label: "true", "kubernetes.io/hostname": NODE},
                    "tolerations": [{"operator": "Exists"}],
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": name, "image": pause}],
                },
            },
        },
    }


@pytest.mark.usefixtures("sim_nodes_cordoned")
def test_a_gpu_reset_stops_the_gpu_operator_s_clients_on_the_real_node_and_brings_them_back(
    real_cluster: LocalCluster,
) -> None:
    assert real_cluster.real is not None
    api = real_cluster.api()
    core, apps = kube.core(api), kube.apps(api)
    ns = f"gpu-operator-{uuid.uuid4().hex[:5]}"
    keys = JanitorTuning().gpu_client_labels
    assert set(keys) == set(OPERANDS.values())

    def labels() -> dict[str, str]:
        return dict(kube.nodes.read(api, NODE)["metadata"].get("labels") or {})

    def running() -> dict[str, str]:
        """Operand -> its Running pod's uid on the real node (containers started by containerd)."""
        out = {}
        for pod in core.list_namespaced_pod(ns).items:
            statuses = pod.status.container_statuses or []
            if (pod.spec.node_name == NODE and pod.metadata.deletion_timestamp is None
                    and pod.status.phase == "Running" and statuses and statuses[0].state.running):  # fmt: skip
                out[pod.metadata.labels["app"]] = pod.metadata.uid
        return out

    def pods() -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(ns).items]

    # the device plugin and the exporter deployed; DCGM switched off by the cluster's admin
    deployed = {"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.dcgm": "false",
                "nvidia.com/gpu.deploy.dcgm-exporter": "true"}  # fmt: skip
    kube.nodes.patch(api, NODE, {"metadata": {"labels": deployed}})
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
    try:
        for name, label in OPERANDS.items():
            apps.create_namespaced_daemon_set(ns, _daemonset(name, label, real_cluster.real.pause))  # type: ignore[arg-type]
        on = {"nvidia-device-plugin-daemonset", "nvidia-dcgm-exporter"}
        procs.wait_for(
            "the operands running on the real node", lambda: set(running()) == on, 120, interval=0.5
        )
        before = running()
        node_before = labels()

        # the janitor's change before the reset Job: each deployed operand paused, the agent's label set
        paused = gpu_clients.pause(node_before, keys)
        assert paused == {"nvidia.com/gpu.deploy.device-plugin": gpu_clients.PAUSED,
                          "nvidia.com/gpu.deploy.dcgm-exporter": gpu_clients.PAUSED,
                          gpu_clients.AGENT_LABEL: gpu_clients.AGENT_PAUSED}  # fmt: skip
        kube.nodes.patch(api, NODE, {"metadata": {"labels": paused}})
        procs.wait_for("every operand's pod gone from the node (its container stopped)", lambda: not pods(), 120,
                       interval=0.5)  # fmt: skip

        # and after it: the operands come back as new pods, the admin's "false" as it was
        back = gpu_clients.resume(labels())
        kube.nodes.patch(api, NODE, {"metadata": {"labels": back}})
        procs.wait_for("the operands running again", lambda: set(running()) == on, 120, interval=0.5)
        again = running()
        assert all(again[n] != before[n] for n in on)  # new pods: the old ones were stopped
        assert {k: labels().get(k) for k in (*deployed, gpu_clients.AGENT_LABEL)} == {
            **deployed, gpu_clients.AGENT_LABEL: None}  # fmt: skip
    finally:
        core.delete_namespace(ns)
        kube.nodes.patch(
            api, NODE, {"metadata": {"labels": dict.fromkeys((*deployed, gpu_clients.AGENT_LABEL))}}
        )
        procs.wait_for("the stand-ins' namespace gone", lambda: ns not in
                       [n.metadata.name for n in core.list_namespace().items], 120, interval=1)  # fmt: skip
