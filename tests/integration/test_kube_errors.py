"""API errors against the real API server come out of both transports (the full client and the agent's
light one) as the same `faultline.errors` classes, naming the verb and the object."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import fakelet
from devtools.cluster import LocalCluster
from faultline import kube
from faultline.errors import (
    AlreadyExistsError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    PermanentError,
)
from faultline.kube import bodies, lite

pytestmark = pytest.mark.integration


@pytest.fixture
def light(cluster: LocalCluster) -> Iterator[lite.Client]:
    client = lite.Client.connect(cluster.kubeconfig)
    yield client
    client.close()


@pytest.fixture
def node(api: Any) -> Iterator[str]:
    """A Node object of this test's own (no kubelet writes to it)."""
    name = f"e-{uuid.uuid4().hex[:8]}"
    kube.nodes.create(api, fakelet.node_manifest(fakelet.SimNode(name, "10.9.0.2"), 8))
    yield name
    kube.nodes.delete(api, name)


def test_not_found(api: Any, light: lite.Client) -> None:
    with pytest.raises(NotFoundError) as full:
        kube.nodes.read(api, "no-such-node")
    with pytest.raises(NotFoundError) as small:
        lite.read_node_status(light, "no-such-node")
    for err in (full.value, small.value):
        assert err.status == 404 and isinstance(err, PermanentError)
        assert str(err).startswith("get Node no-such-node: HTTP 404 NotFound: "), err
    with pytest.raises(NotFoundError, match="get Namespace no-such-namespace"):
        kube.namespaces.read(api, "no-such-namespace")


def test_conflict_on_a_stale_resource_version(api: Any, light: lite.Client, node: str) -> None:
    stale = kube.nodes.read(api, node)["metadata"]["resourceVersion"]
    kube.nodes.patch(api, node, {"metadata": {"labels": {"faultline.io/test": "changed"}}})  # a new version
    with pytest.raises(ConflictError) as full:
        kube.nodes.patch(
            api, node, {"metadata": {"labels": {"faultline.io/test": "x"}}}, resource_version=stale
        )
    with pytest.raises(ConflictError) as small:
        light.request(
            "PATCH", f"/api/v1/nodes/{node}", {"metadata": {"resourceVersion": stale, "labels": {"a": "b"}}},
            content_type=bodies.MERGE, what=f"Node {node}",
        )  # fmt: skip
    for err in (full.value, small.value):
        assert type(err) is ConflictError and err.status == 409
        assert str(err).startswith(f"patch Node {node}: HTTP 409 Conflict: "), err
    assert (
        kube.nodes.read(api, node)["metadata"]["labels"]["faultline.io/test"] == "changed"
    )  # neither applied
    current = kube.nodes.read(api, node)["metadata"]["resourceVersion"]
    kube.nodes.patch(
        api, node, {"metadata": {"labels": {"faultline.io/test": None}}}, resource_version=current
    )
    assert "faultline.io/test" not in kube.nodes.read(api, node)["metadata"]["labels"]


def test_already_exists_is_a_conflict(api: Any, light: lite.Client, node: str) -> None:
    manifest = fakelet.node_manifest(fakelet.SimNode(node, "10.9.0.2"), 8)
    with pytest.raises(AlreadyExistsError, match=f"create Node {node}: HTTP 409 AlreadyExists"):
        kube.nodes.create(api, manifest)
    with pytest.raises(AlreadyExistsError):
        light.request("POST", "/api/v1/nodes", manifest)


def test_forbidden_for_a_service_account_without_the_right(
    cluster: LocalCluster, api: Any, namespace: str, tmp_path: Path
) -> None:
    kube.core(api).create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    kubeconfig = cluster.service_account_kubeconfig(namespace, "nobody")
    name = cluster.node_names[0]
    sa_api = kube.api_client(kubeconfig)
    small = lite.Client.connect(kubeconfig)
    try:
        with pytest.raises(ForbiddenError) as full:
            kube.nodes.read(sa_api, name)
        with pytest.raises(ForbiddenError) as light:
            lite.read_node_status(small, name)
        for err in (full.value, light.value):
            assert err.status == 403 and isinstance(err, PermanentError)
            assert str(err).startswith(f"get Node {name}: HTTP 403 Forbidden: "), err
            assert f"system:serviceaccount:{namespace}:nobody" in str(err)  # the server's words kept
        with pytest.raises(ForbiddenError, match=f"evict Pod {namespace}/p"):
            kube.pods.evict(sa_api, namespace, "p")
    finally:
        sa_api.close()
        small.close()


def test_invalid_bodies(api: Any, light: lite.Client) -> None:
    name = "no-such-node-either"
    bad = {"reason": "Check", "note": "n", "action": "Check", "warning": False, "instance": "t",
           "controller": "not a valid controller!"}  # fmt: skip
    with pytest.raises(InvalidError) as full:
        kube.events.post_node(api, name, **bad)
    with pytest.raises(InvalidError) as small:
        lite.post_node_event(light, name, **bad)
    for err in (full.value, small.value):
        assert err.status == 422 and isinstance(err, PermanentError)
        assert str(err).startswith(f"create Event on Node {name}: HTTP 422 Invalid: "), err
        assert "reportingController" in str(err)
    with pytest.raises(InvalidError) as malformed:  # not JSON the server can decode: 400
        light.request("POST", "/apis/events.k8s.io/v1/namespaces/default/events", "not an object")
    assert malformed.value.status == 400
