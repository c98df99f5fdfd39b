"""faultline's Kubernetes adapter: the one package that imports the official `kubernetes` client."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client, config

from faultline.errors import PermanentError

ApiClient = client.ApiClient


def api_client(kubeconfig: str | Path) -> client.ApiClient:
    """An API client from a kubeconfig file (its own Configuration: nothing global is changed)."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def apps(api: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api)


def batch(api: client.ApiClient) -> client.BatchV1Api:
    return client.BatchV1Api(api)


def policy(api: client.ApiClient) -> client.PolicyV1Api:
    return client.PolicyV1Api(api)


def coordination(api: client.ApiClient) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(api)


def rbac(api: client.ApiClient) -> client.RbacAuthorizationV1Api:
    return client.RbacAuthorizationV1Api(api)


def mint_token(api: client.ApiClient, namespace: str, service_account: str, *, seconds: int = 3600) -> str:
    """A bound token for a ServiceAccount (TokenRequest API), for tests of least-privilege RBAC."""
    body = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
    )
    result = core(api).create_namespaced_service_account_token(service_account, namespace, body)
    if result.status is None or not result.status.token:
        raise PermanentError(f"TokenRequest for {namespace}/{service_account} returned no token")
    return result.status.token
