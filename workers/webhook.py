"""`faultline webhook`: the preflight admission webhook, an HTTPS server the API server calls for each Pod
created in a namespace labelled faultline.io/preflight=enabled (POST /mutate, AdmissionReview v1).

The decision is `workers.preflight_inject.review` (pure); this module serves it: TLS from the certificates
`workers.webhook_certs.Keeper` keeps in a Secret (or from files cert-manager mounts), a cache of namespace
labels (the API server's namespaceSelector chose the namespace; the label is read again here, at most
every `namespace_ttl`), `/healthz` for the probes, and metrics (`faultline_webhook_reviews_total` by
outcome, `faultline_webhook_refused_total`: connections past `max_concurrent`). A request that is not an
AdmissionReview gets 400 naming what is wrong. The TLS context is rebuilt at every certificate sync, so a
rotated certificate is served without a restart.
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from faultline import bounds, liveness
from faultline.errors import FaultlineError
from faultline.kube import preflight as ops
from faultline.kube.lite import Client
from workers import preflight_inject
from workers.webhook_certs import Bundle, Keeper

log = logging.getLogger(__name__)
MAX_BODY = 3 << 20  # an AdmissionReview of a large pod stays far below this
REQUEST_TIMEOUT_S = 10.0
POLL_S = 0.5  # the serving loop's turn when no connection comes (socketserver's default)
# requests answered at once (WebhookConfig.max_concurrent's default): the API server's calls are short
MAX_CONCURRENT = 32
SERVE_LOOP, CERTIFICATES_LOOP = "webhook-serve", "webhook-certificates"  # its loops' names (liveness)

REGISTRY = CollectorRegistry()
REVIEWS = Counter(
    "faultline_webhook_reviews", "Admission reviews answered, by outcome", ["outcome"], registry=REGISTRY
)
REFUSED = Counter(
    "faultline_webhook_refused",
    "Connections closed unanswered because max_concurrent requests were already in flight",
    registry=REGISTRY,
)


class NamespaceLabels:
    """Namespace labels read through the API, kept `ttl` seconds; None when they cannot be read."""

    def __init__(self, client: Client, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[str, tuple[float, dict[str, str]]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> dict[str, str] | None:
        now = self.clock()
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        try:
            labels = ops.namespace_labels(self.client, name)
        except FaultlineError as exc:
            log.warning(
                "namespace labels unreadable; following the namespaceSelector",
                extra={"namespace": name, "error": bounds.clip(str(exc), bounds.ERROR_TEXT)},
            )
            return None
        with self._lock:
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[name] = (now, labels)
        return labels


def context_from_pem(cert: bytes, key: bytes) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2 or later) from PEM bytes."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="faultline-webhook-") as tmp:
        cert_path, key_path = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        context.load_cert_chain(cert_path, key_path)
    return context


class WebhookServer(ThreadingHTTPServer):
    """The HTTPS server, its liveness (`alive`: the accepting loop, each request in flight, the
    certificates' sync; one silent past `stall` seconds fails /healthz) and its threads (`close`).

    At most `max_concurrent` requests are in flight (a thread each): a connection accepted past that is
    closed at once, before any TLS work, and counted in `faultline_webhook_refused_total`, so clients that
    connect and never speak hold at most that many threads (each until it is silent REQUEST_TIMEOUT_S)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        settings: preflight_inject.InjectSettings,
        labels: Callable[[str], dict[str, str] | None],
        context: ssl.SSLContext,
        *,
        stall: float = liveness.DEFAULT_LIMIT_S,
        max_concurrent: int = MAX_CONCURRENT,
    ) -> None:
        self.settings = settings
        self.labels = labels
        self.context = context
        self.stall = stall
        self.alive = liveness.Liveness()
        self.alive.loop(SERVE_LOOP, stall + POLL_S)
        self.requests = itertools.count()
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()
        self.max_concurrent = max_concurrent
        self.in_flight = 0  # requests holding a thread now (changed under _slots)
        self._slots = threading.Lock()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def serve_forever(self, poll_interval: float = POLL_S) -> None:
        super().serve_forever(poll_interval)

    def service_actions(self) -> None:
        """Called by `serve_forever` at every turn (every POLL_S when idle)."""
        self.alive.beat(SERVE_LOOP)

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accepting thread: a thread for the request if fewer than `max_concurrent` are in flight,
        else the connection closed unanswered (no handshake yet: no TLS work) and counted."""
        with self._slots:
            full = self.in_flight >= self.max_concurrent
            if not full:
                self.in_flight += 1
        if full:
            REFUSED.inc()
            log.warning("webhook busy; connection refused", extra={"in_flight": self.max_concurrent})
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        with self._slots:
            self.in_flight -= 1

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """A request answered on its own thread, watched while it runs: one that hangs fails /healthz."""
        name = f"request-{next(self.requests)}"
        self.alive.loop(name, self.stall)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.alive.forget(name)
            self._release()

    def close(self, timeout: float = 10.0) -> None:
        """Stop serving and syncing certificates, join both threads, close the socket."""
        self.stop.set()
        self.shutdown()
        for thread in self.threads:
            thread.join(timeout)
        self.server_close()

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        sock.settimeout(REQUEST_TIMEOUT_S)
        # the handshake runs on the request's own thread (on first read), not on the accepting one
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        request = body.get("request") or {}
        namespace = str(request.get("namespace", ""))
        labels = self.labels(namespace) if namespace else None
        answer = preflight_inject.review(body, self.settings, namespace_labels=labels)
        response = answer["response"]
        outcome = (
            "refused" if not response["allowed"] else ("injected" if "patch" in response else "unchanged")
        )
        REVIEWS.labels(outcome=outcome).inc()
        pod = (request.get("object") or {}).get("metadata") or {}
        log.info(
            "admission review",
            extra={
                "outcome": outcome,
                "namespace": namespace,
                "pod": pod.get("name") or pod.get("generateName", ""),
                "reason": (response.get("status") or {}).get("message", ""),
            },
        )
        return answer


class _Handler(BaseHTTPRequestHandler):
    server: WebhookServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/healthz":
            stalls = self.server.alive.stalls()
            if stalls:
                self._send(503, "".join(f"stalled: {s}\n" for s in stalls).encode(), "text/plain")
            else:
                self._send(200, b"ok", "text/plain")
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != "/mutate":
            self._send(404, b"not found: POST /mutate", "text/plain")
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            self._refuse(f"Content-Length {self.headers.get('Content-Length')!r}: 1 to {MAX_BODY} bytes")
            return
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as exc:
            self._refuse(f"body: not JSON ({exc})")
            return
        if (
            not isinstance(body, dict)
            or body.get("kind") != "AdmissionReview"
            or not isinstance(body.get("request"), dict)
        ):
            self._refuse("body: not an AdmissionReview with a request (admission.k8s.io/v1)")
            return
        if body.get("apiVersion") != "admission.k8s.io/v1":
            self._refuse(f"apiVersion {body.get('apiVersion')!r}: only admission.k8s.io/v1 is served")
            return
        self._send(200, json.dumps(self.server.answer(body)).encode(), "application/json")

    def _refuse(self, message: str) -> None:
        REVIEWS.labels(outcome="bad-request").inc()
        log.warning("bad admission request", extra={"reason": message})
        self._send(400, message.encode(), "text/plain")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are logged by `answer` with their outcome, not as access lines."""

    def handle(self) -> None:
        try:
            super().handle()
        except (ssl.SSLError, OSError) as exc:  # a client that went away or could not agree on TLS
            log.debug("webhook connection ended", extra={"error": bounds.clip(str(exc), bounds.EXCERPT)})


