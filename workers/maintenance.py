"""The cloud maintenance monitor (`faultline maintenance`, one Deployment): announced maintenance of the
cluster's instances becomes a fault on each node ahead of its window, so quarantine cordons it and the
drainer empties it before the provider takes it down; the fault resolves when the maintenance is over
and the node is back.

Every `interval` it lists the Nodes, reads what each node's provider announces (by `spec.providerID`)
and decides per node with `workers.maintenance_plan` (pure), then writes the changes:

    AWS    DescribeInstanceStatus, 100 instances a call per region    (workers.cloud.aws)
    GCP    instances.list per zone, scheduling and upcomingMaintenance (workers.cloud.gcp)
    OCI    GetInstance per node, timeMaintenanceRebootDue             (workers.cloud.oci)
    Azure  Scheduled Events, which only the node can read: relayed by its agent into the store
           (`maintenance/<node>`, `sources.scheduled_events`); a relay older than `azure_stale_after`
           is not trusted

A fault is `CSP-MAINTENANCE-<kind>` on the node (entity NODE), with the action the event implies and
fatal for the `quarantine_kinds`, written by revision like an agent's (pattern `cloud-maintenance`). Its
`metadata` is the monitor's whole memory of it (`maintenance_plan.Raised`: the events, the window, the
boot id it was raised under, when the events ended, when an early start was asked for) plus `repair:
provider` (`models.PROVIDER_REPAIR`): remediation asks for no repair of it, the provider does the work.
Each raise and resolve is also a health event and an Event on the Node.

Azure's early start: once a node with an open Azure maintenance fault is drained in its current
quarantine episode (the quarantine's `NodeHold` and the drainer's `Drain` say so), the monitor asks for
its scheduled events to start (`Store.request_start`); the node's agent posts the StartRequests. The
monitor never calls another module: it reads the store and the API, and writes its faults and requests.

Nothing is lost to a restart: each look starts from the store and the providers. A provider that cannot
be read (throttled, credentials refused) leaves its nodes' faults as they are until it can.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import SkipValidation

from faultline import bounds, config, kube, liveness, store
from faultline.errors import ConfigError, FaultlineError
from faultline.models import (
    PROVIDER_REPAIR,
    Component,
    Entity,
    Fault,
    FaultState,
    HealthEvent,
    event_id,
    fault_id,
)
from workers import announcements, cloud, common
from workers import maintenance_plan as plan

log = logging.getLogger(__name__)
WORKER = "maintenance"
LOOP = "maintenance"  # the loop's name in its liveness
NODE_ENTITY = ("NODE", "")
FEED_WRITER = "maintenance"  # its sequence in the analyzer's feed (`analyzer_feed`)
# reads the announcements of the nodes of one provider: {node: its instance} -> {node: what was read}
Reader = Callable[[Mapping[str, cloud.Instance]], dict[str, announcements.Read]]


class Metrics:
    """The maintenance monitor's metrics, on a registry of their own."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.announced = Gauge("faultline_maintenance_announced", "Maintenance events announced now",
                               ["provider", "kind"], registry=r)  # fmt: skip
        self.open = Gauge("faultline_maintenance_faults_open", "Open maintenance faults", registry=r)
        self.errors = Counter("faultline_maintenance_read_errors", "Provider reads that failed", ["provider"],
                              registry=r)  # fmt: skip
        self.actions = Counter("faultline_maintenance_actions", "Faults raised and resolved, early starts",
                               ["result"], registry=r)  # fmt: skip


class Settings(config.MaintenanceTuning):
    """The monitor's tunables and the providers' readers (built in `workers.run`, fakes in tests)."""

    readers: SkipValidation[dict[str, Reader]] = {}

    @property
    def plan(self) -> plan.Settings:
        kinds = frozenset(self.quarantine_kinds)
        return plan.Settings(self.lead_time, self.settle, kinds, self.acknowledge)


def lazy(make: Callable[[], Any]) -> Callable[[], Any]:
    """The provider `make` builds, built at its first use and kept (a missing OCI key file is then an
    error of each look, logged, not a monitor that cannot start on a cluster with no OCI node)."""
    made: list[Any] = []

    def get() -> Any:
        if not made:
            made.append(make())
        return made[0]

    return get


