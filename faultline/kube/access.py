"""Access reviews: may this user do that? (a SubjectAccessReview, authorization.k8s.io/v1).

The API server answers with every authorizer it runs (RBAC, Node, webhooks), as it would for a real
request by that user, without the request being made. A ServiceAccount authenticates as
`system:serviceaccount:<namespace>:<name>` in the groups `SERVICE_ACCOUNT_GROUPS` lists; a review for one
passes those groups too, so a grant to every ServiceAccount (or every authenticated user) counts.
"""

from __future__ import annotations

from typing import Any

from faultline.kube.client import ApiClient, authorization, read_json


def service_account(namespace: str, name: str) -> tuple[str, list[str]]:
    """The user name and groups a ServiceAccount's token authenticates as."""
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
    return f"system:serviceaccount:{namespace}:{name}", groups


def allowed(
    api: ApiClient, user: str, groups: list[str], *, verb: str, resource: str, group: str = "",
    subresource: str = "", namespace: str = "", name: str = "",
) -> bool:  # fmt: skip
    """Whether `user` may `verb` the resource (namespace "": every namespace, or a cluster-scoped one)."""
    attributes: dict[str, Any] = {"verb": verb, "group": group, "resource": resource}
    for key, value in (("subresource", subresource), ("namespace", namespace), ("name", name)):
        if value:
            attributes[key] = value
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
    }
    what = f"SubjectAccessReview of {user}: {verb} {resource}"
    answer = read_json("create", what, authorization(api).create_subject_access_review, body)
    return bool(answer.get("status", {}).get("allowed"))
