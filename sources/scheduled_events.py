"""Azure Scheduled Events, read on the node: the instance metadata service answers only the VM itself, so
the node agent relays them to the store for the cloud maintenance monitor, and posts the early starts
the monitor asks for.

    every `interval`  GET  {imds}/metadata/scheduledevents?api-version=2020-07-01   (header Metadata: true)
                      ->   Store.record_scheduled_events   when they changed, or `refresh` after the last
                                                           write (the monitor trusts a recent relay only)
                      <-   Store.scheduled_events(node).start_requested   (only while events are listed)
                      POST {imds}/metadata/scheduledevents  {"StartRequests": [{"EventId": ...}]}
                           for requested events still Scheduled, each once
                      ->   Store.record_started

The VM's own name, which the events' `Resources` list, is read once from /metadata/instance/compute. The
first call to the events endpoint turns the service on for the VM, which can take Azure up to two minutes:
until then the document is empty. Requests go straight to the metadata service, never through an HTTP
proxy of the environment. The relay runs only on an Azure node (its Node's spec.providerID starts with
`azure://`); elsewhere it stops after its first look. What becomes a fault, and when, is decided by the
monitor (`workers.maintenance`): the agent only reads and posts. A failed read (the service or the store
away) is logged and tried again at the next interval.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from faultline import bounds, store
from faultline.errors import TransientError
from sources.poller import Poller

log = logging.getLogger(__name__)
API_VERSION = "2020-07-01"
COMPUTE_API_VERSION = "2021-02-01"
DEFAULT_ENDPOINT = "http://169.254.169.254"
DESCRIPTION = 1024  # characters of an event's Description (Azure's free text) kept in the store
# bytes of a metadata-service answer read at most: the events document is a few KiB, and whatever answers at
# the link-local address (a proxy, a broken service) must not make the agent hold an unbounded body
MAX_ANSWER = 1 << 20
ERROR_BYTES = 4096  # of an error answer's body, read for its first words


class Imds:
    """The instance metadata service's two calls the relay makes (standard library, no proxy)."""

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, *, timeout: float = 5.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _call(self, path: str, version: str, body: dict[str, Any] | None = None) -> Any:
        url = f"{self.endpoint}{path}?api-version={version}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, headers={"Metadata": "true"})  # noqa: S310 - http(s) only
        if data is not None:
            request.add_header("Content-Type", "application/json")
        what = f"instance metadata service {'POST' if data else 'GET'} {path}"
        try:
            with self.opener.open(request, timeout=self.timeout) as response:
                raw = response.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            said = bounds.clip(exc.read(ERROR_BYTES).decode(errors="replace"), bounds.ERROR_TEXT)
            exc.close()
            raise TransientError(f"{what}: HTTP {exc.code}: {said}", delay=10.0) from exc
        except OSError as exc:
            raise TransientError(f"{what}: {exc}", delay=10.0) from exc
        if len(raw) > MAX_ANSWER:
            raise TransientError(f"{what}: the answer is over {MAX_ANSWER} bytes, not read", delay=10.0)
        text = raw.decode(errors="replace")
        try:
            return json.loads(text) if text.strip() else {}
        except ValueError as exc:
            raise TransientError(
                f"{what}: not JSON: {bounds.quote(text, bounds.EXCERPT)}", delay=10.0
            ) from exc

    def vm_name(self) -> str:
        return str(self._call("/metadata/instance/compute", COMPUTE_API_VERSION).get("name", ""))

    def document(self) -> tuple[int, list[dict[str, Any]]]:
        """The Scheduled Events document: its DocumentIncarnation and its events."""
        doc = self._call("/metadata/scheduledevents", API_VERSION)
        events = doc.get("Events") if isinstance(doc, dict) else None
        return int(doc.get("DocumentIncarnation") or 0), [e for e in events or [] if isinstance(e, dict)]

    def start(self, event_ids: Iterable[str]) -> None:
        body = {"StartRequests": [{"EventId": e} for e in event_ids]}
        self._call("/metadata/scheduledevents", API_VERSION, body)


