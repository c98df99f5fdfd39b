"""Lists read in pages against the real API server: every Node and Pod once, in as many calls as the
pages take, and a continue token that expired starts the list again."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from faultline import kube
from faultline.errors import ApiError
from faultline.kube import client as kclient
from faultline.kube import translate

pytestmark = pytest.mark.integration


def _calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[dict[str, Any]]:
    """The keyword arguments (and, as `args`, the positional ones) of every call of CoreV1Api.`name` from
    now on (the call itself goes through)."""
    seen: list[dict[str, Any]] = []
    real = getattr(k8s.CoreV1Api, name)

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append({**kwargs, "args": args})
        return real(self, *args, **kwargs)

    monkeypatch.setattr(k8s.CoreV1Api, name, counted)
    return seen


def test_every_node_comes_once_in_as_many_calls_as_its_pages(
    api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = {n["metadata"]["name"] for n in kube.nodes.list_all(api)}  # one page of 500
    assert len(whole) >= 5
    monkeypatch.setattr(kclient, "LIST_PAGE", 2)
    calls = _calls(monkeypatch, "list_node")
    paged = [n["metadata"]["name"] for n in kube.nodes.list_all(api)]
    assert sorted(paged) == sorted(whole)  # none twice, none left out
    assert len(calls) == -(-len(whole) // 2)  # ceil: the last page has no continue token
    assert [c["limit"] for c in calls] == [2] * len(calls)
    assert "_continue" not in calls[0] and all(c["_continue"] for c in calls[1:])


def _expiring(
    monkeypatch: pytest.MonkeyPatch, when: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """Node lists in pages of 2 whose continue token the API server has compacted past (410) where
    `when(the calls so far)` says; the calls' keyword arguments."""
    monkeypatch.setattr(kclient, "LIST_PAGE", 2)
    real = k8s.CoreV1Api.list_node
    calls: list[dict[str, Any]] = []

    def expires(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        if kwargs.get("_continue") and when(calls):
            raise translate.error(410, "list", "Nodes", body='{"reason": "Expired", "message": "too old"}')
        return real(self, *args, **kwargs)

    monkeypatch.setattr(k8s.CoreV1Api, "list_node", expires)
    return calls


def test_a_continue_token_that_expired_starts_the_list_again(
    api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = k8s.CoreV1Api.list_node
    calls = _expiring(monkeypatch, lambda calls: len(calls) == 2)  # once: the second call
    names = [n["metadata"]["name"] for n in kube.nodes.list_all(api)]
    assert "_continue" not in calls[2]  # after the 410, from the first page again
    assert len(calls) == 2 + -(-len(names) // 2)
    monkeypatch.setattr(k8s.CoreV1Api, "list_node", real)
    assert sorted(names) == sorted(n["metadata"]["name"] for n in kube.nodes.list_all(api))  # each once


def _pods(api: Any, namespace: str, names: list[str]) -> None:
    for name in names:
        kube.core(api).create_namespaced_pod(namespace, {
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "pause"}], "nodeName": "nowhere"},
        })  # fmt: skip


# the test's namespace is named t-...: pods named a* sort before it, z* after it; read in pages from the
# top of every namespace, the API server (1.37) would hand the a* pods' first page twice and skip the z*
# pods after their first page, without an error
@pytest.mark.parametrize("prefix", ["a", "z"])
def test_pods_of_a_namespace_are_read_in_pages_whether_named_by_path_or_by_field(
    api: Any, namespace: str, monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    names = [f"{prefix}{i}" for i in range(5)]
    _pods(api, namespace, names)
    monkeypatch.setattr(kclient, "LIST_PAGE", 2)
    # (the simulated kubelets list pods too, from their threads: only this test's calls are counted)
    namespaced = _calls(monkeypatch, "list_namespaced_pod")
    everywhere = _calls(monkeypatch, "list_pod_for_all_namespaces")

    def ours() -> list[dict[str, Any]]:
        return [c for c in namespaced if c["args"] == (namespace,)]

    pods = kube.pods.list_all(api, namespace=namespace)
    assert sorted(p["metadata"]["name"] for p in pods) == names
    assert len(ours()) == 3
    by_field = kube.pods.list_all(api, field_selector=f"metadata.namespace={namespace},status.phase!=Failed")
    assert sorted(p["metadata"]["name"] for p in by_field) == names
    assert len(ours()) == 6 and ours()[-1]["field_selector"] == "status.phase!=Failed"
    assert not [c for c in everywhere if namespace in str(c.get("field_selector"))]  # the namespace's path


def test_a_continue_token_handed_twice_fails_the_list(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kclient, "LIST_PAGE", 2)
    real = k8s.CoreV1Api.list_node
    first: list[str] = []

    def same_token(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_continue"):  # the server answers every later page with the first page's token
            kwargs["_continue"] = first[0]
        response = real(self, *args, **kwargs)
        first.append(json.loads(response.data)["metadata"].get("continue", ""))
        return _Answer(response.data)

    monkeypatch.setattr(k8s.CoreV1Api, "list_node", same_token)
    with pytest.raises(ApiError, match="the same continue token twice"):
        kube.nodes.list_all(api)


class _Answer:
    def __init__(self, data: bytes) -> None:
        self.data = data


def test_a_list_whose_token_keeps_expiring_fails_naming_the_list(
    api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _expiring(monkeypatch, lambda calls: True)  # every time
    with pytest.raises(ApiError) as caught:
        kube.nodes.list_all(api)
    assert caught.value.status == 410 and "Nodes" in str(caught.value)
    assert len(calls) == 2 * (kclient.LIST_RESTARTS + 1)  # each try: its first page, then the expired token


@pytest.mark.parametrize("prefix", ["a", "z"])
def test_an_informer_of_every_namespace_by_a_namespace_field_lists_each_pod_once(
    api: Any, namespace: str, prefix: str
) -> None:
    names = [f"{prefix}{i}" for i in range(5)]
    _pods(api, namespace, names)
    changes: list[kube.watch.Change] = []
    target = kube.watch.Target("v1", "Pod", field_selector=f"metadata.namespace={namespace}")
    informer = kube.watch.Informer(api, target, changes.append, timeout=5, page=2).start()
    try:
        assert informer.synced.wait(30), informer.stats
    finally:
        informer.halt()
    assert changes[0].kind == "replace"
    assert sorted(o["metadata"]["name"] for o in changes[0].objects) == names
    assert informer.stats.lists == 1
    assert informer.stats.paths == [f"/api/v1/namespaces/{namespace}/pods"]
