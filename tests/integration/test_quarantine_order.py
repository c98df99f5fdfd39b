"""The quarantine's work order on the real API server and FerretDB: fatal faults first, then by first
sighting. After an outage every open fault's work item waits, non-fatal ones too (the default rules do
nothing for them); found by the chaos suite's 10-minute store outage, where the nodes to cordon queued
behind hundreds of those."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from typing import Any

import pytest

from devtools import fakelet, procs
from faultline import kube, store
from faultline.errors import NotFoundError
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from workers import breaker, quarantine

pytestmark = pytest.mark.integration


def _fault(node: str, gpu: str, code: str, *, fatal: bool, seen: dt.datetime) -> Fault:
    return Fault(
        id=fault_id(node, "GPU", gpu, code), node=node, entity=Entity(type="GPU", id=gpu), code=code,
        component=Component.GPU, count=1, first_seen=seen, last_seen=seen, fatal=fatal,
        action=Action.RESTART_BM if fatal else Action.NONE, state=FaultState.OPEN,
    )  # fmt: skip


def test_fatal_faults_are_claimed_before_older_minor_ones(api: Any, mongo_db: Any) -> None:
    node = f"ord-{uuid.uuid4().hex[:8]}"
    kube.core(api).create_node(fakelet.node_manifest(fakelet.SimNode(node, "10.9.0.1"), 8))
    st = store.Store(mongo_db)
    st.ensure_indexes()
    now = dt.datetime.now(dt.UTC)
    minor = [_fault(node, f"0000:{i:02x}:00", "XID-14", fatal=False, seen=now - dt.timedelta(minutes=9 - i))
             for i in range(6)]  # fmt: skip
    fatal = _fault(node, "0000:3b:00", "XID-79", fatal=True, seen=now)
    for f in [*minor, fatal]:
        st.write_fault(f, 1)
    settings = quarantine.Settings(threads=1, breaker=breaker.BreakerConfig(max_share=None, max_count=None))
    worker = quarantine.QuarantineWorker(st, api, settings, "order-test")
    worker.start()
    try:
        procs.wait_for("every item claimed", lambda: st.leases.count_documents({"kind": "claimed"}) >= 7, 30)
    finally:
        worker.halt()
        with contextlib.suppress(NotFoundError):
            kube.nodes.delete(api, node)
    claimed = sorted(st.leases.find({"kind": "claimed"}), key=lambda d: (d["at"], d["_id"]))
    assert claimed[0]["fault"] == f"quarantine/{fatal.id}"  # the newest fault, but the fatal one
    assert [d["fault"] for d in claimed[1:]] == [f"quarantine/{f.id}" for f in minor]
