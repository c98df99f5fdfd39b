"""What a drain empties (pure): the whole node or only the pods of its faulty GPUs, and which pods it
leaves where they are.

System namespaces (`system_namespaces`, default `kube-system`; the chart adds its own namespace): their
pods are never evicted. DaemonSet, mirror and finished pods are left by the drainer before this module
is asked.

A partial drain (`partial_gpu_drain`, off by default) moves only the pods that use the faulty GPUs,
when every fault behind the node's quarantine names one GPU and needs at most a reset of it:
`PARTIAL_ACTIONS` are NONE, RESTART_APP (no node repair at all) and COMPONENT_RESET (whose first repair,
`workers.remedies`, is a reset of those GPUs). RESTART_VM, RESTART_BM, REPLACE_VM and CONTACT_SUPPORT
take the node down (or out), so any such fault drains the whole node. A COMPONENT_RESET that escalates
past the GPU reset (to REBOOT) needs the whole node too: remediation widens the drain first
(`Store.widen_drain`) and waits for it.

Which pods use which GPU comes from the node's agent (`GpuPods`, read from the kubelet's pod-resources
API). It counts only when read after the node was cordoned (its `episode` is this drain's): then no pod
can have been scheduled onto the GPU since. Until such a mapping exists the drain evicts nothing and
waits; past `partial_wait` it drains the whole node, and says why. A mapping that names GPU devices the
agent could not match to a GPU (MIG devices) cannot tell which pods use the faulty GPU: whole node.
Once a drain has gone to the whole node it stays there for its episode.

In a partial drain a pod is evicted when the mapping shows it on a faulty GPU, or when the mapping does
not name it but it asks for GPUs (it may have started after the read, or use a DRA claim the agent
does not read); it is left when the mapping shows it only on other GPUs, or it uses no GPU.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from faultline.models import Action

NODE, GPUS, WAIT = "node", "gpus", "wait"
PARTIAL_ACTIONS = frozenset({Action.NONE, Action.RESTART_APP, Action.COMPONENT_RESET})
GPU_ENTITY = "GPU"
NAMED_DEVICES = 4  # unmatched GPU devices named in the scope's reason (the rest are "...")
PodKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class FaultView:
    """A fault behind the quarantine, as far as the scope cares: where it is and what it needs."""

    code: str
    entity_type: str
    entity_id: str
    action: str


@dataclass(frozen=True)
class PodMap:
    """The node agent's mapping: for each pod, the GPUs (PCI bus ids) its containers were given; the
    quarantine episode it was read in; device ids it could not match to a GPU."""

    episode: dt.datetime | None
    uses: Mapping[PodKey, frozenset[str]]
    unmapped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scope:
    kind: str  # NODE | GPUS | WAIT (a partial drain waiting for the agent's mapping: evict nothing)
    reason: str
    gpus: frozenset[str] = frozenset()
    uses: Mapping[PodKey, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    asks_gpus: bool  # requests nvidia.com/* resources, or has resource claims (DRA)


def decide(
    *, partial: bool, faults: Iterable[FaultView], mapping: PodMap | None, episode: dt.datetime | None,
    waited_out: bool, previous: str | None = None, previous_reason: str | None = None,
) -> Scope:  # fmt: skip
    """The drain's scope for its episode now. `waited_out`: the drain has waited `partial_wait` for a
    mapping; `previous`: the scope recorded before (a drain that went to the whole node stays there)."""
    if previous == NODE:
        return Scope(NODE, previous_reason or "the whole node")
    if not partial:
        return Scope(NODE, "partial GPU drains are off")
    faults = list(faults)
    if not faults:
        return Scope(NODE, "no fault behind the quarantine names a GPU")
    for f in faults:
        if f.entity_type != GPU_ENTITY or not f.entity_id:
            where = f"{f.entity_type} {f.entity_id}".strip()
            return Scope(NODE, f"fault {f.code} is on {where or 'the node'}, not on one GPU")
        if f.action not in PARTIAL_ACTIONS:
            return Scope(NODE, f"fault {f.code} on GPU {f.entity_id} needs {f.action}: the whole node")
    gpus = frozenset(f.entity_id for f in faults)

    def not_yet(why: str) -> Scope:
        if waited_out:
            return Scope(NODE, f"{why} within the partial drain's wait: the whole node")
        return Scope(WAIT, f"{why}: waiting for the node's agent")

    if mapping is None:
        return not_yet("no GPU -> pod mapping from the node's agent")
    if mapping.episode is None or episode is None or mapping.episode != episode:
        return not_yet("no GPU -> pod mapping read since the node was cordoned")
    if mapping.unmapped:
        more = " ..." if len(mapping.unmapped) > NAMED_DEVICES else ""
        devices = ", ".join(mapping.unmapped[:NAMED_DEVICES]) + more
        return Scope(NODE, f"GPU devices the agent could not match to a GPU ({devices}): the whole node")
    worst = max((Action(f.action) for f in faults), key=list(Action).index)
    return Scope(GPUS, f"only the pods of GPU {', '.join(sorted(gpus))} (the faults need {worst.value})",
                 gpus, dict(mapping.uses))  # fmt: skip


def skip_reason(pod: PodView, scope: Scope, system_namespaces: frozenset[str]) -> str | None:
    """Why the drain leaves this pod where it is; None: it is the drain's to move (in a WAIT scope,
    once the mapping says so)."""
    if pod.namespace in system_namespaces:
        return f"system namespace {pod.namespace}"
    if scope.kind != GPUS:
        return None
    used = scope.uses.get((pod.namespace, pod.name))
    if used is None:
        return None if pod.asks_gpus else "uses no GPU (partial drain)"
    if used & scope.gpus:
        return None
    faulty = ", ".join(sorted(scope.gpus))
    return f"uses GPU {', '.join(sorted(used))}, not the faulty {faulty} (partial drain)"


def pod_map(episode: dt.datetime | None, assignments: Iterable[tuple[str, str, str]],
            unmapped: Iterable[str] = ()) -> PodMap:  # fmt: skip
    """A PodMap from (GPU, namespace, pod) rows."""
    uses: dict[PodKey, set[str]] = {}
    for gpu, namespace, pod in assignments:
        uses.setdefault((namespace, pod), set()).add(gpu)
    return PodMap(episode, {k: frozenset(v) for k, v in uses.items()}, tuple(sorted(set(unmapped))))
