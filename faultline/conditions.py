"""Node conditions and Events from a node's open faults (pure logic; `faultline.kube.nodes` and the agent's
`faultline.kube.lite` apply them).

One condition per component class (`GpuHealthy`, `NvSwitchHealthy`, `NicHealthy`, `NodeHealthy`):
False while an open fault of that class is fatal, True otherwise. `GpuMonitorHealthy` is False while
the GPU monitor itself cannot read the GPUs (any open MONITOR fault). The reason is the code of the most
severe open fault (or `NoFaults`), and the message names the faults, bounded in length. A condition
faultline set is set back to True when its faults resolve; a condition type faultline owns but no
longer produces (a check that was removed) is deleted.

Freshness: the agent publishes its conditions when it starts (True, `NoFaults`, on a healthy node) and
rewrites each at least every `HEARTBEAT_S` (its `lastHeartbeatTime`), even when nothing changed, so a
condition's age says whether its agent is alive. `stale` finds the conditions whose agent has not
reported for longer than a configured time: the quarantine worker sets them `Unknown`
(`AgentNotReporting`), as the node controller does with the kubelet's; the agent's next report sets
them back. `faultline uninstall` removes them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from faultline.models import Action, Component, Fault

CONDITION_TYPES = {
    Component.GPU: "GpuHealthy",
    Component.NVSWITCH: "NvSwitchHealthy",
    Component.NIC: "NicHealthy",
    Component.NODE: "NodeHealthy",
    Component.MONITOR: "GpuMonitorHealthy",  # faultline's own view of the GPUs, not the GPUs' health
}
OWNED_TYPES = frozenset(CONDITION_TYPES.values())
MESSAGE_LIMIT = 512  # characters of a condition's message: no API limit, but `kubectl describe node` shows it
HEARTBEAT_S = 240.0  # rewrite a condition older than this (the detector re-sends the state every 60 s)
STALE_REASON = "AgentNotReporting"
_SEVERITY = {a: i for i, a in enumerate(Action)}


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False"
    reason: str
    message: str

    def as_patch(self, now: dt.datetime, transitioned: bool) -> dict[str, str]:
        stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"type": self.type, "status": self.status, "reason": self.reason, "message": self.message,
                "lastHeartbeatTime": stamp}  # fmt: skip
        if transitioned:
            body["lastTransitionTime"] = stamp
        return body


def _describe(fault: Fault, gpu_names: dict[str, str]) -> str:
    entity = fault.entity.id
    if fault.entity.type == "GPU" and entity in gpu_names:
        entity = f"{gpu_names[entity]} ({entity})"
    elif entity:
        entity = f"{fault.entity.type.lower()} {entity}"
    else:
        entity = "node"
    return f"{fault.code} on {entity} x{fault.count}" + (" (fatal)" if fault.fatal else "")


def desired(
    faults: Iterable[Fault], gpu_names: dict[str, str] | None = None, types: Iterable[str] = OWNED_TYPES
) -> dict[str, Condition]:
    """The conditions a node should carry given its faults (resolved ones are ignored).

    `types` are the condition types of the checks this node runs; `gpu_names` maps a GPU PCI bus id to a
    label such as `GPU 3 GPU-5c2b...` for messages.
    """
    names = gpu_names or {}
    open_by_type: dict[str, list[Fault]] = {t: [] for t in types}
    for fault in faults:
        ctype = CONDITION_TYPES.get(fault.component, "NodeHealthy")
        if fault.resolved_at is None and ctype in open_by_type:
            open_by_type[ctype].append(fault)
    out: dict[str, Condition] = {}
    for ctype, items in open_by_type.items():
        if not items:
            out[ctype] = Condition(ctype, "True", "NoFaults", "no open faults")
            continue
        items.sort(key=lambda f: (not f.fatal, -_SEVERITY[f.action], f.code, f.entity.id))
        worst = items[0]
        bad = worst.fatal or ctype == CONDITION_TYPES[Component.MONITOR]  # any monitor problem is one
        message = "; ".join(_describe(f, names) for f in items)
        if len(message) > MESSAGE_LIMIT:
            message = message[: MESSAGE_LIMIT - 20].rsplit("; ", 1)[0] + f"; and {len(items)} in all"
        out[ctype] = Condition(
            ctype, "False" if bad else "True", worst.code if bad else "NonFatalFaults", message
        )
    return out


def _age(cur: dict[str, str], now: dt.datetime) -> float | None:
    """Seconds since the condition's lastHeartbeatTime (None: absent or not a time)."""
    try:
        beat = dt.datetime.fromisoformat(cur.get("lastHeartbeatTime", "").replace("Z", "+00:00"))
    except ValueError:
        return None
    return (now - beat).total_seconds() if beat.tzinfo is not None else None


def diff(
    current: dict[str, dict[str, str]], wanted: dict[str, Condition], now: dt.datetime | None = None
) -> tuple[list[Condition], list[str]]:
    """(conditions to write because they changed, or, given `now`, because their heartbeat is older than
    HEARTBEAT_S; owned condition types to delete)."""

    def due(cur: dict[str, str] | None, c: Condition) -> bool:
        if cur is None or (cur.get("status"), cur.get("reason"), cur.get("message")) != (
            c.status, c.reason, c.message,
        ):  # fmt: skip
            return True
        if now is None or not cur.get("lastHeartbeatTime"):
            return False
        age = _age(cur, now)
        return age is None or age >= HEARTBEAT_S

    changed = [c for t, c in wanted.items() if due(current.get(t), c)]
    stale = sorted(t for t in current if t in OWNED_TYPES and t not in wanted)
    return changed, stale


def changes(
    current: dict[str, dict[str, str]], wanted: dict[str, Condition], now: dt.datetime
) -> tuple[list[dict[str, str]], list[str]]:
    """What brings a node's `current` conditions to `wanted`: the condition patches to write (a transition
    time only where the status changes) and the owned types to delete. Both Kubernetes transports use it."""
    changed, gone = diff(current, wanted, now)
    return [c.as_patch(now, current.get(c.type, {}).get("status") != c.status) for c in changed], gone


def stale(current: dict[str, dict[str, str]], now: dt.datetime, after: dt.timedelta) -> list[dict[str, str]]:
    """The patches that set faultline's conditions to Unknown where the agent has not reported for
    `after` (their heartbeat is kept: it says when the agent last reported)."""
    out = []
    for ctype, cur in sorted(current.items()):
        if ctype not in OWNED_TYPES or cur.get("status") == "Unknown":
            continue
        age = _age(cur, now)
        if age is None or age < after.total_seconds():
            continue
        stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        was = f"{cur.get('status')} ({cur.get('reason')})"
        message = f"the faultline agent has not reported since {cur['lastHeartbeatTime']}; it last said {was}"
        out.append({"type": ctype, "status": "Unknown", "reason": STALE_REASON,
                    "message": message[:MESSAGE_LIMIT], "lastHeartbeatTime": cur["lastHeartbeatTime"],
                    "lastTransitionTime": stamp})  # fmt: skip
    return out


class EventLimiter:
    """At most one Event per (node, reason) per `interval` seconds (event time, injected)."""

    def __init__(self, interval: float = 60.0) -> None:
        self.interval = interval
        self._last: dict[tuple[str, str], float] = {}

    def would_allow(self, node: str, reason: str, now: float) -> bool:
        last = self._last.get((node, reason))
        return last is None or now - last >= self.interval

    def allow(self, node: str, reason: str, now: float) -> bool:
        last = self._last.get((node, reason))
        if last is not None and now - last < self.interval:
            return False
        self._last[(node, reason)] = now
        return True