def records(events: Iterable[Mapping[str, Any]]) -> list[store.ScheduledEvent]:
    """The events as the store keeps them (Resources joined with commas)."""
    out = []
    for e in events:
        resources = e.get("Resources") or []
        try:
            duration = int(e.get("DurationInSeconds", -1))
        except (TypeError, ValueError):
            duration = -1
        out.append(store.ScheduledEvent(
            event_id=str(e.get("EventId", "")), event_type=str(e.get("EventType", "")),
            status=str(e.get("EventStatus", "Scheduled")),
            resources=",".join(str(r) for r in resources) if isinstance(resources, list) else str(resources),
            not_before=str(e.get("NotBefore") or ""),
            description=bounds.clip(str(e.get("Description") or ""), DESCRIPTION),
            source=str(e.get("EventSource") or ""), duration_s=duration,
        ))  # fmt: skip
    return out


@dataclass(frozen=True)
class StoreLink:
    """What the relay asks of the store (connected on first use, from the relay's thread)."""

    record: Callable[[dt.datetime, str, int, list[store.ScheduledEvent]], None]
    requested: Callable[[], tuple[list[str], list[str]]]  # (start requested, started)
    started: Callable[[list[str], dt.datetime], None]
    close: Callable[[], None] = lambda: None


def store_link(st: store.Store, node: str) -> StoreLink:
    """The node's scheduled events in the store (the agent's one client: closing the link leaves it open
    for its owner)."""

    def connected() -> store.Store:
        return st

    def record(at: dt.datetime, vm: str, incarnation: int, events: list[store.ScheduledEvent]) -> None:
        with store.unreachable_is_transient("recording the node's scheduled events"):
            connected().record_scheduled_events(node, read_at=at, vm_name=vm, incarnation=incarnation,
                                                events=events)  # fmt: skip

    def requested() -> tuple[list[str], list[str]]:
        with store.unreachable_is_transient("reading the starts asked for"):
            doc = connected().scheduled_events([node]).get(node)
        return ([], []) if doc is None else (doc.start_requested, doc.started)

    def started(ids: list[str], at: dt.datetime) -> None:
        with store.unreachable_is_transient("recording the starts posted"):
            connected().record_started(node, ids, at)

    return StoreLink(record, requested, started)


class Relay(Poller):
    """Reads the node's Scheduled Events every `interval` seconds, records them when they changed or
    `refresh` seconds after the last write, and posts the starts the monitor asked for (see the module
    docstring). `provider_id` reads the node's spec.providerID: anything but Azure's ends the relay."""

    def __init__(
        self, node: str, imds: Imds, link: StoreLink, provider_id: Callable[[], str], *,
        interval: float = 10.0, refresh: float = 60.0, clock: Callable[[], dt.datetime] = store.utcnow,
    ) -> None:  # fmt: skip
        super().__init__(node, "scheduled events", interval, link.close)
        self.imds = imds
        self.link = link
        self.provider_id = provider_id
        self.refresh = refresh
        self.clock = clock
        self.azure: bool | None = None  # unknown until the Node has been read
        self.vm = ""
        self.written: tuple[object, ...] | None = None
        self.written_at: dt.datetime | None = None
        self.posted: set[str] = set()

    def step(self) -> bool:
        """One look; whether the relay goes on (False: not an Azure node)."""
        if self.azure is None:
            pid = self.provider_id()
            self.azure = pid.startswith("azure://")
            if not self.azure:
                log.info("not an Azure node: no scheduled events to read",
                         extra={"node": self.node, "provider_id": pid})  # fmt: skip
                return False
        if not self.vm:
            self.vm = self.imds.vm_name()
        incarnation, events = self.imds.document()
        now = self.clock()
        current = (self.vm, incarnation, json.dumps(events, sort_keys=True))
        stale = self.written_at is None or (now - self.written_at).total_seconds() >= self.refresh
        if current != self.written or stale:
            self.link.record(now, self.vm, incarnation, records(events))
            if current != self.written:
                log.info("scheduled events recorded", extra={"node": self.node, "incarnation": incarnation,
                                                             "events": len(events)})  # fmt: skip
            self.written, self.written_at = current, now
        if events:
            self._post_starts(events)
        return True

    def _post_starts(self, events: list[dict[str, Any]]) -> None:
        requested, started = self.link.requested()
        scheduled = {str(e.get("EventId")) for e in events if e.get("EventStatus") == "Scheduled"}
        todo = sorted(set(requested) & scheduled - set(started) - self.posted)
        if not todo:
            return
        self.imds.start(todo)
        self.posted |= set(todo)
        self.link.started(todo, self.clock())
        log.info("scheduled events started early", extra={"node": self.node, "events": ",".join(todo)})

    def look(self) -> bool:
        return self.step()
