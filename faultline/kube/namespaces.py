"""Namespaces: read one (plain JSON); NotFoundError when it does not exist."""

from __future__ import annotations

from typing import Any

from faultline.kube.client import ApiClient, core, read_json


def read(api: ApiClient, name: str) -> dict[str, Any]:
    result: dict[str, Any] = read_json("get", f"Namespace {name}", core(api).read_namespace, name)
    return result
