"""The agent's small Kubernetes client (the light transport, `faultline.kube.lite`) against the real API server: kubeconfig files (paths and inline
data), in-cluster service-account credentials with RBAC applied, condition patches, Events, and errors."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.cluster import LocalCluster
from faultline import conditions, kube
from faultline.errors import ApiUnavailableError, ConfigError, ForbiddenError, NotFoundError
from faultline.kube import bodies, lite

pytestmark = pytest.mark.integration


def _node(cluster: LocalCluster) -> str:
    return cluster.node_names[-1]


def test_kubeconfig_paths_and_inline_data_reach_the_same_server(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    client = lite.Client.connect(cluster.kubeconfig)
    try:
        node = lite.read_node_status(client, _node(cluster))
        assert node["metadata"]["name"] == _node(cluster)
        assert "Ready" in bodies.node_conditions(node)
    finally:
        client.close()
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    cluster_entry, user = doc["clusters"][0]["cluster"], doc["users"][0]["user"]
    for key in ("certificate-authority", "client-certificate", "client-key"):
        path = Path(cluster_entry.pop(key) if key in cluster_entry else user.pop(key))
        target = cluster_entry if key == "certificate-authority" else user
        target[f"{key}-data"] = base64.b64encode(path.read_bytes()).decode()
    inline = tmp_path / "inline.kubeconfig"
    inline.write_text(yaml.safe_dump(doc))
    client = lite.Client.connect(inline)
    try:
        assert lite.read_node_status(client, _node(cluster))["kind"] == "Node"
    finally:
        client.close()


def test_conditions_patch_delete_and_events(cluster: LocalCluster, api: Any) -> None:
    node = _node(cluster)
    client = lite.Client.connect(cluster.kubeconfig)
    try:
        wanted = conditions.Condition("NicHealthy", "False", "NIC-LINK-DOWN", "nic mlx5_0 x1 (fatal)")
        now = dt.datetime.now(dt.UTC)
        patched = lite.patch_node_conditions(client, node, [wanted.as_patch(now, True)], [])
        assert patched is not None
        assert bodies.node_conditions(patched)["NicHealthy"]["reason"] == "NIC-LINK-DOWN"
        assert kube.nodes.conditions(api, node)["NicHealthy"]["status"] == "False"  # as others see it
        assert lite.patch_node_conditions(client, node, [], []) is None  # nothing to write, no call
        patched = lite.patch_node_conditions(client, node, [], ["NicHealthy"])
        assert patched is not None
        assert "NicHealthy" not in bodies.node_conditions(patched)
        assert "Ready" in bodies.node_conditions(patched)  # other conditions untouched
        lite.post_node_event(
            client, node, reason="KubeliteCheck", note="x" * 2000, action="Detected", warning=True,
            controller="faultline.io/agent", instance="agent-test",
        )  # fmt: skip
        events = kube.core(api).list_namespaced_event("default", field_selector="reason=KubeliteCheck").items
        assert [(e.type, e.involved_object.name, len(e.message)) for e in events] == [("Warning", node, 1024)]
        with pytest.raises(NotFoundError) as missing:
            lite.read_node_status(client, "no-such-node")
        assert missing.value.status == 404
        assert "no-such-node" in str(missing.value)
    finally:
        client.close()


def test_in_cluster_credentials_with_rbac(
    cluster: LocalCluster, api: Any, namespace: str, tmp_path: Path
) -> None:
    kube.core(api).create_namespaced_service_account(namespace, {"metadata": {"name": "lite"}})
    mount = tmp_path / "serviceaccount"
    env = cluster.service_account_mount(namespace, "lite", mount)
    client = lite.Client.connect(None, environ=env)
    try:
        review = client.request(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )  # fmt: skip
        assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:lite"
        with pytest.raises(ForbiddenError) as denied:
            lite.read_node_status(client, _node(cluster))
        assert denied.value.status == 403
    finally:
        client.close()
    (mount / "token").unlink()
    with pytest.raises(ConfigError, match=r"in-cluster token .*token does not exist"):
        lite.Client.connect(None, environ=env)
    with pytest.raises(ConfigError, match=r"in-cluster CA .*ca.crt: No such file"):
        lite.Client.connect(None, environ={**env, "FAULTLINE_SERVICE_ACCOUNT_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        lite.Client.connect(None, environ={})


def test_unreachable_server_is_transient_and_bad_kubeconfigs_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nope\ncontexts: []\n")
    with pytest.raises(ConfigError, match=r"bad.kubeconfig: no context named 'nope'"):
        lite.from_kubeconfig(bad)
    bad.write_text(
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\nusers: [{name: u, user: {}}]\n"
    )
    with pytest.raises(ConfigError, match="is not an https:// URL"):
        lite.from_kubeconfig(bad)
    bad.write_text(bad.read_text().replace("http://127.0.0.1:1", "https://127.0.0.1:1"))
    client = lite.Client(lite.from_kubeconfig(bad), timeout=2)
    with pytest.raises(ApiUnavailableError):
        lite.read_node_status(client, "n")
