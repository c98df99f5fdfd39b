"""The client side of the node agent's gRPC HealthIngest (`sources.ingest_server`): report health events
to the agent of this node over its Unix socket, as any monitor outside faultline does. `faultline
preflight` uses it for what it finds, so the normal pipeline (the agent's `ingest` pack, the store,
quarantine) takes a node that fails preflight out of service.

The agent refuses a batch as a whole (INVALID_ARGUMENT naming the field) or keeps it durably before it
answers; `report` raises `IngestError` with the agent's reason when the batch was not kept.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from faultline.api import health_pb2, health_pb2_grpc

# characters of an event's message the agent accepts (sources.ingest.MAX_MESSAGE, not imported: that module
# loads Bytewax, which a preflight container does not need)
MAX_MESSAGE = 4096


class IngestError(RuntimeError):
    """The agent did not keep the events (not reachable, refused, full): the message says which."""


@dataclass(frozen=True)
class Event:
    code: str
    message: str
    component: str = "GPU"
    entity: tuple[str, str] | None = None  # (type, id), e.g. ("GPU", "0000:3b:00"); None: the node
    fatal: bool = True
    action: str = "COMPONENT_RESET"
    metadata: Mapping[str, str] = field(default_factory=dict)


def report(
    socket: Path, node: str, events: Sequence[Event], *, agent: str, check: str, timeout: float = 10.0,
    now: dt.datetime | None = None,
) -> int:  # fmt: skip
    """Send the events in one batch; the number the agent accepted."""
    when = now or dt.datetime.now(dt.UTC)
    batch = health_pb2.HealthEventBatch()
    for e in events:
        msg = batch.events.add(
            node=node, agent=agent, check=check, component=e.component, code=e.code, healthy=False,
            fatal=e.fatal, action=e.action, message=e.message[:MAX_MESSAGE], metadata=dict(e.metadata),
        )  # fmt: skip
        if e.entity is not None:
            msg.entities.add(type=e.entity[0], id=e.entity[1])
        msg.generated_at.FromDatetime(when)
    try:
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            reply = health_pb2_grpc.HealthIngestStub(channel).Report(batch, timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        raise IngestError(f"the node agent's ingest at {socket} did not keep the events: "
                          f"{code.name if code else 'error'}: {details}") from exc  # fmt: skip
    return int(reply.accepted)
