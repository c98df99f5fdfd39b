"""The store object and how it connects."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import pymongo
from pymongo.database import Database
from pymongo.errors import ConnectionFailure, OperationFailure, ServerSelectionTimeoutError

from faultline.errors import TransientError
from faultline.store.analyzer import Analyzer
from faultline.store.base import CODEC, DRAINS, MAINTENANCE, NODEDRAIN, QUEUE, REPAIRS, STAGES, Clock, utcnow
from faultline.store.claims import Claims
from faultline.store.drains import Drains
from faultline.store.feed import Feed
from faultline.store.gpu_pods import GpuPodMaps
from faultline.store.holds import Holds
from faultline.store.maintenance import Maintenance
from faultline.store.repairs import Repairs


def connect(uri: str, database: str = "faultline", *, clock: Clock = utcnow, timeout: float = 10.0) -> Store:
    """A Store on a new client (create it where it is used: Bytewax may fork). `timeout` bounds how long a
    call waits for an unreachable server before it fails with TransientError."""
    ms = int(timeout * 1000)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(
        uri,
        serverSelectionTimeoutMS=ms,
        connectTimeoutMS=ms,
        socketTimeoutMS=ms,
        tz_aware=True,
        tzinfo=CODEC.tzinfo,
    )
    return Store(client[database], clock=clock)


# Server answers that mean "not available right now", not "wrong": MongoDB's own (a primary stepping
# down, a server shutting down, a network error between members)...
_UNAVAILABLE_CODES = frozenset({6, 7, 89, 91, 189, 9001, 10107, 11600, 11602, 13435, 13436})
# ...and FerretDB's InternalError (code 1) when its PostgreSQL cannot be reached (the chart's embedded
# store starting: FerretDB answers before PostgreSQL does; measured: "failed to connect to `user=...`:
# dial error: ... connection refused")
_BACKEND_DOWN = (
    "failed to connect to",
    "dial error",
    "connection refused",
    "the database system is starting up",
)


_FRAMES = re.compile(r"^(?:\[[^\]]*\]\s*)+")


def _unavailable(exc: OperationFailure) -> bool:
    if exc.code in _UNAVAILABLE_CODES:
        return True
    text = str(exc)
    return exc.code == 1 and any(marker in text for marker in _BACKEND_DOWN)


@contextlib.contextmanager
def unreachable_is_transient(what: str) -> Iterator[None]:
    """Connection failures, and a server that answers it cannot serve right now (`_unavailable`), as
    TransientError, so callers retry or spool without importing pymongo. Other server errors (a
    duplicate key, a bad query) pass through unchanged."""
    try:
        yield
    except (ConnectionFailure, ServerSelectionTimeoutError) as exc:
        raise TransientError(f"{what}: MongoDB unreachable: {exc}", delay=1.0) from exc
    except OperationFailure as exc:
        if not _unavailable(exc):
            raise
        said = _FRAMES.sub("", str(exc))  # FerretDB puts its call stack, in brackets, before the reason
        raise TransientError(f"{what}: the store cannot serve now: {said[:300]}", delay=1.0) from exc


class Store(Claims, Feed, Holds, Drains, Repairs, GpuPodMaps, Maintenance, Analyzer):
    """Every collection faultline writes, behind named operations (see the package docstring).

    The collection handles (`events`, `faults`, `nodes`, ...) are the store's own, for its operation
    modules (and tests that inspect the database); nothing else uses them. Whatever client `db` came
    from, the store reads dates as aware UTC."""

    def __init__(self, db: Database[Any], *, clock: Clock = utcnow) -> None:
        self.db = db.with_options(codec_options=CODEC)
        self.clock = clock
        self.events = self.db["health_events"]
        self.faults = self.db["faults"]
        self.nodes = self.db["nodes"]
        self.leases = self.db["leases"]
        self.drains = self.db[DRAINS]  # one document per node being drained (drainer)
        self.gpu_pods = self.db["gpu_pods"]  # per node: which pods use which GPU (agent -> drainer)
        self.queue = self.db[QUEUE]  # work items of the fault-level stages
        self.repairs = self.db[REPAIRS]
        self.maintenance = self.db[MAINTENANCE]  # Azure nodes' Scheduled Events (agent <-> monitor)

    def ensure_indexes(self) -> None:
        self.events.create_index([("node", pymongo.ASCENDING), ("observed_at", pymongo.ASCENDING)])
        self.events.create_index([("generated_at", pymongo.ASCENDING)])
        self.faults.create_index([("node", pymongo.ASCENDING), ("state", pymongo.ASCENDING)])
        self.leases.create_index([("fault", pymongo.ASCENDING)])
        for stage in STAGES:
            self.queue.create_index([(f"{stage}.state", pymongo.ASCENDING)])
        self.queue.create_index([("node", pymongo.ASCENDING)])
        self.drains.create_index([(f"{NODEDRAIN}.state", pymongo.ASCENDING)])
        self.nodes.create_index([("quarantined", pymongo.ASCENDING)])
        self.repairs.create_index([("node", pymongo.ASCENDING)])  # the node agents' repairs_to_confirm
        self.ensure_feed_indexes()
        self.faults.create_index([("pattern", pymongo.ASCENDING)])  # the maintenance monitor's faults

    def close(self) -> None:
        """Close the client (the store is unusable afterwards)."""
        self.db.client.close()
