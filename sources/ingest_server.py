"""The gRPC server of the health ingest (`faultline.v1.HealthIngest`): validates each batch with
`sources.ingest.validate` and appends it to the `IngestSpool` before it answers. A module of its own so
that an agent without ingest never imports grpc and protobuf (about 20 MiB of its footprint).

Served on a Unix socket created with mode 0600 (only the socket's owner, root in the DaemonSet, may
connect), and optionally on TCP with mutual TLS only: a client must present a certificate the configured
CA signed (whoever reaches a TCP port is no one in particular).

The method takes the request as bytes and decodes it itself: with the generated handler a request that
is not a HealthEventBatch failed in grpc's deserializer as INTERNAL "Exception deserializing request!"
(a server fault, to the client) with a traceback in the agent's log; it is the client's error,
INVALID_ARGUMENT naming the request (found by fuzzing the server, tests/unit/test_fuzz_ingest.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from faultline.api import health_pb2, health_pb2_grpc
from sources.ingest import IngestSpool, InvalidEventError, SpoolFullError, validate


class HealthIngestService(health_pb2_grpc.HealthIngestServicer):
    def __init__(self, node: str, spool: IngestSpool) -> None:
        self.node = node
        self.spool = spool

    def Report(  # noqa: N802 - the name is the RPC's
        self, request: health_pb2.HealthEventBatch, context: grpc.ServicerContext
    ) -> health_pb2.ReportResponse:
        try:
            records = validate(request, self.node, dt.datetime.now(dt.UTC))
        except InvalidEventError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            self.spool.append(records)
        except SpoolFullError as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"ingest spool full: {exc}; retry later")
        except OSError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot persist the events: {exc}")
        return health_pb2.ReportResponse(accepted=len(records))

    def report_bytes(self, data: bytes, context: grpc.ServicerContext) -> health_pb2.ReportResponse:
        """`Report` for a request still encoded: one that does not decode is refused as the client's."""
        try:
            request = health_pb2.HealthEventBatch.FromString(data)
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a HealthEventBatch ({exc})")
        return self.Report(request, context)


def _handler(service: HealthIngestService) -> grpc.GenericRpcHandler:
    """The HealthIngest service with `Report` taking the encoded request (see the module doc)."""
    report: grpc.RpcMethodHandler[bytes, health_pb2.ReportResponse] = grpc.unary_unary_rpc_method_handler(
        service.report_bytes, response_serializer=health_pb2.ReportResponse.SerializeToString
    )
    return grpc.method_handlers_generic_handler("faultline.v1.HealthIngest", {"Report": report})


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path  # clients must present a certificate it signed


def serve(node: str, spool: IngestSpool, *, socket: Path | None = None, tcp: str | None = None,
          tls: TlsFiles | None = None) -> grpc.Server:  # fmt: skip
    """Start the HealthIngest server (Unix socket with mode 0600 and/or TCP with TLS); returns it running."""
    if socket is None and tcp is None:
        raise ValueError("the ingest server needs a socket path or a TCP address")
    if tcp is not None and tls is None:
        raise ValueError("TCP ingest requires mutual TLS (a certificate, its key and a client CA)")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="ingest"))
    server.add_generic_rpc_handlers((_handler(HealthIngestService(node, spool)),))
    if socket is not None:
        socket.parent.mkdir(parents=True, exist_ok=True)
        socket.unlink(missing_ok=True)
        server.add_insecure_port(f"unix:{socket}")
    if tcp is not None and tls is not None:
        credentials = grpc.ssl_server_credentials(
            [(tls.key.read_bytes(), tls.cert.read_bytes())],
            root_certificates=tls.client_ca.read_bytes(),
            require_client_auth=True,
        )
        server.add_secure_port(tcp, credentials)
    with _umask(0o177):  # the socket file is created 0600: no window in which others may connect
        server.start()
    if socket is not None:
        os.chmod(socket, 0o600)
    return server


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    saved = os.umask(mask)
    try:
        yield
    finally:
        os.umask(saved)
