"""A remediation worker that dies after writing a round of repair and its RemediationRequest, before its
claim closed, on the real control plane and FerretDB: whoever takes the claim over hands that round to
the janitor; it does not decide a second one. Found by the chaos suite's remediation-kill: a second
request for the node, and the first round left without an outcome for good."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from faultline import kube, store
from tests.integration.test_janitor import _fault, setup
from tests.integration.test_workers_e2e import forget_repairs
from workers import remediation, remedies

pytestmark = pytest.mark.integration
__all__ = ["setup"]  # a fixture


def test_a_round_written_before_a_crash_is_handed_over_not_asked_again(
    cluster: LocalCluster, api: Any, mongo_db: Any, setup: None
) -> None:
    node = cluster.node_names[4]
    st = store.Store(mongo_db)
    st.ensure_indexes()
    fault = _fault(node)
    st.write_fault(fault, 1)
    episode = dt.datetime.now(dt.UTC).replace(microsecond=0)
    key = store.repair_key(node, episode)
    name = remediation.request_name(node, episode, 1)
    # what the dead holder left: the request and the round written, the claim taken back by the reaper
    kube.resources.create_request(api, {
        "apiVersion": kube.resources.RR_API_VERSION, "kind": "RemediationRequest",
        "metadata": {"name": name, "labels": {"faultline.io/node": node}},
        "spec": {"node": node, "action": remedies.REBOOT, "gpus": [fault.entity.id], "reason": "test",
                 "faultKeys": [fault.id], "step": 1},
    })  # fmt: skip
    st.repairs.insert_one({
        "_id": key, "node": node, "episode": episode, "first_seen": episode, "fatal": True,
        "rounds": [{"step": remedies.REBOOT, "request": name, "fault_keys": [fault.id], "gpus": [fault.entity.id],
                    "reason": "test", "requested_at": episode, "outcome": None, "at": None}],
        "remediation": {"state": store.State.PENDING, "attempts": 1, "seq": 2}, "janitor": {"state": "idle", "attempts": 0},
    })  # fmt: skip
    settings = remediation.Settings(lease=dt.timedelta(seconds=5), threads=1, resync_interval=60.0)
    worker = remediation.Remediation(st, api, settings, "r-takeover")
    worker.start()
    try:
        procs.wait_for("the claim closed", lambda: st.repairs.find_one({"_id": key})["remediation"]["state"]
                       == store.State.DONE, 20)  # fmt: skip
    finally:
        worker.halt()
    doc = st.repairs.find_one({"_id": key})
    try:
        assert [r["request"] for r in doc["rounds"]] == [name]  # no second round
        assert doc["janitor"]["state"] == store.State.PENDING  # the first one handed over
        requests = kube.resources.list_requests(api, label_selector=f"faultline.io/node={node}")
        assert [r["metadata"]["name"] for r in requests] == [name]
    finally:
        forget_repairs(api, node)
