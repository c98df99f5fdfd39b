"""The quarantine's resync pass on the real API server and FerretDB: a held node whose fatal fault
resolved is released by the next pass even while another fault of the node (one no rule quarantines
on) stays open. Found by the chaos suite: such nodes waited for the pass over every held node, once a
minute, and a repaired node stayed cordoned for up to 60 s."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import uuid
from typing import Any

import pytest

from devtools import fakelet
from faultline import kube, store
from faultline.errors import NotFoundError
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from workers import breaker, quarantine

pytestmark = pytest.mark.integration


def _fault(node: str, code: str, *, fatal: bool, resolved: bool = False) -> Fault:
    now = dt.datetime.now(dt.UTC)
    return Fault(
        id=fault_id(node, "GPU", "0000:3b:00", code), node=node, entity=Entity(type="GPU", id="0000:3b:00"),
        code=code, component=Component.GPU, count=1, first_seen=now, last_seen=now, fatal=fatal,
        action=Action.RESTART_BM if fatal else Action.NONE,
        state=FaultState.RESOLVED if resolved else FaultState.OPEN, resolved_at=now if resolved else None,
    )  # fmt: skip


def _cordoned(api: Any, node: str) -> bool:
    return bool(kube.nodes.read(api, node)["spec"].get("unschedulable"))


def test_a_repaired_node_is_released_by_the_next_pass_though_a_minor_fault_stays_open(
    api: Any, mongo_db: Any
) -> None:
    node = f"rs-{uuid.uuid4().hex[:8]}"
    kube.core(api).create_node(fakelet.node_manifest(fakelet.SimNode(node, "10.9.0.1"), 8))
    try:
        st = store.Store(mongo_db)
        st.ensure_indexes()
        settings = quarantine.Settings(
            hold_down=dt.timedelta(0), breaker=breaker.BreakerConfig(max_share=None, max_count=None)
        )
        worker = quarantine.QuarantineWorker(st, api, settings, "resync-test")
        st.write_fault(_fault(node, "XID-14", fatal=False), 1)  # open throughout: quarantines nothing
        st.write_fault(_fault(node, "XID-79", fatal=True), 1)
        assert worker.reconcile(node) == "quarantined"  # what the fault's claim does
        assert _cordoned(api, node)

        st.write_fault(_fault(node, "XID-79", fatal=True, resolved=True), 2)  # repaired
        worker.full_resync_at = time.monotonic()  # the once-a-minute pass over every held node not due
        worker.resync()
        assert not _cordoned(api, node)
        assert st.hold(node) is not None and not st.hold(node).quarantined  # type: ignore[union-attr]
        assert st.holds_with_faults_gone() == set()
    finally:
        with contextlib.suppress(NotFoundError):
            kube.nodes.delete(api, node)
