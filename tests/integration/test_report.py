"""`faultline report` on FerretDB: a month of a small fleet's history written through the store's own
operations (faults, their first health events, GPU identities, quarantine episodes, repair rounds), read
back as JSON, CSV and a table, every figure checked."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from typing import Any

import pytest

from faultline import store
from faultline.models import (
    Action,
    Component,
    Entity,
    Fault,
    FaultState,
    HealthEvent,
    RepairOutcome,
    RepairStep,
    fault_id,
)  # fmt: skip
from tests.integration.test_quarantine import faultline

pytestmark = pytest.mark.integration
DAY = dt.timedelta(days=1)


def fault(node: str, etype: str, eid: str, code: str, first: dt.datetime, *, fatal: bool) -> Fault:
    return Fault(
        id=fault_id(node, etype, eid, code), node=node, entity=Entity(type=etype, id=eid), code=code,
        component=Component.GPU if etype == "GPU" else Component.NIC, count=1, first_seen=first,
        last_seen=first + dt.timedelta(minutes=5), fatal=fatal, action=Action.RESTART_BM if fatal else Action.NONE,
        state=FaultState.OPEN,
    )  # fmt: skip


def event(f: Fault, made_after: float) -> HealthEvent:
    return HealthEvent(
        id=f"ev-{f.id}", node=f.node, component=f.component, check="xid", code=f.code, entities=(f.entity,),
        healthy=False, fatal=f.fatal, action=f.action, message=f"NVRM: Xid ({f.entity.id}): {f.code}",
        observed_at=f.first_seen, generated_at=f.first_seen + dt.timedelta(seconds=made_after),
    )  # fmt: skip


def history(st: store.Store, now: dt.datetime) -> None:
    h100, l40s = "NVIDIA H100 80GB HBM3", "NVIDIA L40S"
    ident = {"index": 0, "vbios": "96.00.99.00.01", "driver": "580.95.05"}
    st.record_gpus(
        "node-a",
        [
            {**ident, "pci": "0000:18:00", "uuid": "GPU-a0", "serial": "S1", "model": h100},
            {**ident, "pci": "0000:2a:00", "uuid": "GPU-a1", "serial": "S2", "model": h100},
        ],
        now,
    )
    st.record_gpus(
        "node-b", [{**ident, "pci": "0000:2a:00", "uuid": "GPU-b1", "serial": "S1", "model": h100}], now
    )
    st.record_gpus(
        "node-c", [{**ident, "pci": "0000:18:00", "uuid": "GPU-c0", "serial": "S3", "model": l40s}], now
    )
    faults = [
        fault("node-a", "GPU", "0000:18:00", "XID-79", now - 10 * DAY, fatal=True),
        fault("node-b", "GPU", "0000:2a:00", "XID-79", now - 3 * DAY, fatal=True),  # the same board, moved
        fault("node-a", "GPU", "0000:2a:00", "XID-13", now - 5 * DAY, fatal=False),
        fault("node-c", "GPU", "0000:18:00", "XID-48", now - 2 * DAY, fatal=True),
        fault("node-c", "NIC", "mlx5_0", "NIC-LINK-DOWN", now - 1 * DAY, fatal=False),
        fault("node-a", "GPU", "0000:18:00", "XID-31", now - 40 * DAY, fatal=False),  # before the window
    ]  # fmt: skip
    for f in faults:
        st.write_fault(f, 1)
    st.record_events([event(faults[0], 0.5), event(faults[3], 1.5)])
    a_at, c_at = now - 10 * DAY + dt.timedelta(seconds=30), now - 2 * DAY + dt.timedelta(seconds=60)
    st.open_episode("node-a", a_at, [faults[0].id], ["XID-79"], faults[0].first_seen)
    st.close_episode("node-a", a_at + dt.timedelta(hours=2))
    st.open_episode("node-c", c_at, [faults[3].id], ["XID-48"], faults[3].first_seen)  # still held
    a = st.open_repair("node-a", a_at)
    st.add_round(
        a,
        store.RepairRound(
            step=RepairStep.REBOOT,
            request="node-a-1",
            requested_at=a_at,
            outcome=RepairOutcome.SUCCEEDED,
            at=a_at + dt.timedelta(minutes=20),
        ),
    )
    c = st.open_repair("node-c", c_at)
    ladder = [
        (RepairStep.GPU_RESET, RepairOutcome.FAILED),
        (RepairStep.REBOOT, RepairOutcome.FAILED),
        (RepairStep.CONTACT_SUPPORT, RepairOutcome.CONTACT_SUPPORT),
    ]
    for i, (step, outcome) in enumerate(ladder):
        at = c_at + dt.timedelta(minutes=10 * (i + 1))
        st.add_round(
            c,
            store.RepairRound(
                step=step,
                request=f"node-c-{i + 1}",
                requested_at=at,
                outcome=outcome,
                at=at,
                gpus=["0000:18:00"],
            ),
        )


def test_the_fleet_report(mongo: Any, mongo_db: Any) -> None:
    st = store.Store(mongo_db)
    st.ensure_indexes()
    history(st, st.now())
    report = json.loads(faultline(mongo, mongo_db, "report", "-o", "json", "--window", "30d"))
    f = report["faults"]
    assert (f["total"], f["fatal"]) == (5, 3)
    assert f["by_code"] == {"XID-79": 2, "XID-13": 1, "XID-48": 1, "NIC-LINK-DOWN": 1}
    assert f["by_gpu_model"] == {"NVIDIA H100 80GB HBM3": 3, "NVIDIA L40S": 1}
    assert f["by_node"] == {"node-a": 2, "node-c": 2, "node-b": 1}
    assert report["time_to_detect_s"] == {"count": 2, "p50": 1.0, "p90": 1.4}
    assert report["time_to_quarantine_s"] == {"count": 2, "p50": 45.0, "p90": 57.0}
    assert report["time_to_release_s"] == {"count": 1, "p50": 7200.0, "p90": 7200.0}
    oos = report["out_of_service"]
    assert (oos["episodes"], oos["nodes"]) == (2, 2)
    assert oos["node_hours"] == pytest.approx(2 + 48 - 1 / 60, abs=0.01)
    assert report["repairs"] == {
        "CONTACT_SUPPORT": {
            "rounds": 1,
            "succeeded": 0,
            "success_rate": 0.0,
            "outcomes": {"ContactSupport": 1},
        },
        "GPU_RESET": {"rounds": 1, "succeeded": 0, "success_rate": 0.0, "outcomes": {"Failed": 1}},
        "REBOOT": {
            "rounds": 2,
            "succeeded": 1,
            "success_rate": 0.5,
            "outcomes": {"Failed": 1, "Succeeded": 1},
        },
    }
    (offender,) = report["repeat_offenders"]  # the board that failed on node-a, then on node-b
    assert (offender["gpu"], offender["faults"], offender["fatal"]) == ("serial:S1", 2, 2)
    assert offender["faulted_on"] == ["node-a", "node-b"] and offender["codes"] == ["XID-79"]
    candidates = {c["gpu"]: c["reasons"] for c in report["rma_candidates"]}
    assert candidates == {
        "serial:S1": ["2 faults in the window, 2 fatal", "faulted on 2 nodes: node-a, node-b"],
        "serial:S3": ["repair asked for CONTACT_SUPPORT on node-c (node-c-3)"],
    }

    narrow = json.loads(faultline(mongo, mongo_db, "report", "-o", "json", "--window", "4d"))
    assert narrow["faults"]["by_code"] == {"XID-79": 1, "XID-48": 1, "NIC-LINK-DOWN": 1}
    assert narrow["repeat_offenders"] == [] and narrow["time_to_release_s"]["count"] == 0

    got = list(csv.reader(io.StringIO(faultline(mongo, mongo_db, "report", "-o", "csv"))))
    assert got[0] == ["measure", "dimension", "value"]
    assert ["faults_by_code", "XID-79", "2"] in got and ["repair_success_rate", "REBOOT", "0.5"] in got
    assert ["rma_candidate", "serial:S3", "repair asked for CONTACT_SUPPORT on node-c (node-c-3)"] in got

    screen = faultline(mongo, mongo_db, "report")
    assert "faults: 5 (3 fatal)" in screen and "REBOOT           1/2 succeeded (50%)" in screen
    assert "RMA candidates: 2" in screen and "time to release      p50 2.0 h" in screen
