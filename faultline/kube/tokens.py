"""Service-account tokens (TokenRequest API), for tests of least-privilege RBAC."""

from __future__ import annotations

from faultline.errors import PermanentError
from faultline.kube.client import ApiClient, call, core, token_request


def mint(
    api: ApiClient, namespace: str, service_account: str, *, seconds: int = 3600,
    pod: tuple[str, str] | None = None,
) -> str:  # fmt: skip
    """A bound token for the ServiceAccount, valid for `seconds`; bound to `pod` (name, uid) when given,
    so that it carries the pod's node as the kubelet's projected tokens do."""
    result = call(
        "create", f"token of ServiceAccount {namespace}/{service_account}",
        core(api).create_namespaced_service_account_token, service_account, namespace,
        token_request(seconds, pod),
    )  # fmt: skip
    if result.status is None or not result.status.token:
        raise PermanentError(f"TokenRequest for {namespace}/{service_account} returned no token")
    return str(result.status.token)
