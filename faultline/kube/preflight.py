"""The Kubernetes operations of preflight, on the light transport (`faultline.kube.lite`): the admission
webhook reads a namespace's labels, keeps its TLS Secret and writes the CA bundle of its own
MutatingWebhookConfiguration; the init container it injects reads and writes its gang's Lease. Both start
often and do little, so neither loads the `kubernetes` package. Errors are `faultline.errors` classes
(NotFoundError, ConflictError, ForbiddenError, ...), as everywhere in `faultline.kube`.
"""

from __future__ import annotations

import base64
import urllib.parse
from typing import Any, NamedTuple

from faultline.errors import NotFoundError
from faultline.kube.lite import Client

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def namespace_labels(client: Client, name: str) -> dict[str, str]:
    doc = client.request("GET", f"/api/v1/namespaces/{_quote(name)}", what=f"Namespace {name}")
    return dict((doc.get("metadata") or {}).get("labels") or {})


# -- the webhook's TLS Secret ------------------------------------------------------------------------------


class FoundSecret(NamedTuple):
    """A Secret as read: its data (decoded), its resourceVersion, and its metadata, which a replacement
    keeps."""

    data: dict[str, bytes]
    resource_version: str
    metadata: dict[str, Any]
    type: str = "Opaque"  # kept by a replacement (the API server refuses to change it)


def read_secret(client: Client, namespace: str, name: str) -> FoundSecret | None:
    """The Secret as it is; None when it does not exist."""
    try:
        doc = client.request(
            "GET", f"/api/v1/namespaces/{_quote(namespace)}/secrets/{_quote(name)}",
            what=f"Secret {namespace}/{name}",
        )  # fmt: skip
    except NotFoundError:
        return None
    data = {k: base64.b64decode(v) for k, v in (doc.get("data") or {}).items()}
    meta = dict(doc.get("metadata") or {})
    return FoundSecret(data, str(meta.get("resourceVersion", "")), meta, str(doc.get("type") or "Opaque"))


def write_secret(
    client: Client, namespace: str, name: str, data: dict[str, bytes], *, found: FoundSecret | None,
    labels: dict[str, str] | None = None,
) -> None:  # fmt: skip
    """Create the Secret (`found` None) with `labels`, or replace its data only if it is still as `found`
    (ConflictError otherwise: someone else wrote it first). A replaced Secret keeps its metadata as found:
    the labels and annotations of whoever made it (Helm's, by which `helm uninstall` knows it as the
    release's) stay."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if found is not None:
        meta = {**found.metadata, "resourceVersion": found.resource_version}
    elif labels:
        meta["labels"] = labels
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": meta,
            "type": found.type if found is not None else "Opaque",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}  # fmt: skip
    base = f"/api/v1/namespaces/{_quote(namespace)}/secrets"
    if found is None:
        client.request("POST", base, body, what=f"Secret {namespace}/{name}")
    else:
        client.request("PUT", f"{base}/{_quote(name)}", body, what=f"Secret {namespace}/{name}")


# -- the MutatingWebhookConfiguration's CA bundle ------------------------------------------------------------

_MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def webhook_ca_bundles(client: Client, name: str) -> tuple[list[bytes], str]:
    """Each webhook's caBundle (decoded; b"" when unset) of the configuration, and its resourceVersion."""
    doc = client.request("GET", f"{_MWC}/{_quote(name)}", what=f"MutatingWebhookConfiguration {name}")
    bundles = [
        base64.b64decode((w.get("clientConfig") or {}).get("caBundle") or "")
        for w in doc.get("webhooks") or []
    ]
    return bundles, str(doc["metadata"].get("resourceVersion", ""))


def set_webhook_ca_bundle(
    client: Client, name: str, bundle: bytes, *, count: int, resource_version: str
) -> None:
    """Set every webhook's caBundle (a JSON patch that first tests the resourceVersion: ConflictError when
    the configuration changed since it was read)."""
    value = base64.b64encode(bundle).decode()
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}
    ]
    ops += [
        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": value} for i in range(count)
    ]
    client.request("PATCH", f"{_MWC}/{_quote(name)}", ops, content_type=JSON_PATCH,
                   what=f"MutatingWebhookConfiguration {name}")  # fmt: skip


# -- the gang's Lease ----------------------------------------------------------------------------------------


def _leases(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{_quote(namespace)}/leases"


def read_lease(client: Client, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = client.request("GET", f"{_leases(namespace)}/{_quote(name)}",
                                             what=f"Lease {namespace}/{name}")  # fmt: skip
    except NotFoundError:
        return None
    return doc


def create_lease(client: Client, namespace: str, name: str, *, annotations: dict[str, str],
                 labels: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """AlreadyExistsError when another member created it first."""
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations, "labels": labels},
            "spec": {}}  # fmt: skip
    doc: dict[str, Any] = client.request("POST", _leases(namespace), body, what=f"Lease {namespace}/{name}")
    return doc


def annotate_lease(client: Client, namespace: str, name: str, annotations: dict[str, str | None], *,
                   resource_version: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Merge the annotations (None removes one). Keys other members write are untouched, so members
    write their own keys without conflicts; with `resource_version`, only if the Lease is still at it."""
    meta: dict[str, Any] = {"annotations": annotations}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    doc: dict[str, Any] = client.request(
        "PATCH", f"{_leases(namespace)}/{_quote(name)}", {"metadata": meta}, content_type=MERGE_PATCH,
        what=f"Lease {namespace}/{name}",
    )  # fmt: skip
    return doc
