"""The store object and how it connects."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pymongo
from pymongo import monitoring
from pymongo.database import Database
from pymongo.errors import (
    ConfigurationError,
    ConnectionFailure,
    OperationFailure,
    ServerSelectionTimeoutError,
)

from faultline import bounds
from faultline.errors import ConfigError, TransientError
from faultline.store.analyzer import Analyzer
from faultline.store.base import CODEC, MAINTENANCE, STAGES, Clock, Signer, Stage, Work, utcnow
from faultline.store.claims import Claims
from faultline.store.drains import Drains
from faultline.store.exports import Exports
from faultline.store.feed import Feed
from faultline.store.fleet import Fleet
from faultline.store.gpu_pods import GpuPodMaps
from faultline.store.holds import Holds
from faultline.store.maintenance import Maintenance
from faultline.store.repairs import Repairs
from faultline.store.rma import Rma

log = logging.getLogger(__name__)
SLOW_S = 2.0  # a store call that takes this long is logged (see SlowCalls)
SLOW_EVERY_S = 30.0  # at most one line per kind of call this often, with how many there were


PYMONGO_POOL = 100  # pymongo's own default maxPoolSize


def connect(
    uri: str, database: str = "faultline", *, clock: Clock = utcnow, timeout: float = 10.0,
    call_timeout: float | None = None, pool: int | None = None, signer: Signer | None = None,
    heartbeat: float | None = None,
) -> Store:  # fmt: skip
    """A Store on a new client (create it where it is used: Bytewax may fork). `timeout` bounds how long a
    call waits for an unreachable server before it fails with TransientError; `call_timeout` (default:
    the same) how long a call to a server that was reached may take; `pool`: the most connections the
    client opens to each server (default: pymongo's 100); `signer`: signs the faults it writes
    (`faultline.evidence`); `heartbeat`: seconds between the client's checks of the server on its monitoring
    connection (default: pymongo's 10 s), which are then always polled, never streamed (MongoDB 4.4 and
    later would otherwise hold a second monitoring connection open for round-trip times: with `heartbeat`
    a client has one monitoring connection and at most `pool` others). Slow calls are logged (`SlowCalls`).

    A URI pymongo cannot use (not `mongodb://` or `mongodb+srv://`, a bad port or option, an SRV name that
    does not resolve) is the settings' error: ConfigError naming `mongodb_uri`, never the URI (it may hold
    a password), and one line, not a crash loop's traceback."""
    ms = int(timeout * 1000)
    monitoring_options: dict[str, Any] = {}
    if heartbeat is not None:
        monitoring_options = {"heartbeatFrequencyMS": int(heartbeat * 1000), "serverMonitoringMode": "poll"}
    if not uri.startswith(("mongodb://", "mongodb+srv://")):  # pymongo would take a bare word for a host
        raise ConfigError("mongodb_uri (MONGODB_URI): not a MongoDB URI: it must begin with mongodb:// or "
                          "mongodb+srv://")  # fmt: skip
    try:
        client: pymongo.MongoClient[Any] = pymongo.MongoClient(
            uri,
            maxPoolSize=PYMONGO_POOL if pool is None else pool,
            serverSelectionTimeoutMS=ms,
            connectTimeoutMS=ms,
            socketTimeoutMS=int((timeout if call_timeout is None else call_timeout) * 1000),
            tz_aware=True,
            tzinfo=CODEC.tzinfo,
            event_listeners=[SlowCalls()],
            **monitoring_options,
        )
    except (ConfigurationError, ValueError, TypeError) as exc:  # InvalidURI is a ConfigurationError
        said = bounds.clip(" ".join(str(exc).replace(uri, "<the URI>").split()), bounds.ERROR_TEXT)
        raise ConfigError(f"mongodb_uri (MONGODB_URI): not a usable MongoDB URI: {said}") from None
    return Store(client[database], clock=clock, signer=signer)