def aws_reader(provider: Callable[[], Any]) -> Reader:
    """EC2's scheduled events, every node of the provider in one call per region and 100 instances."""

    def read(nodes: Mapping[str, cloud.Instance]) -> dict[str, announcements.Read]:
        events = provider().instance_events(list(nodes.values()))
        return {node: announcements.from_ec2(events.get(inst.id, [])) for node, inst in nodes.items()}

    return read


def gcp_reader(provider: Callable[[], Any]) -> Reader:
    """GCE's upcoming maintenance, one list call per zone the nodes are in."""

    def read(nodes: Mapping[str, cloud.Instance]) -> dict[str, announcements.Read]:
        zones = sorted({(i.project, i.zone) for i in nodes.values()})
        listed = {zone: provider().zone_instances(*zone) for zone in zones}
        return {node: announcements.from_gce(i.id, listed[(i.project, i.zone)].get(i.id, {}))
                for node, i in nodes.items()}  # fmt: skip

    return read


def oci_reader(provider: Callable[[], Any]) -> Reader:
    """OCI's due maintenance reboots, one GetInstance per node (a node that fails is left unread)."""

    def read(nodes: Mapping[str, cloud.Instance]) -> dict[str, announcements.Read]:
        out = {}
        oci = provider()
        for node, inst in nodes.items():
            try:
                out[node] = announcements.from_oci(inst.id, oci.instance(inst))
            except FaultlineError as exc:
                log.warning("maintenance: %s", exc, extra={"node": node, "provider": "oci"})
        return out

    return read


def encode(kind: str, rec: plan.Raised) -> dict[str, str]:
    """A fault's metadata from the monitor's record of it (str -> str, as Fault.metadata is)."""

    def when(t: dt.datetime | None) -> str:
        return "" if t is None else t.astimezone(dt.UTC).isoformat()

    return {
        "kind": kind, "provider": rec.provider, "events": ",".join(rec.events),
        "not_before": when(rec.not_before), "not_after": when(rec.not_after), "boot_id": rec.boot_id,
        "what": rec.what[:plan.WHAT],
        "over_since": when(rec.over_since), "acknowledged": when(rec.acknowledged),
        "started": "true" if rec.started else "false", "repair": PROVIDER_REPAIR,
    }  # fmt: skip


def decode(metadata: Mapping[str, str]) -> plan.Raised:
    def when(key: str) -> dt.datetime | None:
        value = metadata.get(key) or ""
        return dt.datetime.fromisoformat(value) if value else None

    events = tuple(e for e in (metadata.get("events") or "").split(",") if e)
    return plan.Raised(
        metadata.get("provider", ""), events, when("not_before"), when("not_after"),
        metadata.get("boot_id", ""), metadata.get("what", ""), when("over_since"), when("acknowledged"),
        metadata.get("started") == "true",
    )  # fmt: skip


def node_state(obj: Mapping[str, Any] | None) -> plan.NodeState:
    if obj is None:
        return plan.NodeState(exists=False)
    status = obj.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return plan.NodeState(True, ready, str((status.get("nodeInfo") or {}).get("bootID", "")))


