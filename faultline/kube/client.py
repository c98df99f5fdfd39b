"""The full transport: the official `kubernetes` client (the one module that imports it), for the
workers, the development tooling and the tests.

Every call goes through `call`, `read_json` or `send_json`, which translate the client's exceptions once
(`faultline.kube.translate`): callers see `faultline.errors` classes, never `ApiException`. The hot paths
(reading Nodes and pods, patching Nodes, posting Events, evictions) use `read_json`/`send_json`: the answer
is read as plain JSON (`_preload_content=False`) instead of being built into client models, which cost
more CPU than the calls themselves in the quarantine and drain benchmarks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.config import incluster_config

from faultline.errors import ApiError, ConfigError, FaultlineError
from faultline.kube import translate

ApiClient = client.ApiClient
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
FIELD_MANAGER = "faultline"  # the managedFields manager of every write of this transport (its user agent)
# Connections to the API server an API client keeps open for reuse: the calls a component makes at once (its
# worker threads) and POOL_SPARE more (its claim, resync and maintenance loops, its watches), POOL_FLOOR at
# least. Not the `kubernetes` package's own default (five per CPU of the machine, 10 on a 2-core node): a
# call made while every kept connection is busy opens a TLS connection of its own and closes it after its
# request, a handshake on both sides each time (a 500-node storm, 16 threads: 84-101 of them, against 14).
POOL_FLOOR = 32
POOL_SPARE = 16
# Every call's (connect, read) timeouts in seconds, where the caller gives none (watches give their own):
# without one, a call on a connection that went silent (a dead peer, a lost route) holds its thread for
# good. The read timeout is past the API server's own limit on a request (60 s, `--request-timeout`), so
# it cuts only calls the server would never answer; they fail as ApiUnavailableError (tried again later).
# It is per try: urllib3 tries a read of GET, PUT and DELETE up to four times, so such a call gives up
# after about five minutes, a POST or PATCH after 75 s.
REQUEST_TIMEOUT = (10.0, 75.0)


def api_client(
    kubeconfig: str | Path | None, *, environ: Mapping[str, str] | None = None, concurrency: int = 0
) -> client.ApiClient:
    """An API client (its own Configuration: nothing global is changed) from a kubeconfig file, or, with
    None, from the pod's service account: KUBERNETES_SERVICE_HOST/PORT and the token and CA in
    FAULTLINE_SERVICE_ACCOUNT_DIR (default: the standard mount). The token file is re-read as the
    kubelet rotates it. `concurrency`: the calls the component makes at once (its worker threads), which
    sizes the connection pool (`pool_size`)."""
    configuration = client.Configuration()
    configuration.connection_pool_maxsize = pool_size(concurrency)
    if kubeconfig is not None:
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
        return _named(client.ApiClient(configuration))
    env = dict(os.environ if environ is None else environ)
    directory = Path(env.get("FAULTLINE_SERVICE_ACCOUNT_DIR", str(SERVICE_ACCOUNT_DIR)))
    try:
        loader = incluster_config.InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=str(directory / "token"), cert_filename=str(directory / "ca.crt"), environ=env
        )
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException as exc:
        raise ConfigError(f"no kubeconfig given and no in-cluster credentials: {exc}") from exc
    return _named(client.ApiClient(configuration))


def pool_size(concurrency: int) -> int:
    """The connections an API client keeps for a component making `concurrency` calls at once."""
    return max(POOL_FLOOR, concurrency + POOL_SPARE)


def _named(api: client.ApiClient) -> client.ApiClient:
    """faultline's requests say who they are: the API server names the field manager of every write
    after the user agent (`faultline`), so a Node's managedFields tell faultline's changes from an
    operator's (see workers.overrides)."""
    api.user_agent = f"{FIELD_MANAGER}/{_version()}"
    return api


def _version() -> str:
    try:
        return metadata.version("faultline")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree that is not installed
        return "0"


@contextlib.contextmanager
def translated(verb: str, what: str) -> Iterator[None]:
    """Calls of the generated client inside this block raise `faultline.errors` classes: the API
    server's answer by status, and no answer at all (connection refused, timed out) as
    ApiUnavailableError."""
    try:
        yield
    except client.exceptions.ApiException as exc:
        raise translate.error(exc.status, verb, what, body=exc.body, headers=exc.headers) from exc
    except FaultlineError:
        raise
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise translate.error(None, verb, what, body=str(exc)) from exc


