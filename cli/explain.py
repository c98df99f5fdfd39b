"""`faultline explain NODE`: why faultline holds a node (or does not), in one screen, from the store and the
cluster: the node's marks, each fault with its evidence and the quarantine's decision on it, the breaker,
the drain's scope, the repair rounds, what comes next, and what a person can do now (as commands).

`gather` builds one plain document (what `-o json|yaml` prints); `render` writes it for people.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from faultline import kube, store
from faultline.conditions import OWNED_TYPES
from faultline.errors import NotFoundError
from faultline.models import Action, Component, utc_text
from workers import rules

PREFIX = "faultline.io/"
EVIDENCE = 5  # matched lines or samples shown per fault (the newest)
RESOLVED_SHOWN = 5  # resolved faults shown after the open ones (the newest)
REQUEST = """kubectl create -f - <<'EOF'
apiVersion: faultline.io/v1alpha1
kind: RemediationRequest
metadata: {{generateName: {node}-, annotations: {{faultline.io/requested-by: <you>}}}}
spec: {{node: {node}, action: REBOOT, reason: <why>}}
EOF"""


def gather(st: store.Store, api: Any, node: str, quarantine_rules: Iterable[rules.Rule]) -> dict[str, Any]:
    """Everything `explain` shows about `node`, as JSON-able data."""
    obj = _node(api, node)
    labels = dict((obj or {}).get("metadata", {}).get("labels") or {})
    hold = st.hold(node)
    brk = st.breaker()
    records = st.faults_of([node], store.Stage.QUARANTINE).get(node, [])
    open_ = sorted((r for r in records if r.state == "open"), key=lambda r: (not r.fatal, r.first_seen))
    resolved = sorted((r for r in records if r.state != "open"), key=lambda r: r.resolved_at or r.last_seen)
    rule_list = list(quarantine_rules)
    faults = [_fault(st, r, rule_list, labels) for r in open_ + resolved[::-1][:RESOLVED_SHOWN]]
    drain = st.drain(node)
    repairs = sorted(
        st.repairs_of(node), key=lambda r: r.first_seen or dt.datetime.min.replace(tzinfo=dt.UTC)
    )
    parked = [p for p in st.parked() if p.node == node]
    out: dict[str, Any] = {
        "node": node,
        "exists": obj is not None,
        "kubernetes": _marks(obj) if obj is not None else None,
        "held": bool(hold and hold.quarantined),
        "hold": None
        if hold is None
        else {
            "quarantined": hold.quarantined,
            "quarantined_at": _t(hold.quarantined_at),
            "released_at": _t(hold.released_at),
            "faults": list(hold.faults),
            "checked_at": _t(hold.checked_at),
        },
        "breaker": {"state": brk.state, "since": _t(brk.since), "reason": brk.reason},
        "faults": faults,
        "drain": None if drain is None else _drain(drain),
        "repairs": [_repair(r) for r in repairs],
        "rma": [
            {"id": b["_id"], "step": b.get("step"), "created_at": _t(b.get("created_at"))}
            for b in st.rma_bundles(node=node)
        ],
        "parked": [
            {
                "stage": str(p.stage),
                "item": p.item,
                "attempts": p.attempts,
                "reason": p.reason,
                "at": _t(p.at),
            }
            for p in parked
        ],
    }
    out["next"] = _next(out)
    out["actions"] = _actions(out)
    return out


def _node(api: Any, node: str) -> dict[str, Any] | None:
    try:
        return kube.nodes.read(api, node)
    except NotFoundError:
        return None


def _marks(obj: dict[str, Any]) -> dict[str, Any]:
    meta, spec = obj.get("metadata", {}), obj.get("spec", {})
    return {
        "cordoned": bool(spec.get("unschedulable")),
        "taints": [
            f"{t['key']}={t.get('value', '')}:{t['effect']}"
            for t in spec.get("taints") or []
            if t["key"].startswith(PREFIX)
        ],
        "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith(PREFIX)},
        "annotations": {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(PREFIX)},
        "conditions": [
            {
                "type": c.get("type"),
                "status": c.get("status"),
                "reason": c.get("reason", ""),
                "message": c.get("message", ""),
            }
            for c in (obj.get("status", {}).get("conditions") or [])
            if c.get("type") in OWNED_TYPES
        ],
    }


def _fault(
    st: store.Store, r: store.FaultRecord, rule_list: list[rules.Rule], labels: dict[str, str]
) -> dict[str, Any]:
    view = rules.OpenFault(r.id, r.code, Component(r.component), Action(r.action), r.fatal, r.count)
    events = st.events_of(r.node, r.code, r.entity.id, EVIDENCE)
    return {
        "id": r.id,
        "code": r.code,
        "entity": {"type": r.entity.type, "id": r.entity.id},
        "component": r.component,
        "fatal": r.fatal,
        "action": r.action,
        "state": r.state,
        "count": r.count,
        "first_seen": _t(r.first_seen),
        "last_seen": _t(r.last_seen),
        "resolved_at": _t(r.resolved_at),
        "resolved_by": r.resolved_by,
        "message": r.message,
        "pattern": r.pattern,
        "source": r.metadata.get("source", "agent"),
        "quarantine": None
        if r.work is None
        else {
            "state": str(r.work.state),
            "attempts": r.work.attempts,
            "error": r.work.error,
        },
        "rules": [rule.name for rule in rule_list if rules.matches(rule, view, labels)]
        if r.state == "open"
        else [],
        "evidence": [
            {
                "observed_at": _t(e.get("observed_at")),
                "check": e.get("check", ""),
                "message": e.get("message", ""),
                "healthy": bool(e.get("healthy")),
            }
            for e in events
        ],
    }


def _drain(d: store.Drain) -> dict[str, Any]:
    pods = sorted(d.pods.values(), key=lambda p: (p.namespace, p.name))
    return {
        "state": str(d.nodedrain.state),
        "scope": d.scope,
        "gpus": list(d.gpus),
        "scope_reason": d.scope_reason,
        "started_at": _t(d.started_at),
        "drained_at": _t(d.drained_at),
        "result": d.result,
        "pods": [
            {
                "namespace": p.namespace,
                "name": p.name,
                "mode": p.mode,
                "skipped": p.skipped,
                "evicted": p.evicted,
                "deleted": p.deleted_at is not None,
            }
            for p in pods
        ],
    }


def _repair(r: store.Repair) -> dict[str, Any]:
    return {
        "id": r.id,
        "episode": _t(r.episode),
        "result": r.result,
        "requested_by": r.user.by if r.user is not None else None,
        "remediation": str(r.remediation.state),
        "janitor": str(r.janitor.state),
        "error": r.janitor.error or r.remediation.error,
        "rounds": [
            {
                "step": str(x.step),
                "request": x.request,
                "gpus": list(x.gpus),
                "reason": x.reason,
                "requested_at": _t(x.requested_at),
                "started_at": _t(x.started_at),
                "validate_until": _t(x.validate_until),
                "outcome": None if x.outcome is None else str(x.outcome),
                "at": _t(x.at),
                "message": x.message,
            }
            for x in r.rounds
        ],
    }


def _next(e: dict[str, Any]) -> str:
    """What happens next on its own (or why nothing will), from the stored state."""
    open_ = [f for f in e["faults"] if f["state"] == "open"]
    marks = e["kubernetes"] or {}
    if not e["exists"]:
        return "the Node does not exist (any faults of it are kept until they resolve or age out)"
    if (
        "faultline.io/managed" in marks.get("labels", {})
        and marks["labels"]["faultline.io/managed"] == "false"
    ):
        return "nothing: the node is opted out (label faultline.io/managed=false)"
    if "faultline.io/paused-until" in marks.get("annotations", {}):
        return f"nothing until {marks['annotations']['faultline.io/paused-until']} (paused)"
    if e["parked"]:
        return "nothing on its own: work is parked and waits for a person (see `parked`)"
    blocked = [f for f in open_ if (f["quarantine"] or {}).get("state") == "blocked"]
    if blocked and not e["held"]:
        return (
            "quarantine waits for the circuit breaker: `faultline breaker reset` once its cause is understood"
        )
    if not e["held"]:
        if open_:
            return (
                "watched: its open faults match no quarantine rule"
                if not any(f["rules"] for f in open_)
                else "quarantine on the next claim or resync pass"
            )
        return "nothing: no open fault and not held"
    repairs = e["repairs"]
    last = repairs[-1] if repairs else None
    if last is not None and last["rounds"]:
        current = last["rounds"][-1]
        if current["outcome"] is None:
            if current["validate_until"]:
                return f"validating {current['step']} until {current['validate_until']}, then release"
            if current["started_at"]:
                return f"the janitor is carrying out {current['step']} ({current['request']})"
            return f"the janitor starts {current['step']} ({current['request']})"
        if current["outcome"] == "ContactSupport" or current["step"] == "CONTACT_SUPPORT":
            return "waiting for a person (CONTACT_SUPPORT): fix the node, then release it"
        if current["outcome"] != "Succeeded":
            step, outcome = current["step"], current["outcome"]
            return f"{step} ended {outcome}: remediation decides the next round (escalation)"
        return "repaired: released once the faults clear and the hold-down passes"
    drain = e["drain"]
    if drain is not None and drain["result"] != "drained":
        left = [p for p in drain["pods"] if not p["skipped"] and not p["deleted"]]
        return f"draining ({len(left)} pods left)"
    if not open_:
        return "released after the hold-down (every fault resolved)"
    return "held; remediation decides a repair once the node is drained (if remediation is on)"


def _actions(e: dict[str, Any]) -> list[dict[str, str]]:
    """What a person can do now, as commands."""
    node = e["node"]
    out: list[dict[str, str]] = []
    if not e["exists"]:
        return out
    in_hour = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    if e["held"] or (e["kubernetes"] or {}).get("cordoned"):
        out.append(
            {
                "what": "release (cancels faultline's quarantine for the open faults)",
                "command": f"kubectl uncordon {node}",
            }
        )
    out.append(
        {
            "what": "pause faultline on this node for an hour",
            "command": f"kubectl annotate node {node} faultline.io/paused-until={in_hour}",
        }
    )
    if not e["held"]:
        out.append(
            {
                "what": "quarantine it now (drained; no repair follows)",
                "command": f"kubectl label node {node} faultline.io/force-quarantine=<reason>",
            }
        )
    out.append(
        {
            "what": "request a repair (the janitor adopts it; drain first)",
            "command": REQUEST.format(node=node),
        }
    )
    if e["breaker"]["state"] == "open":
        out.append(
            {
                "what": "reset the tripped circuit breaker (once its cause is understood)",
                "command": "faultline breaker reset --reason <why>",
            }
        )
    return out


def timestamp(value: Any) -> str | None:
    if isinstance(value, dt.datetime):
        return utc_text(value, seconds=True)
    return None if value is None else str(value)


_t = timestamp


# -- for people ---------------------------------------------------------------------------------------------
def render(e: dict[str, Any]) -> str:
    lines = [f"node {e['node']}: " + ("held by faultline" if e["held"] else "not held by faultline")]
    k = e["kubernetes"]
    if k is None:
        lines.append("  the Node does not exist")
    else:
        lines.append(
            f"  cordoned: {'yes' if k['cordoned'] else 'no'}"
            + (f"; taints: {', '.join(k['taints'])}" if k["taints"] else "")
        )
        lines += [f"  label {n}={v}" for n, v in sorted(k["labels"].items())]
        lines += [f"  annotation {n}={_short(v)}" for n, v in sorted(k["annotations"].items())]
        lines += [
            f"  condition {c['type']}={c['status']} {c['reason']}: {_short(c['message'])}"
            for c in k["conditions"]
        ]
    hold = e["hold"]
    if hold and hold["quarantined"]:
        lines.append(f"  quarantined at {hold['quarantined_at']} for {len(hold['faults'])} fault(s)")
    brk = e["breaker"]
    lines.append(
        f"circuit breaker: {brk['state']}"
        + (f" since {brk['since']} ({brk['reason']})" if brk["since"] else "")
    )
    lines.append("")
    lines.append(
        f"faults ({sum(f['state'] == 'open' for f in e['faults'])} open):" if e["faults"] else "faults: none"
    )
    for f in e["faults"]:
        ent = f"{f['entity']['type']} {f['entity']['id']}".strip()
        verdict = f"{'fatal' if f['fatal'] else 'not fatal'}, {f['action']}"
        lines.append(
            f"  {f['state'].upper():8} {f['code']} on {ent} ({verdict}); {f['count']}x, "
            f"first {f['first_seen']}, last {f['last_seen']}; from {f['source']}"
            + (f" pattern {f['pattern']}" if f["pattern"] else "")
        )
        if f["message"]:
            lines.append(f"           {_short(f['message'], 100)}")
        q = f["quarantine"]
        if f["state"] == "open":
            rule_text = ", ".join(f["rules"]) or "none (watched only)"
            lines.append(
                f"           rules: {rule_text}; quarantine: {q['state'] if q else 'no work item'}"
                + (f" ({_short(q['error'])})" if q and q["error"] else "")
            )
        else:
            lines.append(
                f"           resolved {f['resolved_at']}"
                + (f" by {f['resolved_by']}" if f["resolved_by"] else "")
            )
        for ev in f["evidence"]:
            lines.append(f"           {ev['observed_at']}  {_short(ev['message'] or ev['check'], 100)}")
    d = e["drain"]
    if d is not None:
        moved = [p for p in d["pods"] if not p["skipped"]]
        scope = "node" if d["scope"] in (None, "node") else f"GPUs {', '.join(d['gpus'])}"
        lines += [
            "",
            f"drain: {d['state']}, scope {scope}"
            + (f" ({d['scope_reason']})" if d["scope_reason"] else "")
            + (f", result {d['result']}" if d["result"] else "")
            + f"; {len(moved)} pod(s) to move",
        ]
        for p in d["pods"]:
            what = (
                f"skipped: {p['skipped']}"
                if p["skipped"]
                else ("deleted" if p["deleted"] else "evicted" if p["evicted"] else "waiting")
            )
            lines.append(f"  {p['namespace']}/{p['name']} ({p['mode'] or '-'}): {what}")
    for r in e["repairs"]:
        who = f", requested by {r['requested_by']}" if r["requested_by"] else ""
        lines += [
            "",
            f"repair {r['id']}: remediation {r['remediation']}, janitor {r['janitor']}"
            + (f", result {r['result']}" if r["result"] else "")
            + who,
        ]
        for x in r["rounds"]:
            end = (
                f"{x['outcome']} at {x['at']}" + (f": {_short(x['message'])}" if x["message"] else "")
                if x["outcome"]
                else (
                    f"validating until {x['validate_until']}"
                    if x["validate_until"]
                    else "started"
                    if x["started_at"]
                    else "requested"
                )
            )
            lines.append(f"  {x['step']} ({x['request']}): {end}")
    for b in e["rma"]:
        lines.append(f"RMA evidence {b['id']} ({b['step']}, {b['created_at']}): faultline rma {e['node']}")
    for p in e["parked"]:
        lines.append(
            f"parked: {p['stage']} {p['item']} after {p['attempts']} attempts: {_short(p['reason'])}"
        )
    lines += ["", f"next: {e['next']}"]
    if e["actions"]:
        lines.append("what you can do:")
        for a in e["actions"]:
            lines.append(f"  {a['what']}:")
            lines += [f"    {line}" for line in a["command"].splitlines()]
    return "\n".join(lines) + "\n"


def _short(text: str | None, width: int = 80) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 3] + "..."
