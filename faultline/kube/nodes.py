"""Nodes: read and list them (plain JSON), merge-patch them (guarded by a resourceVersion), and keep
their conditions. Errors are `faultline.errors` classes (NotFoundError for a Node that is gone,
ConflictError when a guarded patch finds the Node changed)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from faultline import conditions as conds
from faultline.kube import bodies
from faultline.kube.client import ApiClient, core, read_items, read_json, send_json


def read(api: ApiClient, name: str) -> dict[str, Any]:
    """The Node as plain JSON."""
    result: dict[str, Any] = read_json("get", f"Node {name}", core(api).read_node, name)
    return result


def list_all(api: ApiClient, *, label_selector: str | None = None) -> list[dict[str, Any]]:
    """Every Node (optionally only those matching `label_selector`) as plain JSON, read in pages."""
    kwargs = {"label_selector": label_selector} if label_selector else {}
    return read_items("list", "Nodes", core(api).list_node, **kwargs)


def patch(api: ApiClient, name: str, body: dict[str, Any], *, resource_version: str | None = None) -> None:
    """A JSON merge patch (`None` values delete). With `resource_version` the patch applies only to that
    version of the Node: ConflictError when it changed since it was read."""
    if resource_version is not None:
        body = {**body, "metadata": {**body.get("metadata", {}), "resourceVersion": resource_version}}
    send_json("patch", f"Node {name}", core(api).patch_node, name, body, _content_type=bodies.MERGE)


def conditions(api: ApiClient, name: str) -> dict[str, dict[str, str]]:
    """The Node's current conditions by type, as plain dicts."""
    node = read_json("get", f"status of Node {name}", core(api).read_node_status, name)
    return bodies.node_conditions(node)


def write_conditions(api: ApiClient, name: str, conditions: list[dict[str, str]], delete: list[str]) -> None:
    """Set conditions (merged by type) and delete the condition types in `delete`, in one status patch."""
    body = bodies.conditions_patch(conditions, delete)
    if body is not None:
        send_json(
            "patch", f"status of Node {name}", core(api).patch_node_status, name, body,
            _content_type=bodies.STRATEGIC_MERGE,
        )  # fmt: skip


def apply_conditions(api: ApiClient, name: str, wanted: dict[str, conds.Condition]) -> None:
    """Bring the Node's conditions to `wanted`: write what changed (transition times only on a status
    change) and delete owned condition types that are no longer wanted."""
    patches, stale = conds.changes(conditions(api, name), wanted, dt.datetime.now(dt.UTC))
    write_conditions(api, name, patches, stale)


def create(api: ApiClient, body: dict[str, Any]) -> None:
    """Register a Node (the simulated kubelet); AlreadyExistsError when it exists."""
    name = body.get("metadata", {}).get("name", "")
    send_json("create", f"Node {name}", core(api).create_node, body)


def patch_status(api: ApiClient, name: str, status: dict[str, Any]) -> None:
    """A strategic-merge patch of the Node's status (conditions merge by type)."""
    send_json(
        "patch", f"status of Node {name}", core(api).patch_node_status, name, {"status": status},
        _content_type=bodies.STRATEGIC_MERGE,
    )  # fmt: skip


def delete(api: ApiClient, name: str) -> None:
    send_json("delete", f"Node {name}", core(api).delete_node, name)
