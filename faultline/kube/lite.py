"""The light transport: a small Kubernetes REST client for the node agent (standard library and PyYAML
only; it never imports the `kubernetes` package).

The agent makes three kinds of call: read its Node's status, patch its conditions and post Events. The
generated `kubernetes` client costs the agent about 8 MiB of imports and a model object per field of every
Node it reads; this client speaks JSON over one kept-alive HTTPS connection instead. The workers, which use
much more of the API, use the full transport (`faultline.kube.client` and the operation modules). Both
share the request bodies (`faultline.kube.bodies`) and the error table (`faultline.kube.translate`): a
failed call raises the same `faultline.errors` class here as there.

Credentials come from a kubeconfig (its current context: server, CA, client certificate and key or a
bearer token, as files or inline data) or, without one, from the pod's service account (the token file
is re-read every minute, since the kubelet rotates it).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultline.errors import ConfigError
from faultline.kube import bodies, translate

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0
_VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "replace", "DELETE": "delete"}


@dataclass(frozen=True)
class Credentials:
    host: str
    port: int
    context: ssl.SSLContext
    token: str | None = None
    token_file: Path | None = None


def _data_or_file(entry: Mapping[str, Any], key: str, base: Path, where: str) -> bytes | None:
    if entry.get(f"{key}-data"):
        try:
            return base64.b64decode(str(entry[f"{key}-data"]), validate=True)
        except ValueError as exc:
            raise ConfigError(f"{where}: {key}-data is not base64: {exc}") from exc
    if entry.get(key):
        path = Path(str(entry[key]))
        path = path if path.is_absolute() else base / path
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{where}: {key} {path}: {exc.strerror}") from exc
    return None


def _load_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """`load_cert_chain` reads files only: write the PEMs to a private directory just for the call."""
    with tempfile.TemporaryDirectory(prefix="faultline-kube-") as tmp:
        cert_path, key_path = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        context.load_cert_chain(cert_path, key_path)


def _server(url: str, where: str) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "https" or not parsed.hostname:
        raise ConfigError(f"{where}: server {url!r} is not an https:// URL")
    return parsed.hostname, parsed.port or 443


def from_kubeconfig(path: Path) -> Credentials:
    """Credentials of the kubeconfig's current context."""
    import yaml  # noqa: PLC0415 - a kubeconfig only off the cluster: an agent in its pod never loads yaml

    where = str(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{where}: cannot read kubeconfig: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: not a kubeconfig (expected a mapping)")

    def named(kind: str, name: str) -> dict[str, Any]:
        for item in doc.get(f"{kind}s") or []:
            if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(kind), dict):
                return dict(item[kind])
        raise ConfigError(f"{where}: no {kind} named {name!r}")

    current = doc.get("current-context")
    if not current:
        raise ConfigError(f"{where}: no current-context")
    ctx = named("context", str(current))
    cluster = named("cluster", str(ctx.get("cluster", "")))
    user = named("user", str(ctx.get("user", "")))
    base = path.parent
    host, port = _server(str(cluster.get("server", "")), f"{where}: cluster {ctx.get('cluster')}")
    context = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        ca = _data_or_file(cluster, "certificate-authority", base, where)
        if ca is not None:
            context = ssl.create_default_context(cadata=ca.decode())
    for unsupported in ("exec", "auth-provider"):
        if user.get(unsupported):
            raise ConfigError(
                f"{where}: user {ctx.get('user')} authenticates by {unsupported!r}, which the agent does not "
                "run; give it a kubeconfig with a client certificate or token (or in-cluster credentials)"
            )
    cert = _data_or_file(user, "client-certificate", base, where)
    key = _data_or_file(user, "client-key", base, where)
    if (cert is None) != (key is None):
        raise ConfigError(f"{where}: user {ctx.get('user')}: a client certificate needs its key, and back")
    if cert is not None and key is not None:
        _load_chain(context, cert, key)
    token_file = user.get("tokenFile")
    return Credentials(
        host, port, context, token=str(user["token"]) if user.get("token") else None,
        token_file=Path(str(token_file)) if token_file else None,
    )  # fmt: skip