def call(verb: str, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`method(*args, **kwargs)` with its errors translated; its answer as client models."""
    with translated(verb, what):
        return method(*args, **_timed(kwargs))


def read_json(verb: str, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The call's answer as plain JSON (no model objects: cheaper, and simple to read)."""
    with translated(verb, what):
        response = method(*args, _preload_content=False, **_timed(kwargs))
        return json.loads(response.data)


LIST_PAGE = 500  # objects per page of a list read in pages
LIST_RESTARTS = 3  # a list whose continue token expires again and again fails after this many restarts


def read_items(
    verb: str, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any
) -> list[dict[str, Any]]:
    """A list call's items as plain JSON, read in pages of LIST_PAGE (`limit` and `continue`): a fleet's
    Nodes or Pods are tens of megabytes, whose parse in one piece would hold the interpreter's lock for
    the better part of a second (10,000 simulated Nodes: 15 MB, 0.42 s), stalling the process's other
    threads; page by page the parse lets them run in between. The pages are one consistent snapshot; a
    continue token that expired (HTTP 410, the API server having compacted past it) starts the list
    again, up to LIST_RESTARTS times; a continue token handed twice fails the list rather than reading
    on forever. An all-namespaces list must not pin one namespace by field selector (see
    `pinned_namespace`)."""
    items: list[dict[str, Any]] = []
    tokens: set[str] = set()
    token = None
    restarts = 0
    while True:
        page_args = {**kwargs, "limit": LIST_PAGE, **({"_continue": token} if token else {})}
        try:
            page = read_json(verb, what, method, *args, **page_args)
        except ApiError as exc:
            if exc.status == 410 and token and restarts < LIST_RESTARTS:
                items, tokens, token, restarts = [], set(), None, restarts + 1
                continue
            raise
        items += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items
        if token in tokens:
            raise ApiError(verb, what, "the API server handed the same continue token twice")
        tokens.add(token)


_NAMESPACE_TERM = re.compile(r"^\s*metadata\.namespace\s*==?\s*(\S+)\s*$")


def pinned_namespace(field_selector: str | None) -> tuple[str | None, str | None]:
    """(the namespace, the rest of the selector) when `field_selector` pins one namespace
    (`metadata.namespace=X`), else (None, `field_selector`). A list of every namespace must be sent to
    that namespace's own path instead: the API server (1.37) lists the first page of such a list under
    the namespace but reads its continue token from the top of the kind, so the second page starts
    elsewhere: the first page again when the namespace's name sorts after its objects' names, the rest
    of the namespace skipped without an error when it sorts before."""
    if not field_selector:
        return None, field_selector
    pinned: set[str] = set()
    rest = []
    for term in field_selector.split(","):
        found = _NAMESPACE_TERM.match(term)
        if found:
            pinned.add(found.group(1))
        else:
            rest.append(term)
    if len(pinned) != 1:  # none, or two different ones (nothing matches: the server says so itself)
        return None, field_selector
    return pinned.pop(), ",".join(rest) or None


def send_json(verb: str, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """A write whose answer is not needed: the answer is read (the connection goes back to the pool)
    but not turned into client models."""
    with translated(verb, what):
        response = method(*args, _preload_content=False, **_timed(kwargs))
        response.data  # noqa: B018 - reading the body releases the connection


def _timed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments with REQUEST_TIMEOUT unless it gives its own."""
    return kwargs if "_request_timeout" in kwargs else {**kwargs, "_request_timeout": REQUEST_TIMEOUT}


# The generated API groups, for the operation modules (and for tests that set up objects).
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def apps(api: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api)


def storage(api: client.ApiClient) -> client.StorageV1Api:
    return client.StorageV1Api(api)


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


def extensions(api: client.ApiClient) -> client.ApiextensionsV1Api:
    return client.ApiextensionsV1Api(api)


def rbac(api: client.ApiClient) -> client.RbacAuthorizationV1Api:
    return client.RbacAuthorizationV1Api(api)


def authorization(api: client.ApiClient) -> client.AuthorizationV1Api:
    return client.AuthorizationV1Api(api)


def token_request(seconds: int, pod: tuple[str, str] | None = None) -> client.AuthenticationV1TokenRequest:
    bound = None
    if pod is not None:
        bound = client.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod[0], uid=pod[1])
    return client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds, bound_object_ref=bound)
    )
