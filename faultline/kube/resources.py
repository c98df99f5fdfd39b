"""Custom resources: RemediationRequests (`remediationrequests.faultline.io`, cluster-scoped), objects
of any served kind (an external remediator's CR, found by API discovery), and the project's CRDs
(package data in `faultline/kube/crds/`, which the chart links to)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import yaml

from faultline.errors import ConflictError, NotFoundError, PermanentError
from faultline.kube.client import ApiClient, custom, extensions, read_json, send_json

CRD_DIR = Path(__file__).resolve().parent / "crds"
RR_GROUP, RR_VERSION, RR_PLURAL = "faultline.io", "v1alpha1", "remediationrequests"
RR_API_VERSION = f"{RR_GROUP}/{RR_VERSION}"


def create_request(api: ApiClient, body: dict[str, Any]) -> None:
    """Create a RemediationRequest; AlreadyExistsError when one of that name exists."""
    name = body.get("metadata", {}).get("name", "")
    send_json(
        "create",
        f"RemediationRequest {name}",
        custom(api).create_cluster_custom_object,
        RR_GROUP,
        RR_VERSION,
        RR_PLURAL,
        body,
    )


def get_request(api: ApiClient, name: str) -> dict[str, Any]:
    result: dict[str, Any] = read_json(
        "get",
        f"RemediationRequest {name}",
        custom(api).get_cluster_custom_object,
        RR_GROUP,
        RR_VERSION,
        RR_PLURAL,
        name,
    )
    return result


def list_requests(api: ApiClient, *, label_selector: str | None = None) -> list[dict[str, Any]]:
    kwargs = {"label_selector": label_selector} if label_selector else {}
    found = read_json(
        "list",
        "RemediationRequests",
        custom(api).list_cluster_custom_object,
        RR_GROUP,
        RR_VERSION,
        RR_PLURAL,
        **kwargs,
    )
    items: list[dict[str, Any]] = found["items"]
    return items


def patch_request_status(api: ApiClient, name: str, status: dict[str, Any]) -> None:
    """Merge `status` into the RemediationRequest's status subresource."""
    send_json(
        "patch",
        f"status of RemediationRequest {name}",
        custom(api).patch_cluster_custom_object_status,
        RR_GROUP,
        RR_VERSION,
        RR_PLURAL,
        name,
        {"status": status},
    )


def delete_requests(api: ApiClient, *, label_selector: str) -> None:
    send_json(
        "delete",
        f"RemediationRequests {label_selector}",
        custom(api).delete_collection_cluster_custom_object,
        RR_GROUP,
        RR_VERSION,
        RR_PLURAL,
        label_selector=label_selector,
    )


def create_object(api: ApiClient, body: dict[str, Any]) -> tuple[str, bool]:
    """Create an object of any served kind (an external remediator's CR): the plural and scope come from
    API discovery. Returns (plural, namespaced); AlreadyExistsError when it exists; PermanentError when
    the kind is not served."""
    api_version, kind = str(body.get("apiVersion", "")), str(body.get("kind", ""))
    if "/" not in api_version:
        raise PermanentError(f"{kind} {api_version}: only kinds of an API group can be created this way")
    group, version = api_version.split("/", 1)
    found = read_json(
        "discover", f"resources of {api_version}", custom(api).get_api_resources, group, version
    )
    resource = next(
        (r for r in found.get("resources", []) if r.get("kind") == kind and "/" not in r.get("name", "")),
        None,
    )
    if resource is None:
        raise PermanentError(f"the API server serves no kind {kind} in {api_version}")
    plural, namespaced = str(resource["name"]), bool(resource.get("namespaced"))
    name = body.get("metadata", {}).get("name", "")
    if namespaced:
        namespace = body.get("metadata", {}).get("namespace") or "default"
        send_json(
            "create",
            f"{kind} {namespace}/{name}",
            custom(api).create_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            body,
        )
    else:
        send_json(
            "create", f"{kind} {name}", custom(api).create_cluster_custom_object, group, version, plural, body
        )
    return plural, namespaced


def apply_crds(api: ApiClient, directory: Path = CRD_DIR, *, timeout: float = 60.0) -> dict[str, str]:
    """The CRDs in `directory` as this version has them: created when missing, their spec replaced when
    it differs (Helm installs a chart's CRDs but never upgrades them: the chart's pre-upgrade hook does
    this); then established. What was done to each: "created", "updated" or "current"."""
    ext = extensions(api)
    done: dict[str, str] = {}
    for path in sorted(directory.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        for _ in range(5):
            try:
                live = read_json(
                    "get", f"CustomResourceDefinition {name}", ext.read_custom_resource_definition, name
                )
            except NotFoundError:
                try:
                    send_json(
                        "create",
                        f"CustomResourceDefinition {name}",
                        ext.create_custom_resource_definition,
                        body,
                    )
                except ConflictError:
                    continue  # made meanwhile: compared on the next look
                done[name] = "created"
                break
            if _spec_matches(live.get("spec") or {}, body["spec"]):
                done[name] = "current"
                break
            meta = {**live["metadata"], "resourceVersion": live["metadata"]["resourceVersion"]}
            update = {**body, "metadata": meta}
            what = f"CustomResourceDefinition {name}"
            try:
                send_json("update", what, ext.replace_custom_resource_definition, name, update)
            except ConflictError:
                continue  # changed meanwhile: read it again
            done[name] = "updated"
            break
        else:
            raise PermanentError(f"CustomResourceDefinition {name}: five conflicting updates in a row")
    _established(ext, list(done), timeout)
    return done


def _spec_matches(live: Any, wanted: Any) -> bool:
    """Does the live spec hold everything the wanted one says (the API server adds defaults)?"""
    if isinstance(wanted, dict):
        return isinstance(live, dict) and all(_spec_matches(live.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (isinstance(live, list) and len(live) == len(wanted)
                and all(_spec_matches(a, b) for a, b in zip(live, wanted, strict=True)))  # fmt: skip
    return bool(live == wanted)


def _established(ext: Any, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = read_json(
                "get", f"CustomResourceDefinition {name}", ext.read_custom_resource_definition, name
            )
            found = {
                c.get("type"): c.get("status") for c in (crd.get("status") or {}).get("conditions") or []
            }
            if found.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise PermanentError(f"CRD {name} not established within {timeout:.0f} s")
            time.sleep(0.1)


def ensure_crds(api: ApiClient, directory: Path = CRD_DIR, *, timeout: float = 30.0) -> list[str]:
    """Create the CRDs in `directory` that do not exist yet and wait until they are established (the
    chart installs them in a cluster; tests and the demo use this). ForbiddenError without the right."""
    ext = extensions(api)
    names = []
    for path in sorted(directory.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        names.append(name)
        with contextlib.suppress(ConflictError):  # there already
            send_json(
                "create", f"CustomResourceDefinition {name}", ext.create_custom_resource_definition, body
            )
    _established(ext, names, timeout)
    return names
