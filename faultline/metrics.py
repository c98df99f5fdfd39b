"""The agent's Prometheus metrics and its HTTP endpoint (`/metrics`, `/healthz`).

Labels stay bounded: codes and components, never nodes lines or ids (one agent is one node).
"""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import threading
import time
import weakref
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from faultline import liveness

REGISTRY = CollectorRegistry()
EVENTS = Counter("faultline_events", "Matches by fault code", ["code"], registry=REGISTRY)
FAULTS_OPEN = Gauge("faultline_faults_open", "Open faults by component", ["component"], registry=REGISTRY)
SOURCE_LAG = Gauge("faultline_source_lag_seconds", "Processing time minus event time, last item", ["source"],
                   registry=REGISTRY)  # fmt: skip
UNTRUSTED_LINES = Counter("faultline_untrusted_kernel_lines",
                          "Kernel-looking log lines that user space wrote (never a fault)", ["source"],
                          registry=REGISTRY)  # fmt: skip
SPOOL_DEPTH = Gauge("faultline_spool_depth", "Writes waiting in the MongoDB spool", registry=REGISTRY)
SPOOL_BYTES = Gauge("faultline_spool_bytes", "Bytes of the MongoDB spool on disk", registry=REGISTRY)
SPOOL_DROPPED = Counter("faultline_spool_dropped", "Writes a full MongoDB spool refused, by kind", ["kind"],
                        registry=REGISTRY)  # fmt: skip
for _kind in ("event", "fault"):
    SPOOL_DROPPED.labels(kind=_kind)  # exported as 0 before the first drop
BACKEND_WAIT = Histogram("faultline_gpu_backend_call_seconds", "Duration of GPU backend waits and calls",
                         registry=REGISTRY, buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30))  # fmt: skip
FIELD_READ = Histogram("faultline_gpu_field_read_seconds", "Duration of one read of all GPU health fields",
                       registry=REGISTRY, buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30))  # fmt: skip
HEARTBEAT = Gauge("faultline_dataflow_heartbeat_timestamp_seconds", "Last time the dataflow made progress",
                  registry=REGISTRY)  # fmt: skip


# the registries that have it, held weakly: an id() would be reused by a registry made after one collected
_BUILD_INFO: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()


def build_info(registry: CollectorRegistry) -> None:
    """`faultline_build_info{version, python}` 1 on the registry (once): which release each pod runs."""
    if registry in _BUILD_INFO:
        return
    _BUILD_INFO.add(registry)
    info = Gauge("faultline_build_info", "The faultline release and Python this component runs (always 1)",
                 ["version", "python"], registry=registry)  # fmt: skip
    info.labels(version=_version(), python=platform.python_version()).set(1)


def _version() -> str:
    try:
        return importlib.metadata.version("faultline")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree without an install
        return "unknown"


def beat() -> None:
    HEARTBEAT.set(time.time())


def healthy(max_silence: float) -> bool:
    """The dataflow made progress within `max_silence` seconds (sources wake it even when idle)."""
    last = float(HEARTBEAT._value.get())  # prometheus_client has no public reader for a gauge
    return last > 0 and time.time() - last <= max_silence


def serve(
    port: int,
    *,
    host: str = "0.0.0.0",  # noqa: S104 - a pod's probes and scrapes come to its IP, not to loopback
    health: Callable[[], bool] | liveness.Liveness | None = None,
    registry: CollectorRegistry = REGISTRY,
) -> MetricsServer:
    """Serve `/metrics` and `/healthz` on a thread the returned server owns (`close()` stops and joins
    it). `health`: what `/healthz` answers; a `Liveness` names its stalled loops in the 503's body;
    default: the agent's dataflow heartbeat within 30 s.
    `host`: the address to listen on; 0.0.0.0 (every IPv4 interface) by default, so a kubelet's probe to
    the pod IP is answered (bound to 127.0.0.1 it was refused and the pod restarted); an IPv6 address
    (e.g. "::", which also accepts IPv4 where the host allows) listens on IPv6."""
    check = health or (lambda: healthy(30.0))
    build_info(registry)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, generate_latest(registry), "text/plain; version=0.0.4")
            elif self.path == "/healthz":
                ok = check()
                body = "ok\n" if ok else "stalled\n"
                if not ok and isinstance(health, liveness.Liveness):
                    body = "".join(f"stalled: {stall}\n" for stall in health.stalls()) or body
                self._send(200 if ok else 503, body.encode(), "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server_class = _IPv6Server if ":" in host else MetricsServer
    server = server_class((host, port), Handler)
    server.start()
    return server


class MetricsServer(ThreadingHTTPServer):
    """The `/metrics` and `/healthz` server with the thread that serves it."""

    daemon_threads = True  # a scrape in progress never holds the process open
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.serve_forever, name="metrics", daemon=True)
        self.thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving, join the serving thread, close the socket."""
        self.shutdown()
        if self.thread is not None:
            self.thread.join(timeout)
        self.server_close()


class _IPv6Server(MetricsServer):
    address_family = socket.AF_INET6
