"""Pods: list those on a node (plain JSON), evict and delete them, and (for the simulated kubelet) set
their status.

An eviction a PodDisruptionBudget refuses right now is the API server's 429: `evict` raises
ThrottledError for it (its `delay` is the server's Retry-After), so a drain backs off and tries that pod
again later; it never deletes around the budget.
"""

from __future__ import annotations

from typing import Any

from faultline.kube.client import ApiClient, core, pinned_namespace, read_items, read_json, send_json


def on_node(api: ApiClient, node: str) -> list[dict[str, Any]]:
    """The pods bound to `node`, in every namespace, as plain JSON."""
    return list_all(api, field_selector=f"spec.nodeName={node}", what=f"pods on Node {node}")


def list_all(
    api: ApiClient, *, field_selector: str | None = None, label_selector: str | None = None,
    namespace: str | None = None, what: str = "pods",
) -> list[dict[str, Any]]:  # fmt: skip
    """Pods of every namespace, or of `namespace`, optionally by field and label selectors, as plain
    JSON, read in pages (a field selector pinning one namespace is sent to that namespace's path)."""
    if namespace is None:
        namespace, field_selector = pinned_namespace(field_selector)
    kwargs = {k: v for k, v in (("field_selector", field_selector), ("label_selector", label_selector)) if v}
    if namespace is not None:
        return read_items("list", what, core(api).list_namespaced_pod, namespace, **kwargs)
    return read_items("list", what, core(api).list_pod_for_all_namespaces, **kwargs)


def read(api: ApiClient, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = read_json(
        "get", f"Pod {namespace}/{name}", core(api).read_namespaced_pod, name, namespace
    )
    return result


def evict(api: ApiClient, namespace: str, name: str) -> None:
    """Ask for the pod's eviction (the Eviction API honours PodDisruptionBudgets). NotFoundError: the pod
    is gone; ThrottledError: a budget says not now."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    send_json(
        "evict", f"Pod {namespace}/{name}", core(api).create_namespaced_pod_eviction, name, namespace, body
    )


def delete(api: ApiClient, namespace: str, name: str, *, body: dict[str, Any] | None = None) -> None:
    """Delete the pod (`body`: DeleteOptions, e.g. a grace period and a uid precondition)."""
    kwargs = {"body": body} if body is not None else {}
    send_json("delete", f"Pod {namespace}/{name}", core(api).delete_namespaced_pod, name, namespace, **kwargs)


def patch_status(api: ApiClient, namespace: str, name: str, status: dict[str, Any]) -> None:
    send_json(
        "patch", f"status of Pod {namespace}/{name}", core(api).patch_namespaced_pod_status, name, namespace,
        {"status": status},
    )  # fmt: skip
