"""The gRPC server of the NVSentinel-compatible ingest (`datamodels.PlatformConnector`, the service
NVSentinel's platform connector serves to its health monitors): maps each batch with
`sources.nvsentinel.validate` and appends it to the agent's `IngestSpool` before it answers. A module of
its own so that an agent without it never imports grpc and protobuf.

Served on a Unix socket of the operator's choice (NVSentinel's monitors dial `/var/run/nvsentinel.sock`
in their containers), created with mode 0600 like faultline's own ingest socket, on a server of its own
so that neither service is reachable on the other's socket.

Answers as NVSentinel's monitors expect: `google.protobuf.Empty` once the events are on disk;
INVALID_ARGUMENT naming the field for a bad batch (they do not retry it); UNAVAILABLE when the events
cannot be kept now, a full spool included (the status they retry). As in `sources.ingest_server`, the
request is decoded here, so that one that is not a HealthEvents is the client's error, not INTERNAL.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf import empty_pb2
from google.protobuf.message import DecodeError

from faultline.api import nvsentinel_pb2
from sources import nvsentinel
from sources.ingest import IngestSpool, InvalidEventError, SpoolFullError

SERVICE = "datamodels.PlatformConnector"
METHOD = "HealthEventOccurredV1"
INDEX_FILE = "nvsentinel-checks.json"  # beside the spool's generation files


class PlatformConnectorService:
    def __init__(self, node: str, spool: IngestSpool, index: nvsentinel.CheckIndex) -> None:
        self.node = node
        self.spool = spool
        self.index = index

    def occurred(self, data: bytes, context: grpc.ServicerContext) -> empty_pb2.Empty:
        try:
            request = nvsentinel_pb2.HealthEvents.FromString(data)
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a HealthEvents ({exc})")
        try:
            reports = nvsentinel.validate(request, self.node, dt.datetime.now(dt.UTC))
        except InvalidEventError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            self.index.accept(reports, self.spool.append)
        except SpoolFullError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"ingest spool full: {exc}; retry later")
        except OSError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot persist the events: {exc}")
        return empty_pb2.Empty()


def serve(node: str, spool: IngestSpool, socket: Path) -> grpc.Server:
    """Start the PlatformConnector server on a Unix socket (mode 0600); returns it running."""
    service = PlatformConnectorService(node, spool, nvsentinel.CheckIndex(spool.directory / INDEX_FILE))
    handler: grpc.RpcMethodHandler[bytes, empty_pb2.Empty] = grpc.unary_unary_rpc_method_handler(
        service.occurred, response_serializer=empty_pb2.Empty.SerializeToString
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="nvsentinel"))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler}),))
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    server.add_insecure_port(f"unix:{socket}")
    with _umask(0o177):  # the socket file is created 0600: no window in which others may connect
        server.start()
    os.chmod(socket, 0o600)
    return server


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    saved = os.umask(mask)
    try:
        yield
    finally:
        os.umask(saved)
