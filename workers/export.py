"""The exporter: fault changes and repair steps, read from the store, POSTed to each configured sink as
structured CloudEvents 1.0 (JSON) or as a plain webhook (`{"text": ...}`, what chat tools take).

At least once, in order of time, from a stored position per sink (a new sink starts at its first pass):
- each pass reads what changed since the sink's position, less `SKEW` (faults carry their writer's clock:
  an agent's clock behind this one must not hide a change), and skips the events the position says were
  handled already (sent, refused by the filter, or rejected by the receiver);
- an event is recorded as handled once the receiver accepted it (2xx); the record is written at most once
  a second within a pass and at its end (a stop too), so a crash sends the last second's events again (at
  least once), never an event skipped;
- a receiver that is down or answers 5xx, 408 or 429 is retried with back-off (1 s doubling to
  `backoff_max`), the same event first, so nothing is lost and order is kept; one that answers another
  4xx rejects that event for good: it is counted, logged and passed over (retrying cannot help);
- the position moves to the newest time all events up to which are handled.

A fault's event is its latest stored revision (`<fault id>@<revision>`): revisions written between two
passes are one event. A repair's are each round's request, start and end (`<repair id>#<round>#<phase>`).
Sinks run on threads of their own: one receiver down holds back no other.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from faultline import liveness, store
from faultline.config.export import SinkSpec
from faultline.models import RepairOutcome, utc_text

log = logging.getLogger(__name__)
SKEW = dt.timedelta(minutes=5)  # how far behind this one a writer's clock may be
SAVE_EVERY_S = 1.0  # the position is written at most this often within a pass (and at its end)
BACKOFF_MIN_S = 1.0
RETRYABLE = {408, 429}  # 4xx statuses that mean "later", not "never"
EVENT_TYPE = "io.faultline"
Post = Callable[[str, bytes, dict[str, str], float], int]  # url, body, headers, timeout -> HTTP status


@dataclass(frozen=True)
class Change:
    """One event to export: its id, CloudEvents type, time, node and data, and what the filters look at."""

    id: str
    kind: str  # fault | repair
    type: str
    time: dt.datetime
    node: str
    data: dict[str, Any]
    fatal: bool = False
    action: str = ""
    code: str = ""
    summary: str = ""


def changes(st: store.Store, since: dt.datetime) -> list[Change]:
    """Every event of what changed at or after `since`, oldest first."""
    out = [_fault_change(f, t) for f, t in _faults(st, since)]
    for r in st.repairs_changed_since(since):
        out += _repair_changes(r)
    return sorted((c for c in out if c.time >= since), key=lambda c: (c.time, c.id))


def _faults(st: store.Store, since: dt.datetime) -> list[tuple[store.FaultRecord, dt.datetime]]:
    found = st.faults_changed_since(since)
    written = st.fault_written_at([f.id for f in found])
    return [(f, written[f.id]) for f in found if f.id in written]


def _fault_change(f: store.FaultRecord, written: dt.datetime) -> Change:
    first = f.revision == f.opened_revision if f.opened_revision is not None else f.revision <= 1
    phase = "resolved" if f.state != "open" else ("opened" if first else "updated")
    data = {
        "node": f.node, "entity": {"type": f.entity.type, "id": f.entity.id}, "code": f.code,
        "component": f.component, "fatal": f.fatal, "action": f.action, "state": f.state, "count": f.count,
        "first_seen": _iso(f.first_seen), "last_seen": _iso(f.last_seen), "resolved_at": _iso(f.resolved_at),
        "message": f.message, "revision": f.revision,
    }  # fmt: skip
    verdict = f"{'fatal' if f.fatal else 'not fatal'}, {f.action}"
    summary = f"{f.code} {phase} on {f.node} {f.entity.type} {f.entity.id} ({verdict})"
    return Change(f"{f.id}@{f.revision}", "fault", f"{EVENT_TYPE}.fault.{phase}", written, f.node, data,
                  f.fatal, f.action, f.code, summary)  # fmt: skip


def _repair_changes(r: store.Repair) -> list[Change]:
    out = []
    for i, rnd in enumerate(r.rounds):
        base = {"repair": r.id, "node": r.node, "round": i + 1, "step": str(rnd.step), "request": rnd.request,
                "gpus": list(rnd.gpus), "reason": rnd.reason}  # fmt: skip
        # a round cancelled or refused before it started records a start only as the end's time
        started = rnd.started_at if rnd.outcome != RepairOutcome.CANCELLED else None
        phases: list[tuple[str, dt.datetime | None, dict[str, Any]]] = [
            ("requested", rnd.requested_at, {}),
            ("started", started, {}),
        ]
        if rnd.outcome is not None:
            phases.append(("finished", rnd.at, {"outcome": str(rnd.outcome), "message": rnd.message}))
        for phase, at, extra in phases:
            if at is None:
                continue
            outcome = f": {extra['outcome']}" if extra else ""
            out.append(Change(
                f"{r.id}#{i + 1}#{phase}", "repair", f"{EVENT_TYPE}.repair.{phase}", at, r.node,
                {**base, **extra, "at": _iso(at)}, action=str(rnd.step),
                summary=f"repair of {r.node}: {rnd.step} {phase}{outcome} ({rnd.request})",
            ))  # fmt: skip
    return out


def accepts(sink: SinkSpec, change: Change) -> bool:
    f = sink.filter
    if f.kinds is not None and change.kind not in f.kinds:
        return False
    if f.actions is not None and change.action not in f.actions:
        return False
    if f.fatal is not None and (change.kind != "fault" or change.fatal != f.fatal):
        return False
    return f.codes is None or (change.kind == "fault" and change.code in f.codes)


def body(sink: SinkSpec, change: Change, cluster: str) -> tuple[bytes, str]:
    """The POST's body and content type in the sink's format."""
    if sink.format == "webhook":
        return json.dumps({"text": f"[faultline {cluster}] {change.summary}"}).encode(), "application/json"
    event = {
        "specversion": "1.0", "id": change.id, "source": f"faultline/{cluster}", "type": change.type,
        "subject": change.node, "time": _iso(change.time), "datacontenttype": "application/json",
        "data": change.data,
    }  # fmt: skip
    return json.dumps(event, sort_keys=True).encode(), "application/cloudevents+json"


def headers(sink: SinkSpec, payload: bytes, content_type: str) -> dict[str, str]:
    out = {"Content-Type": content_type, "User-Agent": "faultline-export"}
    if sink.bearer_token_file is not None:
        out["Authorization"] = f"Bearer {sink.bearer_token_file.read_text().strip()}"
    if sink.hmac_secret_file is not None:
        key = sink.hmac_secret_file.read_bytes().strip()
        out["X-Faultline-Signature"] = "sha256=" + hmac.new(key, payload, hashlib.sha256).hexdigest()
    return out


def post(url: str, payload: bytes, head: dict[str, str], timeout: float) -> int:
    """POST with the standard library; the HTTP status (an error status too), or raise OSError."""
    request = urllib.request.Request(url, data=payload, headers=head, method="POST")  # noqa: S310 - http(s) only
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.sent = Counter("faultline_export_sent", "Events a sink accepted", ["sink"], registry=r)
        self.failures = Counter("faultline_export_failures", "POSTs that failed and are retried (down, 5xx)",
                                ["sink"], registry=r)  # fmt: skip
        self.rejected = Counter("faultline_export_rejected", "Events a sink refused for good (4xx)", ["sink"],
                                registry=r)  # fmt: skip
        lag = "Now minus the time before which a sink has handled everything"
        self.lag = Gauge("faultline_export_lag_seconds", lag, ["sink"], registry=r)


class Exporter:
    """One thread per sink; `start`, then `halt`."""

    def __init__(
        self, st: store.Store, sinks: list[SinkSpec], *, cluster: str, poll: float, stall: float = 120.0,
        send: Post = post,
    ) -> None:  # fmt: skip
        self.store = st
        self.sinks = sinks
        self.cluster = cluster
        self.poll = poll
        self.send = send
        self.stop = threading.Event()
        self.metrics = Metrics()
        self.alive = liveness.Liveness()
        self.stall = stall
        self.threads: list[threading.Thread] = []

    def start(self) -> list[threading.Thread]:
        for sink in self.sinks:
            name = f"export-{sink.name}"
            self.alive.loop(name, self.stall + self.poll + sink.backoff_max.total_seconds())
            thread = threading.Thread(target=self._run, args=(sink, name), name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
        return self.threads

    def halt(self, timeout: float = 30.0) -> bool:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in self.threads)

    def _run(self, sink: SinkSpec, name: str) -> None:
        while not self.stop.is_set():
            self.alive.beat(name)
            try:
                self.pass_once(sink, beat=lambda: self.alive.beat(name))
            except Exception as exc:  # noqa: BLE001 - the store away: the next pass tries again
                log.warning("export to %s: pass failed: %s", sink.name, exc, extra={"sink": sink.name})
            self.stop.wait(self.poll)

    def pass_once(self, sink: SinkSpec, beat: Callable[[], None] = lambda: None) -> int:
        """Send what is new to `sink`; how many events it accepted."""
        now = self.store.now()
        since, handled = self.store.export_position(sink.name)
        if since is None:  # a new sink starts now (less the skew allowance), not at the start of history
            since = now
            self.store.save_export_position(sink.name, since, handled)
        look_from = since - SKEW
        sent, unsaved, saved_at = 0, 0, time.monotonic()
        try:
            for change in changes(self.store, look_from):
                if self.stop.is_set():
                    break
                if change.id in handled:
                    continue
                if accepts(sink, change) and self._deliver(sink, change, beat):
                    sent += 1
                elif self.stop.is_set():
                    break
                handled[change.id] = change.time
                unsaved += 1
                if time.monotonic() - saved_at >= SAVE_EVERY_S:  # a storm's events: one write a second
                    self.store.save_export_position(sink.name, since, handled)
                    unsaved, saved_at = 0, time.monotonic()
            else:  # everything up to now handled: the position moves (never back: a restarted exporter's
                since = max(
                    since, now
                )  # clock may be behind the last one's), and what it covers is forgotten
                keep = since - SKEW
                handled = {k: t for k, t in handled.items() if t >= keep}
                unsaved += 1
        finally:
            if unsaved:
                self.store.save_export_position(sink.name, since, handled)
        self.metrics.lag.labels(sink=sink.name).set(max(0.0, (self.store.now() - since).total_seconds()))
        return sent

    def _deliver(self, sink: SinkSpec, change: Change, beat: Callable[[], None]) -> bool:
        """POST until the sink accepts (True) or rejects it for good (False); False also when stopped."""
        payload, content_type = body(sink, change, self.cluster)
        wait = BACKOFF_MIN_S
        while not self.stop.is_set():
            beat()
            try:
                status = self.send(sink.url, payload, headers(sink, payload, content_type),
                                   sink.timeout.total_seconds())  # fmt: skip
                why = f"HTTP {status}"
            except (
                OSError,
                http.client.HTTPException,
                ValueError,
            ) as exc:  # down, a broken answer, a bad URL
                status, why = 0, f"{type(exc).__name__}: {exc}"
            if 200 <= status < 300:
                self.metrics.sent.labels(sink=sink.name).inc()
                return True
            if 400 <= status < 500 and status not in RETRYABLE:
                self.metrics.rejected.labels(sink=sink.name).inc()
                log.warning("export to %s: %s rejected: %s", sink.name, change.id, why,
                            extra={"sink": sink.name, "event": change.id})  # fmt: skip
                return False
            self.metrics.failures.labels(sink=sink.name).inc()
            log.warning("export to %s: %s failed (%s); again in %.0f s", sink.name, change.id, why, wait,
                        extra={"sink": sink.name, "event": change.id})  # fmt: skip
            self.stop.wait(wait)
            wait = min(wait * 2, sink.backoff_max.total_seconds())
        return False


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else utc_text(t)
