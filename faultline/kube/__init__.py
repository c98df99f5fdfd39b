"""faultline's Kubernetes adapter: the one package that imports the official `kubernetes` client."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.config import incluster_config

from faultline import conditions, kubelite
from faultline.errors import ConfigError, PermanentError

ApiClient = client.ApiClient
ApiException = client.exceptions.ApiException


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def api_client(
    kubeconfig: str | Path | None, *, environ: Mapping[str, str] | None = None
) -> client.ApiClient:
    """An API client (its own Configuration: nothing global is changed) from a kubeconfig file, or, with
    None, from the pod's service account: KUBERNETES_SERVICE_HOST/PORT and the token and CA in
    FAULTLINE_SERVICE_ACCOUNT_DIR (default: the standard mount). The token file is re-read as the
    kubelet rotates it."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    env = dict(os.environ if environ is None else environ)
    directory = Path(env.get("FAULTLINE_SERVICE_ACCOUNT_DIR", str(SERVICE_ACCOUNT_DIR)))
    try:
        loader = incluster_config.InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=str(directory / "token"), cert_filename=str(directory / "ca.crt"), environ=env
        )
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException as exc:
        raise ConfigError(f"no kubeconfig given and no in-cluster credentials: {exc}") from exc
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


def events_api(api: client.ApiClient) -> client.EventsV1Api:
    return client.EventsV1Api(api)


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


CRD_DIR = Path(__file__).resolve().parent / "crds"  # package data (the chart links to it)
RR_GROUP, RR_VERSION, RR_PLURAL = "faultline.io", "v1alpha1", "remediationrequests"


def ensure_crds(api: client.ApiClient, directory: Path = CRD_DIR, *, timeout: float = 30.0) -> list[str]:
    """Create the chart's CRDs that do not exist yet and wait until they are established (the chart
    installs them in a cluster; tests and the demo use this)."""
    import time  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted(directory.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        names.append(body["metadata"]["name"])
        try:
            ext.create_custom_resource_definition(body)
        except client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = ext.read_custom_resource_definition(name)
            conditions = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
            if conditions.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise PermanentError(f"CRD {name} not established within {timeout:.0f} s")
            time.sleep(0.1)
    return names


def create_object(api: client.ApiClient, body: dict[str, Any]) -> tuple[str, bool]:
    """Create an object of any served kind (an external remediator's CR): the plural and scope come from
    API discovery. Returns (plural, namespaced); ApiException 409 when it exists; PermanentError when the
    kind is not served."""
    api_version, kind = str(body.get("apiVersion", "")), str(body.get("kind", ""))
    if "/" not in api_version:
        raise PermanentError(f"{kind} {api_version}: only kinds of an API group can be created this way")
    group, version = api_version.split("/", 1)
    found = read_json(api, custom(api).get_api_resources, group, version)
    resource = next(
        (r for r in found.get("resources", []) if r.get("kind") == kind and "/" not in r.get("name", "")),
        None,
    )
    if resource is None:
        raise PermanentError(f"the API server serves no kind {kind} in {api_version}")
    plural, namespaced = str(resource["name"]), bool(resource.get("namespaced"))
    if namespaced:
        namespace = body.get("metadata", {}).get("namespace") or "default"
        custom(api).create_namespaced_custom_object(group, version, namespace, plural, body)
    else:
        custom(api).create_cluster_custom_object(group, version, plural, body)
    return plural, namespaced


def rbac(api: client.ApiClient) -> client.RbacAuthorizationV1Api:
    return client.RbacAuthorizationV1Api(api)


def read_json(api: client.ApiClient, call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """An API call's answer as plain JSON (no model objects: cheaper, and simple to read)."""
    response = call(*args, _preload_content=False, **kwargs)
    result: dict[str, Any] = json.loads(response.data)
    return result


def node_conditions(api: client.ApiClient, node: str) -> dict[str, dict[str, str]]:
    """The node's current conditions by type, as plain dicts."""
    status = core(api).read_node_status(node).status
    return {
        c.type: {"status": c.status, "reason": c.reason or "", "message": c.message or ""}
        for c in (status.conditions if status and status.conditions else [])
    }


def apply_node_conditions(api: client.ApiClient, node: str, wanted: dict[str, conditions.Condition]) -> None:
    """Bring the node's conditions to `wanted`: write what changed (transition times only on a status
    change) and delete owned condition types that are no longer wanted."""
    current = node_conditions(api, node)
    changed, stale = conditions.diff(current, wanted)
    now = datetime.datetime.now(datetime.UTC)
    patches = [c.as_patch(now, current.get(c.type, {}).get("status") != c.status) for c in changed]
    write_node_conditions(api, node, patches, stale)


def write_node_conditions(
    api: client.ApiClient, node: str, conditions: list[dict[str, str]], delete: list[str]
) -> None:
    """Set conditions (merged by type) and delete the condition types in `delete`, in one status patch."""
    items: list[dict[str, str]] = [*conditions, *({"type": t, "$patch": "delete"} for t in delete)]
    if items:
        core(api).patch_node_status(node, {"status": {"conditions": items}})


def post_node_event(
    api: client.ApiClient, node: str, *, reason: str, note: str, action: str, warning: bool, controller: str,
    instance: str,
) -> None:  # fmt: skip
    """An events.k8s.io/v1 Event about a Node (in `default`, where node events live). Sent and answered
    as plain JSON: building client models for the request and the answer cost more CPU than the call."""
    body = kubelite.node_event(
        node, reason=reason, note=note, action=action, warning=warning, controller=controller,
        instance=instance,
    )  # fmt: skip
    send_json(events_api(api).create_namespaced_event, "default", body)


def send_json(call: Any, *args: Any, **kwargs: Any) -> None:
    """A write whose answer is not needed: the answer is read (the connection goes back to the pool)
    but not turned into client models."""
    response = call(*args, _preload_content=False, **kwargs)
    response.data  # noqa: B018 - reading the body releases the connection


def micro_now() -> datetime.datetime:
    """Now, with a non-zero fraction: the client drops a zero one and MicroTime fields need it."""
    now = datetime.datetime.now(datetime.UTC)
    return now.replace(microsecond=max(1, now.microsecond))


def mint_token(api: client.ApiClient, namespace: str, service_account: str, *, seconds: int = 3600) -> str:
    """A bound token for a ServiceAccount (TokenRequest API), for tests of least-privilege RBAC."""
    body = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
    )
    result = core(api).create_namespaced_service_account_token(service_account, namespace, body)
    if result.status is None or not result.status.token:
        raise PermanentError(f"TokenRequest for {namespace}/{service_account} returned no token")
    return result.status.token
