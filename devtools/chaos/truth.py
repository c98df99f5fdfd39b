"""Ground truth for one scenario: what was injected, what every node must look like at the end, and what
was lost or done more than once.

Converged means all of it holds at once:
- every injected event is in `health_events` (by its deterministic id, computed here as the agent does);
- each node given a fatal fault: its fault resolved, its last repair round Succeeded, its pods gone,
  the node schedulable again with nothing of faultline's on it (taint, annotation, label) and not held;
- every other node: never cordoned, its pods still there and not terminating.

Duplicates are counted against the same truth: per node given a fatal fault one cordon, one repair
(one Job, or one cloud reboot for nodes with a providerID, one RemediationRequest), each of its pods
evicted once; per other node none of these. Anything beyond is a duplicate (an action on a node that
should have had none counts too).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from devtools.chaos import audit
from devtools.chaos.plan import Schedule
from faultline import bounds, evidence, kube, store
from faultline.models import event_id, fault_id, utc_from_epoch
from sources import simulator

OWNED_MARKS = ("faultline.io/",)


@dataclass
class Sent:
    """Events written to the nodes' simulated GPUs: their ids as the agent will store them."""

    ids: set[str] = field(default_factory=set)
    fatal_ids: set[str] = field(default_factory=set)
    last_at: float = 0.0  # time.monotonic() of the last one

    def add(self, node: str, gpu: int, xid: int, ts: float, *, fatal: bool) -> None:
        pci = simulator.devices_for(node)[gpu].pci
        eid = event_id(node, "nvml", "GPU", pci, f"XID-{xid}", utc_from_epoch(ts))
        self.ids.add(eid)
        if fatal:
            self.fatal_ids.add(eid)


@dataclass
class World:
    """The scenario's fixed facts the checks compare against."""

    schedule: Schedule
    nodes: list[str]
    pods: dict[str, str]  # namespace/pod -> its node
    cloud_nodes: dict[str, str]  # node -> its instance id (rebooted through the cloud API)
    namespace: str

    def fatal_fault(self, node: str) -> str:
        gpu = self.schedule.fatal[node]
        return fault_id(node, "GPU", simulator.devices_for(node)[gpu].pci, "XID-79")


def problems(world: World, st: store.Store, api: Any, sent: Sent) -> list[str]:
    """What does not hold yet (empty: converged). Failed reads are problems too (a part is down)."""
    out: list[str] = []
    try:
        out += _store(world, st)  # first: where the work stands says why a node is not as it should be
        out += _nodes(world, api)
        if not out:  # the costliest read last, once the rest holds
            stored = {str(d["_id"]) for d in st.events.find({}, {"_id": 1})}
            missing = sent.ids - stored
            if missing:
                out.append(f"{len(missing)} injected events not stored yet")
    except Exception as exc:  # noqa: BLE001 - a part still down: not converged
        out.append(f"cannot look: {type(exc).__name__}: {bounds.clip(str(exc), bounds.EXCERPT)}")
    return out


def _nodes(world: World, api: Any) -> list[str]:
    out = []
    fatal = world.schedule.fatal
    for obj in kube.nodes.list_all(api):
        name = obj["metadata"]["name"]
        if name not in world.nodes:
            continue
        if obj["spec"].get("unschedulable"):
            out.append(f"{name}: cordoned")
        marks = [t["key"] for t in obj["spec"].get("taints") or [] if t["key"].startswith(OWNED_MARKS)]
        marks += [
            k
            for k in {**(obj["metadata"].get("annotations") or {}), **(obj["metadata"].get("labels") or {})}
            if k.startswith(OWNED_MARKS) and k not in ("faultline.io/simulated", evidence.KEY_ANNOTATION)
        ]  # the agent's own key stays
        if marks:
            out.append(f"{name}: faultline marks left {sorted(marks)}")
    listed = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
              for p in kube.pods.list_all(api, namespace=world.namespace)}  # fmt: skip
    for pod, node in world.pods.items():
        found = listed.get(pod)
        if node in fatal and found is not None:
            out.append(f"{node}: pod {pod} not drained")
        elif node not in fatal and (found is None or found["metadata"].get("deletionTimestamp")):
            out.append(f"{node}: pod {pod} moved though its node had no fatal fault")
    return out


