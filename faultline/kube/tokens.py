"""Service-account tokens (TokenRequest API), for tests of least-privilege RBAC."""

from __future__ import annotations

from faultline.errors import PermanentError
from faultline.kube.client import ApiClient, call, core, token_request


def mint(api: ApiClient, namespace: str, service_account: str, *, seconds: int = 3600) -> str:
    """A bound token for the ServiceAccount, valid for `seconds`."""
    result = call(
        "create", f"token of ServiceAccount {namespace}/{service_account}",
        core(api).create_namespaced_service_account_token, service_account, namespace, token_request(seconds),
    )  # fmt: skip
    if result.status is None or not result.status.token:
        raise PermanentError(f"TokenRequest for {namespace}/{service_account} returned no token")
    return str(result.status.token)
