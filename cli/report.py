"""`faultline report`: the fleet's reliability over a window, from the store: faults by code, GPU model and
node; time to detect, to quarantine and to release (p50/p90); time out of service; repair success per
action; GPUs that keep failing, followed by serial number across nodes; and candidates for RMA.

`build` makes one plain document (what `-o json` prints); `table` and `rows` (`-o csv`) write it.

What is measured, and from what:
- time to detect: a fault's first health event, from when the line or sample was observed to when the agent
  made the event (`generated_at - observed_at`);
- time to quarantine: an episode's cordon, from the first sighting of the faults behind it;
- time to release: an episode's release, from its cordon (episodes still open are left out; their time
  counts in time out of service);
- time out of service: the hours nodes were held within the window;
- a GPU is followed by its serial number (its UUID where the driver gives none, else node and PCI address):
  the same board moved to another node is the same GPU.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter, defaultdict
from typing import Any

from faultline import store
from faultline.models import RepairOutcome, RepairStep, utc_text

RMA_STEPS = {RepairStep.REPLACE.value, RepairStep.CONTACT_SUPPORT.value}


def build(st: store.Store, now: dt.datetime, window: dt.timedelta, *, repeat: int = 2) -> dict[str, Any]:
    """The report of the `window` before `now`; a GPU with `repeat` or more faults in it is a repeat
    offender."""
    since = now - window
    faults = [f for f in st.faults_seen_since(since) if f.first_seen >= since]
    gpus = st.gpus()
    by_place = {(g.node, g.pci): g for g in gpus}
    serial_nodes: defaultdict[str, set[str]] = defaultdict(set)
    for g in gpus:
        serial_nodes[_gpu_key(g, g.node, g.pci)].add(g.node)

    by_code, by_node, by_model = Counter[str](), Counter[str](), Counter[str]()
    per_gpu: defaultdict[str, list[store.FaultRecord]] = defaultdict(list)
    for f in faults:
        by_code[f.code] += 1
        by_node[f.node] += 1
        if f.entity.type == "GPU":
            ident = by_place.get((f.node, f.entity.id))
            by_model[ident.model if ident is not None and ident.model else "unknown"] += 1
            per_gpu[_gpu_key(ident, f.node, f.entity.id)].append(f)

    firsts = st.first_events((f.node, f.code) for f in faults)
    detect = [
        _seconds(e["generated_at"], e["observed_at"])
        for e in firsts.values()
        if e.get("generated_at") and e.get("observed_at")
    ]
    episodes = st.episodes_since(since)
    to_quarantine = [
        _seconds(e.quarantined_at, e.first_seen)
        for e in episodes
        if e.first_seen is not None and e.quarantined_at >= since
    ]
    to_release = [_seconds(e.released_at, e.quarantined_at) for e in episodes if e.released_at is not None]
    held_s = sum(
        max(0.0, _seconds(min(e.released_at or now, now), max(e.quarantined_at, since))) for e in episodes
    )

    repairs = st.repairs_since(since)
    steps: dict[str, Counter[str]] = {}
    rma_by_repair: defaultdict[str, list[str]] = defaultdict(list)
    for r in repairs:
        for rnd in r.rounds:
            if rnd.requested_at is not None and rnd.requested_at < since:
                continue
            steps.setdefault(str(rnd.step), Counter())[str(rnd.outcome) if rnd.outcome else "InProgress"] += 1
            if str(rnd.step) in RMA_STEPS or rnd.outcome == RepairOutcome.CONTACT_SUPPORT:
                for pci in rnd.gpus:
                    rma_by_repair[_gpu_key(by_place.get((r.node, pci)), r.node, pci)].append(
                        f"{rnd.step} on {r.node} ({rnd.request})"
                    )

    offenders, candidates = [], []
    for key, found in sorted(per_gpu.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        nodes = sorted({f.node for f in found} | serial_nodes.get(key, set()))
        fault_nodes = sorted({f.node for f in found})
        ident = next(
            (by_place.get((f.node, f.entity.id)) for f in found if (f.node, f.entity.id) in by_place), None
        )
        row = {
            "gpu": key,
            "serial": ident.serial if ident else "",
            "uuid": ident.uuid if ident else "",
            "model": ident.model if ident else "",
            "faults": len(found),
            "fatal": sum(f.fatal for f in found),
            "codes": sorted({f.code for f in found}),
            "nodes": nodes,
            "faulted_on": fault_nodes,
        }
        if len(found) >= repeat:
            offenders.append(row)
        reasons = []
        if len(found) >= repeat and row["fatal"]:
            reasons.append(f"{len(found)} faults in the window, {row['fatal']} fatal")
        if len(fault_nodes) > 1:
            reasons.append(f"faulted on {len(fault_nodes)} nodes: {', '.join(fault_nodes)}")
        reasons += [f"repair asked for {x}" for x in rma_by_repair.pop(key, [])]
        if reasons:
            candidates.append({**row, "reasons": reasons})
    for key, why in sorted(rma_by_repair.items()):  # named by a repair, with no fault in the window
        candidates.append(
            {
                "gpu": key,
                "serial": "",
                "uuid": "",
                "model": "",
                "faults": 0,
                "fatal": 0,
                "codes": [],
                "nodes": [],
                "faulted_on": [],
                "reasons": [f"repair asked for {x}" for x in why],
            }
        )

    return {
        "window": {"since": _iso(since), "until": _iso(now), "seconds": window.total_seconds()},
        "faults": {
            "total": len(faults),
            "fatal": sum(f.fatal for f in faults),
            "by_code": dict(by_code.most_common()),
            "by_gpu_model": dict(by_model.most_common()),
            "by_node": dict(by_node.most_common()),
        },
        "time_to_detect_s": _quantiles(detect),
        "time_to_quarantine_s": _quantiles(to_quarantine),
        "time_to_release_s": _quantiles(to_release),
        "out_of_service": {
            "episodes": len(episodes),
            "node_hours": round(held_s / 3600, 3),
            "nodes": len({e.node for e in episodes}),
        },
        "repairs": {
            step: {
                "rounds": sum(c.values()),
                "succeeded": c.get(RepairOutcome.SUCCEEDED.value, 0),
                "success_rate": _rate(c),
                "outcomes": dict(sorted(c.items())),
            }
            for step, c in sorted(steps.items())
        },
        "repeat_offenders": offenders,
        "rma_candidates": candidates,
    }


def rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The report as (measure, dimension, value) rows: one CSV a spreadsheet reads whole."""
    out: list[tuple[str, str, str]] = [
        ("window_since", "", report["window"]["since"]),
        ("window_until", "", report["window"]["until"]),
    ]
    f = report["faults"]
    out += [("faults", "", str(f["total"])), ("faults_fatal", "", str(f["fatal"]))]
    for name in ("by_code", "by_gpu_model", "by_node"):
        out += [(f"faults_{name}", k, str(v)) for k, v in f[name].items()]
    for name in ("time_to_detect_s", "time_to_quarantine_s", "time_to_release_s"):
        q = report[name]
        out += [(name, k, "" if q[k] is None else str(q[k])) for k in ("count", "p50", "p90")]
    oos = report["out_of_service"]
    out += [("out_of_service", k, str(v)) for k, v in oos.items()]
    for step, r in report["repairs"].items():
        out += [
            ("repair_rounds", step, str(r["rounds"])),
            ("repair_succeeded", step, str(r["succeeded"])),
            ("repair_success_rate", step, "" if r["success_rate"] is None else str(r["success_rate"])),
        ]
    out += [("repeat_offender_faults", o["gpu"], str(o["faults"])) for o in report["repeat_offenders"]]
    out += [("rma_candidate", c["gpu"], "; ".join(c["reasons"])) for c in report["rma_candidates"]]
    return out