class Certificates:
    """Where the serving certificate comes from: the Keeper's Secret, or files (cert-manager)."""

    def __init__(self, *, keeper: Keeper | None = None, files: tuple[Path, Path] | None = None) -> None:
        if (keeper is None) == (files is None):
            raise ValueError("give the certificates' Keeper or their files, one of the two")
        self.keeper = keeper
        self.files = files

    def load(self) -> Bundle | tuple[bytes, bytes]:
        if self.keeper is not None:
            return self.keeper.sync()
        assert self.files is not None
        return self.files[0].read_bytes(), self.files[1].read_bytes()

    def context(self) -> ssl.SSLContext:
        loaded = self.load()
        cert, key = (loaded.cert, loaded.key) if isinstance(loaded, Bundle) else loaded
        return context_from_pem(cert, key)


def serve(
    address: tuple[str, int],
    settings: preflight_inject.InjectSettings,
    labels: NamespaceLabels,
    certificates: Certificates,
    *,
    check_interval: float,
    stall: float = liveness.DEFAULT_LIMIT_S,
    max_concurrent: int = MAX_CONCURRENT,
) -> WebhookServer:
    """Start serving (certificates loaded first: a failure to get them is raised) and a thread that
    syncs them every `check_interval`; returns the running server (`close()` stops both)."""
    server = WebhookServer(
        address, settings, labels.get, certificates.context(), stall=stall, max_concurrent=max_concurrent
    )
    beat = server.alive.loop(CERTIFICATES_LOOP, check_interval + stall)

    def keep() -> None:
        while not server.stop.wait(check_interval):
            try:
                server.context = certificates.context()
            except (FaultlineError, OSError, ssl.SSLError, ValueError) as exc:
                log.error(
                    "webhook certificates not synced; serving the last ones",
                    extra={"error": bounds.clip(str(exc), bounds.ERROR_TEXT)},
                )
            beat()

    server.threads = [
        threading.Thread(target=server.serve_forever, name="webhook", daemon=True),
        threading.Thread(target=keep, name="webhook-certificates", daemon=True),
    ]
    for thread in server.threads:
        thread.start()
    return server
