"""RMA evidence: when a repair hands a node to a person (CONTACT_SUPPORT) or to the cloud provider's
replacement (REPLACE), what faultline knew of it is kept as one bundle in the store, before the hardware
is gone: the faults behind the round, the newest kernel lines or samples behind each, the GPUs' identity
(UUID, serial, PCI address, model, VBIOS and driver versions) and their last health sample (every field),
the node's repair history, and the `nvidia-bug-report` output the node's repair Jobs collected.

`faultline rma NODE|GPU` writes the bundles as a tarball (`cli.app`); the RemediationRequest of a
REPLACE round names its bundle in `status.evidence`, the condition of a CONTACT_SUPPORT round in its
message.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from faultline import bounds, store
from faultline.errors import TransientError
from faultline.models import HEALTH_SAMPLE_CODE

log = logging.getLogger(__name__)
MAX_BYTES = 8 * 1024 * 1024  # of one bundle (a document holds at most 16 MiB): the oldest lines go first
EVIDENCE = 20  # newest events kept per fault
TEXT = 2048  # characters kept of one line or message


def bundle_id(repair_id: str, index: int) -> str:
    return f"{repair_id}#{index + 1}"


def keep(
    st: store.Store, repair: store.Repair, index: int, round_: store.RepairRound, why: str
) -> str | None:
    """Collect and keep the bundle of round `index` (once: a second call keeps the first); its id, or None
    when it could not be kept (logged). Best effort: the evidence is for a person, never a reason to hold
    back the repair or the hand-over (the store away is retried by the caller's claim like any other
    call)."""
    key = bundle_id(repair.id, index)
    try:
        bundle = collect(st, repair, index, round_, why)
        while len(json.dumps(bundle, default=str)) > MAX_BYTES and _shrink(bundle):  # about its stored size
            pass
        st.keep_rma(bundle)
    except TransientError:
        raise
    except Exception as exc:  # noqa: BLE001 - see above
        log.warning(
            "RMA evidence of %s not kept: %s", repair.node, exc, extra={"node": repair.node, "item": key}
        )
        return None
    return key


def _shrink(bundle: dict[str, Any]) -> bool:
    """Halve the longest list of evidence lines (the newest stay); False when nothing is left to cut."""
    lists = [v for v in bundle["evidence"].values() if len(v) > 1]
    if not lists:
        return False
    longest = max(lists, key=len)
    del longest[len(longest) // 2 :]
    return True


def collect(
    st: store.Store, repair: store.Repair, index: int, round_: store.RepairRound, why: str
) -> dict[str, Any]:
    node = repair.node
    faults = st.faults_of([node]).get(node, [])
    named = set(round_.fault_keys)
    behind = [f for f in faults if f.id in named] or [f for f in faults if f.state == "open"]
    identities = st.gpus(node)
    pcis = set(round_.gpus) or {f.entity.id for f in behind if f.entity.type == "GPU"}
    gpus = [g for g in identities if g.pci in pcis] if pcis else identities
    return {
        "_id": bundle_id(repair.id, index),
        "node": node,
        "repair": repair.id,
        "round": index + 1,
        "step": str(round_.step),
        "request": round_.request,
        "why": bounds.clip(why, TEXT),
        "created_at": st.now(),
        "faults": [_fault(f) for f in behind],
        "evidence": {
            f.id: [_event(e) for e in st.events_of(node, f.code, f.entity.id, EVIDENCE)] for f in behind
        },
        "gpus": [
            {
                "pci": g.pci,
                "index": g.index,
                "uuid": g.uuid,
                "serial": g.serial,
                "model": g.model,
                "vbios": g.vbios,
                "driver": g.driver,
                "seen_at": g.seen_at,
            }
            for g in gpus
        ],
        "samples": {
            g.pci: [_event(e) for e in st.events_of(node, HEALTH_SAMPLE_CODE, g.pci, 1)] for g in gpus
        },
        "repairs": [_repair(r) for r in sorted(st.repairs_of(node), key=lambda r: r.first_seen or _EPOCH)],
        "bug_reports": st.bug_reports(node),
    }


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _fault(f: store.FaultRecord) -> dict[str, Any]:
    return {
        "id": f.id,
        "code": f.code,
        "entity": {"type": f.entity.type, "id": f.entity.id},
        "component": f.component,
        "fatal": f.fatal,
        "action": f.action,
        "state": f.state,
        "count": f.count,
        "first_seen": f.first_seen,
        "last_seen": f.last_seen,
        "resolved_at": f.resolved_at,
        "message": bounds.clip(f.message, TEXT),
        "pattern": f.pattern,
        "metadata": dict(f.metadata),
    }


def _event(e: dict[str, Any]) -> dict[str, Any]:
    return {
        "observed_at": e.get("observed_at"),
        "check": e.get("check", ""),
        "healthy": bool(e.get("healthy")),
        "message": bounds.clip(str(e.get("message", "")), TEXT),
        "metadata": dict(e.get("metadata") or {}),
    }


def _repair(r: store.Repair) -> dict[str, Any]:
    return {
        "id": r.id,
        "episode": r.episode,
        "result": r.result,
        "rounds": [
            {
                "step": str(x.step),
                "request": x.request,
                "gpus": list(x.gpus),
                "reason": x.reason,
                "requested_at": x.requested_at,
                "started_at": x.started_at,
                "outcome": None if x.outcome is None else str(x.outcome),
                "at": x.at,
                "message": x.message,
            }
            for x in r.rounds
        ],
    }
