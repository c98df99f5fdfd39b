"""Which of a node's open faults a derived fault suppresses (`workers.suppression`), and the derived
fault's metadata that says so (`patterns.cluster.Derived.fault`)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from patterns import cluster
from workers import suppression

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)


@dataclass(frozen=True)
class F:
    id: str
    code: str
    first_seen: dt.datetime
    last_seen: dt.datetime
    metadata: dict[str, str] = field(default_factory=dict)


def workload(first: dt.datetime = T0, last: dt.datetime = T0 + 2 * MIN) -> F:
    meta = {"suppresses": "XID-13,XID-31,XID-43,XID-45", "suppress_for": "3600"}
    return F("n1/JOB/ml-train/WORKLOAD-APP-XID", "WORKLOAD-APP-XID", first, last, meta)


def test_application_xids_within_the_suppressions_time_are_suppressed_others_are_not() -> None:
    w = workload()
    during = F("xid13", "XID-13", T0 - 10 * MIN, T0 + MIN)
    before = F("xid31-early", "XID-31", T0 - 2 * 60 * MIN, T0 - 61 * MIN)  # over an hour before the window
    after = F("xid43-late", "XID-43", T0 + 70 * MIN, T0 + 70 * MIN)  # a burst after it: escalates as before
    later_but_within = F("xid45", "xid-45", T0 + 50 * MIN, T0 + 61 * MIN)  # codes compare case-blind
    hardware = F("xid79", "XID-79", T0, T0 + MIN)
    got = suppression.suppressed([w, during, before, after, later_but_within, hardware])
    assert got == {"xid13": w.id, "xid45": w.id}


def test_nothing_without_a_suppressing_fault_and_no_chains_or_bad_metadata() -> None:
    xid = F("xid13", "XID-13", T0, T0)
    assert suppression.suppressed([xid]) == {}
    bad = F("d", "WORKLOAD-APP-XID", T0, T0, {"suppresses": "XID-13", "suppress_for": "soon"})
    assert suppression.suppressed([bad, xid]) == {}
    other = F("d2", "WORKLOAD-X", T0, T0, {"suppresses": "WORKLOAD-*", "suppress_for": "60"})
    assert suppression.suppressed([workload(), other, xid]) == {"xid13": workload().id}  # d2: nothing


def test_the_built_in_workload_fault_carries_its_suppression() -> None:
    packs = cluster.load()
    job = {"job": "ml/train"}
    recs = [cluster.Record(position=i << 16, kind="events", id=f"e{i}", t=1_800_000_000.0 + 30 * i,
                           node=f"n{i}", code="XID-13", metadata=job) for i in range(1, 4)]  # fmt: skip
    out = [d for d in cluster.replay(packs, recs) if d.pattern == "workload-app-xid"]
    assert [(d.node, d.code, d.entity_type, d.entity_id) for d in out] == [
        (f"n{i}", "WORKLOAD-APP-XID", "JOB", "ml/train") for i in range(1, 4)
    ]
    meta = out[0].fault().metadata
    assert meta["suppresses"] == "XID-13,XID-31,XID-43,XID-45" and meta["suppress_for"] == "3600"
    assert "suppresses" not in next(d for d in cluster.replay(packs, [
        cluster.Record(position=(9 + i) << 16, kind="events", id=f"g{i}", t=1_800_000_000.0 + 3600 * i,
                       node="n1", code="XID-79", metadata={"gpu_uuid": "G"}) for i in range(3)
    ]) if d.pattern == "gpu-repeated-failure").fault().metadata  # fmt: skip
