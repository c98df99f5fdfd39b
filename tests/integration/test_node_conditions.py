"""Node conditions and Events written to the real API server, next to the (fake) kubelet's own."""

from __future__ import annotations

from typing import Any

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from faultline import conditions, kube
from tests.unit.test_conditions import fault

pytestmark = pytest.mark.integration


def test_conditions_follow_faults_and_survive_kubelet_heartbeats(cluster: LocalCluster, api: Any) -> None:
    node = cluster.node_names[1]
    kube.nodes.apply_conditions(api, node, conditions.desired([fault("XID-79")]))
    got = kube.nodes.conditions(api, node)
    assert (got["GpuHealthy"]["status"], got["GpuHealthy"]["reason"]) == ("False", "XID-79")
    assert got["Ready"]["status"] == "True"  # the kubelet's condition is untouched
    beat = kube.core(api).read_node_status(node).status.conditions
    ready_beat = next(c.last_heartbeat_time for c in beat if c.type == "Ready")

    def kubelet_beat_since() -> bool:
        conds = kube.core(api).read_node_status(node).status.conditions
        return next(c.last_heartbeat_time for c in conds if c.type == "Ready") > ready_beat

    procs.wait_for("a kubelet heartbeat after ours", kubelet_beat_since, 10)
    assert kube.nodes.conditions(api, node)["GpuHealthy"]["reason"] == "XID-79"

    kube.nodes.apply_conditions(api, node, conditions.desired([fault("XID-79", resolved=True)]))
    assert kube.nodes.conditions(api, node)["GpuHealthy"]["status"] == "True"

    kube.nodes.apply_conditions(
        api, node, conditions.desired([], types=["GpuHealthy"])
    )  # the other checks were switched off
    got = kube.nodes.conditions(api, node)
    assert "GpuHealthy" in got and "NicHealthy" not in got and "NvSwitchHealthy" not in got
    assert got["Ready"]["status"] == "True"


def test_events_about_a_node(cluster: LocalCluster, api: Any) -> None:
    node = cluster.node_names[0]
    kube.events.post_node(
        api, node, reason="XID-79", note="GPU 0000:3b:00 fell off the bus", action="Detected", warning=True,
        controller="faultline.io/agent", instance=f"agent-{node}",
    )  # fmt: skip
    # read back through core/v1: the events.k8s.io list model rejects other components' events without eventTime
    events = (
        kube.core(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    )
    mine = [e for e in events if e.reason == "XID-79"]
    assert mine, [e.reason for e in events]
    assert (mine[-1].type, mine[-1].message, mine[-1].reporting_component) == (
        "Warning",
        "GPU 0000:3b:00 fell off the bus",
        "faultline.io/agent",
    )
