"""faultline's Kubernetes access layer: the narrow operations the project uses, on two transports, with
API errors translated once into `faultline.errors`.

    translate   the table: an HTTP status (and Retry-After) -> a `faultline.errors` class
    bodies      what both transports send and read: condition patches, a Node Event, a Node's conditions
    client      the full transport (the official `kubernetes` client): api_client, translated calls
    lite        the light transport for the node agent (standard library; never imports `kubernetes`)
    nodes       read, list_all, patch (merge, guarded by resourceVersion), conditions, write/apply_conditions;
                create, delete, patch_status (the simulated kubelet and tests)
    events      post_node: an Event about a Node
    pods        on_node, list_all, read, evict (ThrottledError: a PodDisruptionBudget says not now), delete,
                patch_status (the simulated kubelet)
    namespaces  read
    jobs        create, read, list_all
    resources   RemediationRequests (create/get/list/patch status), create_object (any served kind, by
                discovery), ensure_crds (package data in crds/)
    tokens      mint: a ServiceAccount token, for tests of least-privilege RBAC
    access      allowed: a SubjectAccessReview (may this user do that?), for the chart's RBAC matrix
    watch       Informer: list and watch of any served kind, listed again after 410 Gone (object monitor)

Generated API groups (`core`, `batch`, ...) stay reachable for tests that set up objects; a call made on
them directly goes inside `client.translated(verb, what)` so that its errors are translated too.
Callers branch on `faultline.errors` classes (NotFoundError, ConflictError, ThrottledError, ForbiddenError,
InvalidError, ApiUnavailableError), never on status codes. Submodules load on first use, so the agent,
which imports only `faultline.kube.lite`, never loads the `kubernetes` package (its footprint matters on
every GPU node).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faultline.kube import (
        access,
        bodies,
        client,
        events,
        jobs,
        lite,
        namespaces,
        nodes,
        pods,
        resources,
        tokens,
        translate,
        watch,
    )
    from faultline.kube.client import (
        ApiClient,
        api_client,
        apps,
        authorization,
        batch,
        coordination,
        core,
        custom,
        policy,
        rbac,
        storage,
    )

__all__ = [
    "ApiClient", "access", "api_client", "apps", "authorization", "batch", "bodies", "client",
    "coordination", "core", "custom", "events", "jobs", "lite", "namespaces", "nodes", "pods", "policy",
    "rbac", "resources", "storage", "tokens", "translate", "watch",
]  # fmt: skip
_FROM_CLIENT = frozenset(
    {"ApiClient", "api_client", "apps", "authorization", "batch", "coordination", "core", "custom", "policy",
     "rbac", "storage"}
)  # fmt: skip
_MODULES = frozenset(__all__) - _FROM_CLIENT


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _FROM_CLIENT:
        return getattr(importlib.import_module(f"{__name__}.client"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