def table(report: dict[str, Any]) -> str:
    """The report for people."""
    w, f = report["window"], report["faults"]
    lines = [f"fleet report {w['since']} .. {w['until']}", "", f"faults: {f['total']} ({f['fatal']} fatal)"]
    for title, name in (("by code", "by_code"), ("by GPU model", "by_gpu_model"), ("by node", "by_node")):
        if f[name]:
            lines.append(f"  {title}: " + ", ".join(f"{k} {v}" for k, v in list(f[name].items())[:10]))
    lines.append("")
    for title, name in (
        ("time to detect", "time_to_detect_s"),
        ("time to quarantine", "time_to_quarantine_s"),
        ("time to release", "time_to_release_s"),
    ):
        q = report[name]
        lines.append(f"{title:20} p50 {_dur(q['p50'])}, p90 {_dur(q['p90'])} ({q['count']})")
    oos = report["out_of_service"]
    lines.append(
        f"{'time out of service':20} {oos['node_hours']} node-hours over {oos['episodes']} episode(s) "
        f"on {oos['nodes']} node(s)"
    )
    lines += ["", "repairs:" if report["repairs"] else "repairs: none"]
    for step, r in report["repairs"].items():
        rate = "-" if r["success_rate"] is None else f"{r['success_rate']:.0%}"
        outcomes = ", ".join(f"{k} {v}" for k, v in r["outcomes"].items())
        lines.append(f"  {step:16} {r['succeeded']}/{r['rounds']} succeeded ({rate}): {outcomes}")
    lines += ["", f"repeat offenders: {len(report['repeat_offenders'])}"]
    for o in report["repeat_offenders"]:
        lines.append(
            f"  {o['gpu']} {o['model'] or ''}: {o['faults']} faults ({', '.join(o['codes'])}) on "
            f"{', '.join(o['faulted_on'])}"
        )
    lines += ["", f"RMA candidates: {len(report['rma_candidates'])}"]
    for c in report["rma_candidates"]:
        lines.append(f"  {c['gpu']}: {'; '.join(c['reasons'])}")
    return "\n".join(lines) + "\n"


def _gpu_key(ident: store.GpuIdentity | None, node: str, pci: str) -> str:
    if ident is not None and ident.serial:
        return f"serial:{ident.serial}"
    if ident is not None and ident.uuid:
        return ident.uuid
    return f"{node}/{pci}"


def _seconds(later: dt.datetime | None, earlier: dt.datetime | None) -> float:
    if later is None or earlier is None:
        return 0.0
    return (_aware(later) - _aware(earlier)).total_seconds()


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _quantiles(values: list[float]) -> dict[str, Any]:
    values = sorted(v for v in values if v >= 0)
    if not values:
        return {"count": 0, "p50": None, "p90": None}
    if len(values) == 1:
        return {"count": 1, "p50": round(values[0], 3), "p90": round(values[0], 3)}
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return {"count": len(values), "p50": round(statistics.median(values), 3), "p90": round(cuts[8], 3)}


def _rate(c: Counter[str]) -> float | None:
    done = sum(n for k, n in c.items() if k != "InProgress")
    return None if not done else round(c.get(RepairOutcome.SUCCEEDED.value, 0) / done, 3)


def _iso(t: dt.datetime) -> str:
    return utc_text(t, seconds=True)


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