def _store(world: World, st: store.Store) -> list[str]:
    out = []
    fatal = world.schedule.fatal
    faults = {str(d["_id"]): d for d in st.faults.find({"code": "XID-79"}, {"state": 1})}
    rounds: dict[str, list[dict[str, Any]]] = {}
    stages: dict[str, list[str]] = {}  # node -> where its repair's stages stand (said when one is stuck)
    for doc in st.repairs.find(
        {}, {"node": 1, "rounds": 1, store.Stage.REMEDIATION: 1, store.Stage.JANITOR: 1}
    ):
        rounds.setdefault(str(doc["node"]), []).extend(doc.get("rounds") or [])
        stages.setdefault(str(doc["node"]), []).extend(
            _stage(doc, s) for s in (store.Stage.REMEDIATION, store.Stage.JANITOR)
        )
    for doc in st.drains.find({}, {"node": 1, store.Stage.NODEDRAIN: 1}):
        stages.setdefault(str(doc.get("node")), []).insert(0, _stage(doc, store.Stage.NODEDRAIN))
    held = {str(d["_id"]) for d in st.nodes.find({"quarantined": True}, {"_id": 1})}
    for node in fatal:
        doc = faults.get(world.fatal_fault(node))
        if doc is None:
            out.append(f"{node}: its fatal fault is not stored")
        elif doc.get("state") != "resolved":
            out.append(f"{node}: its fatal fault is {doc.get('state')}")
        last = (rounds.get(node) or [{}])[-1]
        if last.get("outcome") != "Succeeded":
            where = "; ".join(stages.get(node) or ["no drain or repair document"])
            out.append(f"{node}: repair {last.get('step')} {last.get('outcome') or 'not finished'} ({where})")
    for node in held:
        out.append(f"{node}: still held by the quarantine worker")
    return out


def _stage(doc: dict[str, Any], stage: str) -> str:
    """One stage of a work document as a person reads it: state, holder, attempts, last error."""
    st = doc.get(stage) or {}
    parts = [f"{stage} {st.get('state', '-')}", f"attempts {st.get('attempts', 0)}"]
    if st.get("lease_owner"):
        parts.append(f"held by {st['lease_owner']}")
    if st.get("error"):
        parts.append(f"error {bounds.clip(str(st['error']), bounds.EXCERPT)}")
    return ", ".join(parts)


@dataclass
class Counts:
    """Actions beyond the truth, and their details (per node or pod, only where above the truth)."""

    cordons: int = 0
    evictions: int = 0
    jobs: int = 0
    cloud: int = 0
    requests: int = 0
    details: dict[str, dict[str, int]] = field(default_factory=dict)
    turns: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)  # of nodes cordoned too often


def duplicates(world: World, actions: audit.Actions, cloud_calls: list[tuple[str, str, str]]) -> Counts:
    fatal = world.schedule.fatal
    by_instance = {i: n for n, i in world.cloud_nodes.items()}
    cloud = Counter(by_instance.get(instance, instance) for _, _, instance in cloud_calls)
    requests = Counter(audit.repair_node(name) for name in actions.requests.elements())
    out = Counts()

    def extra(what: str, counted: Counter[str], expected: dict[str, int]) -> int:
        over = {k: n - expected.get(k, 0) for k, n in counted.items() if n > expected.get(k, 0)}
        if over:
            out.details[what] = over
        return sum(over.values())

    out.cordons = extra("cordons", actions.cordons, dict.fromkeys(fatal, 1))
    out.turns = {node: actions.turns.get(node, []) for node in out.details.get("cordons", {})}
    out.evictions = extra("evictions", actions.evictions, {p: 1 for p, n in world.pods.items() if n in fatal})
    out.jobs = extra("jobs", actions.jobs, {n: 1 for n in fatal if n not in world.cloud_nodes})
    out.cloud = extra("cloud calls", cloud, {n: 1 for n in fatal if n in world.cloud_nodes})
    out.requests = extra("requests", requests, dict.fromkeys(fatal, 1))
    return out


def missing_actions(
    world: World, actions: audit.Actions, cloud_calls: list[tuple[str, str, str]]
) -> list[str]:
    """Nodes given a fatal fault that were never cordoned or repaired (for the report)."""
    rebooted = {i for _, _, i in cloud_calls}
    out = []
    for node in world.schedule.fatal:
        if not actions.cordons.get(node):
            out.append(f"{node}: never cordoned")
        repaired = world.cloud_nodes.get(node) in rebooted or actions.jobs.get(node)
        if not repaired:
            out.append(f"{node}: never repaired")
    return out
