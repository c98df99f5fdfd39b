"""Namespaces: read one (plain JSON; NotFoundError when it does not exist), or list them."""

from __future__ import annotations

from typing import Any

from faultline.kube.client import ApiClient, core, read_json


def read(api: ApiClient, name: str) -> dict[str, Any]:
    result: dict[str, Any] = read_json("get", f"Namespace {name}", core(api).read_namespace, name)
    return result


def list_all(api: ApiClient, *, label_selector: str | None = None) -> list[dict[str, Any]]:
    """Namespaces, optionally by label selector, as plain JSON."""
    kwargs = {"label_selector": label_selector} if label_selector else {}
    found = read_json("list", "namespaces", core(api).list_namespace, **kwargs)
    items: list[dict[str, Any]] = found["items"]
    return items