def in_cluster(environ: Mapping[str, str] | None = None) -> Credentials:
    """The pod's service account: KUBERNETES_SERVICE_HOST/PORT, and the token and CA in
    FAULTLINE_SERVICE_ACCOUNT_DIR (default: the standard mount)."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    directory = Path(env.get("FAULTLINE_SERVICE_ACCOUNT_DIR", str(SERVICE_ACCOUNT_DIR)))
    if not host or not port:
        raise ConfigError(
            "no kubeconfig given and no in-cluster credentials: "
            "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set"
        )
    try:
        context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    except OSError as exc:
        raise ConfigError(f"in-cluster CA {directory / 'ca.crt'}: {exc.strerror}") from exc
    if not (directory / "token").is_file():
        raise ConfigError(f"in-cluster token {directory / 'token'} does not exist")
    try:
        port_number = int(port)
    except ValueError as exc:
        raise ConfigError(f"KUBERNETES_SERVICE_PORT {port!r} is not a port number") from exc
    return Credentials(host.strip("[]"), port_number, context, token_file=directory / "token")


class Client:
    """JSON requests over one kept-alive HTTPS connection (thread-safe: calls are serialised)."""

    def __init__(self, credentials: Credentials, *, timeout: float = 10.0) -> None:
        self.credentials = credentials
        self.timeout = timeout
        self._lock = threading.Lock()
        self._conn: http.client.HTTPSConnection | None = None
        self._token = credentials.token
        self._token_read: float | None = None  # never: read the file on the first request

    @classmethod
    def connect(cls, kubeconfig: Path | None, *, environ: Mapping[str, str] | None = None) -> Client:
        return cls(from_kubeconfig(kubeconfig) if kubeconfig is not None else in_cluster(environ))

    def _bearer(self) -> str | None:
        path = self.credentials.token_file
        stale = self._token_read is None or time.monotonic() - self._token_read > TOKEN_REREAD_S
        if path is not None and stale:
            try:
                self._token = path.read_text().strip()
            except OSError as exc:
                raise translate.error(
                    None, "read", f"service account token {path}", body=exc.strerror
                ) from exc
            self._token_read = time.monotonic()
        return self._token

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
        what: str | None = None,
    ) -> Any:  # fmt: skip
        """The decoded JSON answer. One retry on a connection the server had closed. Errors are
        `faultline.errors` classes naming the method and `what` (default: the path)."""
        verb, what = _VERBS.get(method, method.lower()), what or path
        headers = {"Accept": "application/json", "User-Agent": "faultline-agent"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        with self._lock:
            token = self._bearer()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            for attempt in (1, 2):
                conn = self._conn or http.client.HTTPSConnection(
                    self.credentials.host, self.credentials.port, timeout=self.timeout,
                    context=self.credentials.context,
                )  # fmt: skip
                try:
                    conn.request(method, path, payload, headers)
                    response = conn.getresponse()
                    data = response.read()
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                    conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise translate.error(None, verb, what, body=str(exc)) from exc
                    continue  # a kept-alive connection the server closed: once more on a new one
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    self._conn = None
                    raise translate.error(None, verb, what, body=str(exc)) from exc
                self._conn = conn
                break
        if response.status >= 400:
            raise translate.error(response.status, verb, what, body=data, headers=dict(response.getheaders()))
        return json.loads(data) if data else None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def read_node_status(client: Client, node: str) -> dict[str, Any]:
    result: dict[str, Any] = client.request(
        "GET", f"/api/v1/nodes/{_quote(node)}/status", what=f"Node {node}"
    )
    return result


def patch_node_conditions(
    client: Client, node: str, conditions: list[dict[str, str]], delete: list[str]
) -> dict[str, Any] | None:
    """Set conditions (merged by type) and delete the condition types in `delete`, in one status patch;
    the patched Node, or None when there was nothing to write."""
    body = bodies.conditions_patch(conditions, delete)
    if body is None:
        return None
    result: dict[str, Any] = client.request(
        "PATCH", f"/api/v1/nodes/{_quote(node)}/status", body, content_type=bodies.STRATEGIC_MERGE,
        what=f"status of Node {node}",
    )  # fmt: skip
    return result


def annotate_node(client: Client, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    """Set annotations on the Node through its status (the agent's one right on Nodes; the chart's
    admission policy lets it change only its own Node's faultline annotations and conditions)."""
    result: dict[str, Any] = client.request(
        "PATCH", f"/api/v1/nodes/{_quote(node)}/status", {"metadata": {"annotations": annotations}},
        content_type=bodies.STRATEGIC_MERGE, what=f"annotations of Node {node}",
    )  # fmt: skip
    return result


def post_node_event(
    client: Client, node: str, *, reason: str, note: str, action: str, warning: bool, controller: str,
    instance: str,
) -> None:  # fmt: skip
    """An events.k8s.io/v1 Event about a Node (in `default`, where node events live)."""
    body = bodies.node_event(
        node, reason=reason, note=note, action=action, warning=warning, controller=controller,
        instance=instance,
    )  # fmt: skip
    client.request(
        "POST", "/apis/events.k8s.io/v1/namespaces/default/events", body, what=f"Event on Node {node}"
    )
