"""The actions counted from the API server's audit log: ground truth that no worker reports itself.

The policy logs only what the suite counts: writes to Nodes (with the object as stored, to follow
`spec.unschedulable` in resourceVersion order), Eviction calls, and creations of Jobs and
RemediationRequests. Node status (the kubelets' and agents' heartbeats and conditions) is a
subresource and stays out. The log is read from an offset taken when a scenario starts; the API server
appends to it across restarts (blocking mode: an event is written before its answer is sent).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "RequestResponse", "verbs": ["create", "update", "patch"],
         "resources": [{"group": "", "resources": ["nodes"]}]},
        {"level": "Metadata", "verbs": ["create"],
         "resources": [{"group": "", "resources": ["pods/eviction"]},
                       {"group": "batch", "resources": ["jobs"]},
                       {"group": "faultline.io", "resources": ["remediationrequests"]}]},
        {"level": "None"},
    ],
}  # fmt: skip


@dataclass
class Actions:
    """What the API server carried out, from the audit log: only successful calls count."""

    cordons: Counter[str] = field(default_factory=Counter)  # node -> schedulable -> unschedulable turns
    uncordons: Counter[str] = field(default_factory=Counter)
    evictions: Counter[str] = field(default_factory=Counter)  # namespace/pod -> evictions accepted
    jobs: Counter[str] = field(default_factory=Counter)  # node -> repair Jobs created
    requests: Counter[str] = field(default_factory=Counter)  # RemediationRequest name -> created
    unreadable: int = 0
    # node -> its turns in resourceVersion order: (when, "cordon" | "uncordon", who: user and user agent)
    turns: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)


def offset(path: Path) -> int:
    """Where the log ends now (a scenario counts from here)."""
    return path.stat().st_size if path.exists() else 0


def repair_node(name: str) -> str:
    """The node of a repair Job or RemediationRequest, from its name `<node>-<digest>-<round>`."""
    return name.rsplit("-", 2)[0]


def read(path: Path, start: int, cordoned: dict[str, bool]) -> Actions:
    """The actions logged since `start`; `cordoned`: each node's state at `start`."""
    out = Actions()
    nodes: dict[str, list[tuple[int, bool, str, str]]] = {}
    with path.open("rb") as fh:
        fh.seek(start)
        for raw in fh:
            try:
                event = json.loads(raw)
            except ValueError:
                out.unreadable += 1  # a line torn by an API server killed mid-write
                continue
            if event.get("stage") != "ResponseComplete":
                continue
            code = int((event.get("responseStatus") or {}).get("code", 0))
            if not 200 <= code < 300:
                continue
            ref = event.get("objectRef") or {}
            resource, sub = ref.get("resource"), ref.get("subresource")
            if resource == "nodes" and not sub:
                obj = event.get("responseObject") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version is not None:
                    state = bool((obj.get("spec") or {}).get("unschedulable"))
                    who = f"{(event.get('user') or {}).get('username', '?')} ({event.get('userAgent', '?')})"
                    at = str(event.get("stageTimestamp", "?"))
                    nodes.setdefault(str(ref.get("name")), []).append((int(version), state, at, who))
            elif resource == "pods" and sub == "eviction":
                out.evictions[f"{ref.get('namespace')}/{ref.get('name')}"] += 1
            elif resource == "jobs" and event.get("verb") == "create":
                out.jobs[repair_node(str(ref.get("name")))] += 1
            elif resource == "remediationrequests" and event.get("verb") == "create":
                out.requests[str(ref.get("name"))] += 1
    for node, writes in nodes.items():
        state = cordoned.get(node, False)
        for _, now, at, who in sorted(writes):
            if now and not state:
                out.cordons[node] += 1
                out.turns.setdefault(node, []).append((at, "cordon", who))
            elif state and not now:
                out.uncordons[node] += 1
                out.turns.setdefault(node, []).append((at, "uncordon", who))
            state = now
    return out
