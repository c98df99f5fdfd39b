"""A quarantine whose record was lost, on the real API server and FerretDB: the claim cordoned the node,
then the store went away before the hold was written, and the retried claim found the node already
cordoned by faultline. The hold must still get its episode (`quarantined_at`): the drainer and
remediation act on episodes. Found by the chaos suite's ferretdb-kill: the hold was written without
one, and the node stayed cordoned with its pods, never drained or repaired."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from typing import Any

import pytest

from devtools import fakelet
from faultline import kube, store
from faultline.errors import NotFoundError
from tests.integration.test_quarantine_resync import _fault
from workers import breaker, quarantine

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("before", ["no record", "a released episode"])
def test_a_retried_quarantine_records_its_episode(api: Any, mongo_db: Any, before: str) -> None:
    node = f"ep-{uuid.uuid4().hex[:8]}"
    kube.core(api).create_node(fakelet.node_manifest(fakelet.SimNode(node, "10.9.0.1"), 8))
    try:
        st = store.Store(mongo_db)
        st.ensure_indexes()
        settings = quarantine.Settings(breaker=breaker.BreakerConfig(max_share=None, max_count=None))
        worker = quarantine.QuarantineWorker(st, api, settings, "episode-test")
        earlier = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        st.write_fault(_fault(node, "XID-79", fatal=True), 1)
        assert worker.reconcile(node) == "quarantined"  # the node patched, and recorded...
        if before == "no record":  # ...but the record lost with the store
            st.nodes.delete_one({"_id": node})
        else:  # ...or only the last episode's, released, is there
            st.nodes.update_one({"_id": node}, {"$set": {"quarantined": False, "quarantined_at": earlier}})
        worker.reconcile(node)  # the claim, retried
        hold = st.hold(node)
        assert hold is not None and hold.quarantined
        assert hold.quarantined_at is not None and hold.quarantined_at > earlier
    finally:
        with contextlib.suppress(NotFoundError):
            kube.nodes.delete(api, node)