class SlowCalls(monitoring.CommandListener):
    """Logs store calls that took SLOW_S or more (a warning `store call slow`: the command, collection,
    the filter's field names, never its values, and seconds), at most one line per kind of call every
    SLOW_EVERY_S with how many such calls there were since the last line and the slowest: which
    queries a loaded store answers slowly (FerretDB on SQLite evaluates all but `_id` filters after
    reading the whole collection), without a line per call when every call is slow."""

    def __init__(self, slow: float = SLOW_S, every: float = SLOW_EVERY_S) -> None:
        self.slow = slow
        self.every = every
        self.lock = threading.Lock()
        self.calls: dict[int, tuple[str, str]] = {}  # request id -> (collection, filter's fields)
        self.seen: dict[tuple[str, str, str], tuple[float, int, float]] = {}  # kind -> (logged at, n, max)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        target = event.command.get("collection" if event.command_name == "getMore" else event.command_name)
        where = event.command.get("filter") or event.command.get("q") or {}
        if not where and event.command_name in ("update", "delete"):
            ops = event.command.get("updates") or event.command.get("deletes") or [{}]
            where = ops[0].get("q") or {}
        shape = ",".join(sorted(where)) if isinstance(where, dict) else ""
        with self.lock:
            self.calls[event.request_id] = (str(target) if isinstance(target, str) else "", shape)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._done(event.request_id, event.command_name, event.duration_micros / 1e6, "")

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        error = bounds.clip(str(event.failure), bounds.EXCERPT)
        self._done(event.request_id, event.command_name, event.duration_micros / 1e6, error)

    def _done(self, request: int, command: str, seconds: float, error: str) -> None:
        with self.lock:
            collection, shape = self.calls.pop(request, ("", ""))
            if seconds < self.slow:
                return
            kind = (command, collection, shape)
            now = time.monotonic()
            logged, count, slowest = self.seen.get(kind, (-self.every, 0, 0.0))
            count, slowest = count + 1, max(slowest, seconds)
            if now - logged < self.every:
                self.seen[kind] = (logged, count, slowest)
                return
            self.seen[kind] = (now, 0, 0.0)
        log.warning("store call slow", extra={
            "command": command, "collection": collection, "filter": shape, "seconds": round(seconds, 2),
            "count": count, "slowest": round(slowest, 2), "error": error or None,
        })  # fmt: skip


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
        said = bounds.clip(said, bounds.ERROR_TEXT)
        raise TransientError(f"{what}: the store cannot serve now: {said}", delay=1.0) from exc


class Store(Claims, Feed, Holds, Drains, Repairs, GpuPodMaps, Maintenance, Analyzer, Fleet, Exports, Rma):
    """Every collection faultline writes, behind named operations (see the package docstring).

    The collection handles (`events`, `faults`, `nodes`, ...) are the store's own, for its operation
    modules (and tests that inspect the database); nothing else uses them. Whatever client `db` came
    from, the store reads dates as aware UTC."""

    def __init__(self, db: Database[Any], *, clock: Clock = utcnow, signer: Signer | None = None) -> None:
        self.db = db.with_options(codec_options=CODEC)
        self.clock = clock
        self.signer = signer
        self.events = self.db["health_events"]
        self.faults = self.db["faults"]
        self.nodes = self.db["nodes"]
        self.leases = self.db["leases"]
        self.drains = self.db[Work.DRAINS]  # one document per node being drained (drainer)
        self.gpu_pods = self.db["gpu_pods"]  # per node: which pods use which GPU (agent -> drainer)
        self.gpu_ids = self.db["gpus"]  # each GPU's identity, as its agent read it (agent -> reports)
        self.episodes = self.db["episodes"]  # each quarantine, cordon to release (quarantine -> reports)
        self.exports = self.db["exports"]  # the exporter's position per sink
        self.rma = self.db["rma"]  # evidence bundles of nodes handed to a person or replaced
        self.bug_report_files = self.db["bug_reports"]  # nvidia-bug-report outputs, as the agents found them
        self.queue = self.db[Work.QUEUE]  # work items of the fault-level stages
        self.repairs = self.db[Work.REPAIRS]
        self.maintenance = self.db[MAINTENANCE]  # Azure nodes' Scheduled Events (agent <-> monitor)

    def ensure_indexes(self) -> None:
        self.events.create_index([("node", pymongo.ASCENDING), ("observed_at", pymongo.ASCENDING)])
        self.events.create_index([("generated_at", pymongo.ASCENDING)])
        self.faults.create_index([("node", pymongo.ASCENDING), ("state", pymongo.ASCENDING)])
        self.leases.create_index([("fault", pymongo.ASCENDING)])
        for stage in STAGES:
            self.queue.create_index([(f"{stage}.state", pymongo.ASCENDING)])
        self.queue.create_index([("node", pymongo.ASCENDING)])
        self.drains.create_index([(f"{Stage.NODEDRAIN}.state", pymongo.ASCENDING)])
        self.nodes.create_index([("quarantined", pymongo.ASCENDING)])
        self.repairs.create_index([("node", pymongo.ASCENDING)])  # the node agents' repairs_to_confirm
        self.ensure_feed_indexes()
        self.faults.create_index([("pattern", pymongo.ASCENDING)])  # the maintenance monitor's faults

    def ensure_fleet_indexes(self) -> None:
        """The indexes of the cluster-side reads that poll (the exporter's changes since a time, the state
        metrics' oldest open fault) and of the fleet's history (made by the workers, not the agents)."""
        self.faults.create_index([("updated_at", pymongo.ASCENDING)])
        self.faults.create_index([("state", pymongo.ASCENDING), ("first_seen", pymongo.ASCENDING)])
        self.repairs.create_index([("changed_at", pymongo.ASCENDING)])
        self.episodes.create_index([("node", pymongo.ASCENDING), ("released_at", pymongo.ASCENDING)])
        self.episodes.create_index([("quarantined_at", pymongo.ASCENDING)])
        for collection in (self.gpu_ids, self.rma, self.bug_report_files):
            collection.create_index([("node", pymongo.ASCENDING)])

    def close(self) -> None:
        """Close the client (the store is unusable afterwards)."""
        self.db.client.close()
