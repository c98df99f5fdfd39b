"""`faultline explain` and `faultline status -o` on the real API server and FerretDB, for the cases the
end-to-end test (tests/integration/test_workers_e2e.py) does not pass through: a node that does not exist,
a fault no rule quarantines for, a fault held back by the tripped breaker."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import yaml

from devtools import procs
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import store
from tests.integration import test_quarantine as tq
from tests.integration.test_quarantine import nodes  # noqa: F401 - the fixture: fresh GPU Nodes
from tests.integration.test_workers_e2e import explain
from workers import breaker

pytestmark = pytest.mark.integration


def test_a_node_that_does_not_exist(cluster: LocalCluster, mongo: LocalMongo, mongo_db: Any) -> None:
    story = explain(cluster, mongo, mongo_db, "no-such-node")
    assert (story["exists"], story["held"], story["faults"], story["actions"]) == (False, False, [], [])
    assert story["next"].startswith("the Node does not exist")


def test_a_fault_no_rule_quarantines_for_is_watched(
    cluster: LocalCluster,
    mongo: LocalMongo,
    mongo_db: Any,
    nodes: Any,  # noqa: F811
) -> None:
    (name,) = nodes(1)
    st = store.Store(mongo_db)
    st.ensure_indexes()
    st.write_fault(tq.fault(name, "XID-13", fatal=False), 1)
    story = explain(cluster, mongo, mongo_db, name)
    (fault,) = story["faults"]
    assert (fault["code"], fault["fatal"], fault["rules"]) == ("XID-13", False, [])
    assert story["next"] == "watched: its open faults match no quarantine rule"
    assert any("force-quarantine" in a["command"] for a in story["actions"])
    out = yaml.safe_load(explain(cluster, mongo, mongo_db, name, output="yaml", command="status"))
    assert out["node"] == name and out["held"] == [] and out["faults"][0]["code"] == "XID-13"


def test_a_quarantine_the_tripped_breaker_holds_back(
    cluster: LocalCluster,
    mongo: LocalMongo,
    mongo_db: Any,
    api: Any,
    nodes: Any,  # noqa: F811
) -> None:
    storm = nodes(3)
    cfg = breaker.BreakerConfig(window=dt.timedelta(minutes=10), max_share=None, max_count=1)
    w = tq.worker(mongo_db, api, breaker=cfg, threads=1)
    w.start()
    try:
        for name in storm:
            w.store.write_fault(tq.fault(name), 1)
        procs.wait_for("breaker open", lambda: tq.breaker_doc(mongo_db).get("state") == "open", 10)
        blocked = [n for n in storm if not tq.node_view(api, n)["cordoned"]]
        procs.wait_for("held back", lambda: all(
            explain(cluster, mongo, mongo_db, n)["faults"][0]["quarantine"]["state"] == "blocked" for n in blocked
        ), 10)  # fmt: skip
        story = explain(cluster, mongo, mongo_db, blocked[0])
        assert story["breaker"]["state"] == "open" and not story["held"]
        assert story["next"].startswith("quarantine waits for the circuit breaker")
        assert "faultline breaker reset --reason <why>" in [a["command"] for a in story["actions"]]
        everything = explain(cluster, mongo, mongo_db, "", output="json", command="status-all")
        assert everything["breaker"]["state"] == "open" and everything["breaker"]["reason"]
    finally:
        w.halt()