class MaintenanceMonitor:
    def __init__(
        self, st: store.Store, api: kube.ApiClient, settings: Settings, owner: str, *,
        clock: Callable[[], dt.datetime] = store.utcnow, stall: float = liveness.DEFAULT_LIMIT_S,
    ) -> None:  # fmt: skip
        self.store = st
        self.api = api
        self.settings = settings
        # a look that never ends fails /healthz; one that fails (an outage) still counts: it is waited out
        self.alive = liveness.Liveness()
        self.alive.loop(LOOP, settings.interval.total_seconds() + stall)
        self.owner = owner
        self.clock = clock
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.revision = 0
        m = Metrics()
        self.registry, self.announced, self.open, self.errors, self.actions = (
            m.registry,
            m.announced,
            m.open,
            m.errors,
            m.actions,
        )

    # -- the loop ------------------------------------------------------------------------------------------
    def start(self) -> list[threading.Thread]:
        self.thread = threading.Thread(target=self._run, name="maintenance", daemon=True)
        self.thread.start()
        return [self.thread]

    def halt(self, timeout: float = 30.0) -> bool:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    def healthy(self) -> bool:
        """The loop is not stuck (see `alive`)."""
        return self.alive()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                with store.unreachable_is_transient("looking at cloud maintenance"):
                    self.look()
            except Exception as exc:  # noqa: BLE001 - the store or the API server away: the next look
                log.warning("maintenance: look failed: %s", bounds.clip(str(exc), bounds.ERROR_TEXT),
                            extra={"worker": WORKER})  # fmt: skip
            finally:
                self.alive.beat(LOOP)
            self.stop.wait(self.settings.interval.total_seconds())

    # -- one look ------------------------------------------------------------------------------------------
    def look(self) -> None:
        """Read the nodes, the providers and the store; write what changed (see the module docstring)."""
        now = self.clock()
        every = {str(n["metadata"]["name"]): n for n in kube.nodes.list_all(self.api)}
        selector = self.settings.node_selector
        watched_names = set(every)
        if selector:  # `every` is still every Node: one that is gone resolves its faults
            selected = kube.nodes.list_all(self.api, label_selector=selector)
            watched_names = {str(n["metadata"]["name"]) for n in selected}
        watched: dict[str, dict[str, cloud.Instance]] = {}
        for name in sorted(watched_names):
            try:
                inst = cloud.instance(str((every[name].get("spec") or {}).get("providerID", "")))
            except ValueError:
                continue  # bare metal, or a provider faultline has no API for
            if inst.provider in self.settings.clouds:
                watched.setdefault(inst.provider, {})[name] = inst
        raised: dict[str, dict[str, tuple[store.FaultRecord, plan.Raised]]] = {}
        for record in self.store.maintenance_faults():
            kind = announcements.BY_CODE.get(record.code)
            if kind is not None:
                raised.setdefault(record.node, {})[kind] = (record, decode(record.metadata))
        read = self._read(watched, now)
        self.announced.clear()
        for found in read.values():
            for a in found or []:
                if a.active:
                    self.announced.labels(provider=a.provider, kind=a.kind).inc()
        for node in sorted(set(read) | set(raised)):
            mine = raised.get(node, {})
            azure = any(rec.provider in plan.ACKNOWLEDGES for _, rec in mine.values())
            node_plan = plan.plan(
                now, node_state(every.get(node)), read.get(node), {k: rec for k, (_, rec) in mine.items()},
                drained=azure and self._drained(node), settings=self.settings.plan,
            )  # fmt: skip
            self._apply(node, node_plan, mine, now)
        self.open.set(len(self.store.maintenance_faults()))

    def _read(
        self, watched: Mapping[str, Mapping[str, cloud.Instance]], now: dt.datetime
    ) -> dict[str, list[announcements.Announcement] | None]:
        """Every watched node's announcements; None for a node whose provider could not be read."""
        out: dict[str, list[announcements.Announcement] | None] = {}
        for provider, nodes in sorted(watched.items()):
            out.update(dict.fromkeys(nodes))
            try:
                if provider == "azure":
                    found = self._azure(nodes, now)
                elif provider in self.settings.readers:
                    found = self.settings.readers[provider](nodes)
                else:
                    raise ConfigError(f"no reader of {provider}'s announcements is configured")
            except Exception as exc:  # noqa: BLE001 - a provider away or refusing: its nodes unread
                self.errors.labels(provider=provider).inc()
                log.warning("maintenance: %s could not be read: %s", provider,
                            bounds.clip(str(exc), bounds.ERROR_TEXT),
                            extra={"provider": provider, "nodes": len(nodes)})  # fmt: skip
                continue
            for node, (events, notes) in found.items():
                for note in notes:
                    log.warning("maintenance: %s", note, extra={"node": node, "provider": provider})
                out[node] = events
        return out

    def _azure(self, nodes: Mapping[str, cloud.Instance], now: dt.datetime) -> dict[str, announcements.Read]:
        relayed = self.store.scheduled_events(nodes)
        out = {}
        for node in nodes:
            doc = relayed.get(node)
            if doc is None or doc.read_at is None or now - doc.read_at > self.settings.azure_stale_after:
                continue  # its agent has not relayed lately: unread
            events = [{"EventId": e.event_id, "EventType": e.event_type, "EventStatus": e.status,
                       "Resources": e.resources, "NotBefore": e.not_before, "Description": e.description,
                       "EventSource": e.source} for e in doc.events]  # fmt: skip
            out[node] = announcements.from_azure(doc.vm_name, events)
        return out

    def _drained(self, node: str) -> bool:
        """Drained (the whole node) in its current quarantine episode."""
        hold = self.store.hold(node)
        if hold is None or not hold.quarantined or hold.quarantined_at is None:
            return False
        drain = self.store.drain(node)
        return (drain is not None and drain.result == store.DRAINED and drain.episode == hold.quarantined_at
                and drain.scope != "gpus")  # fmt: skip

    # -- writes --------------------------------------------------------------------------------------------
    def _next_revision(self) -> int:
        """Above anything this monitor wrote before, in this process or an earlier one (by the clock, as
        the agents' revisions are)."""
        self.revision = max(self.revision + 1, int(time.time() * 1000) << 20)
        return self.revision

    def _apply(
        self, node: str, node_plan: plan.NodePlan, mine: Mapping[str, tuple[store.FaultRecord, plan.Raised]],
        now: dt.datetime,
    ) -> None:  # fmt: skip
        if node_plan.acknowledge:  # asked for before the fault records it: a crash between asks again
            self.store.request_start(node, node_plan.acknowledge)
            note = f"drained: asked Azure to start {', '.join(node_plan.acknowledge)} now"
            self._event(node, "FaultlineMaintenanceStartRequested", note, False)
            self.actions.labels(result="start-requested").inc()
        for step in node_plan.steps:
            kind = announcements.KINDS[step.kind]
            stored = mine.get(step.kind, (None, None))[0]
            fault = Fault(
                id=fault_id(node, *NODE_ENTITY, kind.code), node=node, entity=Entity(type="NODE", id=""),
                code=kind.code, component=Component.NODE, count=1,
                first_seen=stored.first_seen if stored is not None else now, last_seen=now,
                fatal=step.kind in self.settings.quarantine_kinds, action=kind.action,
                state=FaultState.RESOLVED if step.op == "resolve" else FaultState.OPEN,
                resolved_at=now if step.op == "resolve" else None,
                description=f"cloud maintenance: {kind.what}", message=_message(step),
                pattern=store.MAINTENANCE_PATTERN, metadata=encode(step.kind, step.record),
            )  # fmt: skip
            events = [] if step.op == "update" else [HealthEvent(
                id=event_id(node, "csp", *NODE_ENTITY, kind.code, now), node=node, agent="faultline",
                component=Component.NODE, check=f"cloud-maintenance-{step.record.provider}", code=kind.code,
                entities=(Entity(type="NODE", id=""),), healthy=step.op == "resolve", fatal=fault.fatal,
                action=kind.action, message=fault.message, metadata={"source": "csp", **fault.metadata},
                generated_at=now, observed_at=now,
            )]  # fmt: skip
            # the history first, as the agents write (a reader of the fault finds its event); with
            # analyzer_feed, both into the cluster analyzer's feed too
            if self.settings.analyzer_feed:
                self.store.record_batch(events, [(fault, self._next_revision())], writer=FEED_WRITER)
            else:
                self.store.record_events(events)
                self.store.write_fault(fault, self._next_revision())
            if step.op == "update":
                continue
            result = "raised" if step.op == "raise" else f"resolved-{step.reason}"
            self.actions.labels(result=result).inc()
            if step.reason != "gone":
                reason = {"raise": "FaultlineMaintenanceAnnounced", "over": "FaultlineMaintenanceOver",
                          "cancelled": "FaultlineMaintenanceCancelled"}[step.reason or step.op]  # fmt: skip
                self._event(node, reason, f"{kind.code}: {fault.message}", step.op == "raise")
            else:
                log.info("node action", extra={"node": node, "reason": "FaultlineMaintenanceNodeGone",
                                               "code": kind.code, "worker": WORKER})  # fmt: skip

    def _event(self, node: str, reason: str, note: str, warning: bool) -> None:
        common.post_event(self.api, node, reason=reason, note=note, action="Maintenance", warning=warning,
                          worker=WORKER, owner=self.owner)  # fmt: skip


def _message(step: plan.Step) -> str:
    rec = step.record
    window = rec.not_before.strftime("%Y-%m-%dT%H:%M:%SZ") if rec.not_before else "now"
    if rec.not_after is not None:
        window += f" to {rec.not_after:%Y-%m-%dT%H:%M:%SZ}"
    said = {"cancelled": "cancelled", "over": "over, the node is back", "gone": "the node is gone"}
    text = f"{rec.what} from {window}" + (f": {said[step.reason]}" if step.reason else "")
    return bounds.clip(text, bounds.EVENT_NOTE)
