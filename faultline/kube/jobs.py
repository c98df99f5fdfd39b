"""Jobs: create one, read, list and delete them (plain JSON). AlreadyExistsError when a Job of that name
exists."""

from __future__ import annotations

from typing import Any

from faultline.kube.client import ApiClient, batch, read_json, send_json


def create(api: ApiClient, namespace: str, body: dict[str, Any]) -> None:
    name = body.get("metadata", {}).get("name", "")
    send_json("create", f"Job {namespace}/{name}", batch(api).create_namespaced_job, namespace, body)


def read(api: ApiClient, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = read_json(
        "get", f"Job {namespace}/{name}", batch(api).read_namespaced_job, name, namespace
    )
    return result


def list_all(api: ApiClient, namespace: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
    kwargs = {"label_selector": label_selector} if label_selector else {}
    items: list[dict[str, Any]] = read_json(
        "list", f"Jobs in {namespace}", batch(api).list_namespaced_job, namespace, **kwargs
    )["items"]
    return items


def delete(api: ApiClient, namespace: str, name: str) -> None:
    """Delete a Job and, in the background, its pods; NotFoundError when it is gone already."""
    send_json(
        "delete", f"Job {namespace}/{name}", batch(api).delete_namespaced_job, name, namespace,
        propagation_policy="Background",
    )  # fmt: skip
