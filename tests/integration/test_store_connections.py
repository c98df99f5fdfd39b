"""The agent's connection budget on a real FerretDB: one store client per agent process, at most
AGENT_STORE_POOL connections for calls and one for monitoring, counted by the kernel (devtools.sockets);
and the one read an idle agent makes (`Store.repair_watch`)."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest

from devtools import sockets
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import store
from sinks.mongo import AGENT_STORE_POOL, agent_store
from sources import simulator
from tests.integration.test_agent import start_agent, stop_agent

pytestmark = pytest.mark.integration
BUDGET = AGENT_STORE_POOL + 1  # calls, and the client's monitoring connection


def test_the_agents_client_holds_at_most_its_budget_under_concurrent_calls(mongo: LocalMongo) -> None:
    port, me = mongo.port, os.getpid()
    before = sockets.connections_to(me, port)
    st = agent_store(mongo.uri, f"budget_{me}")
    try:
        seen = []

        def call(i: int) -> None:
            st.repairs_to_confirm(f"node-{i}")
            seen.append(sockets.connections_to(me, port) - before)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:  # many more callers than connections
            list(pool.map(call, range(400)))
        assert 1 <= max(seen) <= BUDGET, seen
    finally:
        st.close()


def test_a_running_agent_holds_one_client_within_its_budget(
    cluster: LocalCluster, mongo: LocalMongo, tmp_path: Path
) -> None:
    """A real agent process (its sink's writes, the repair reads, the GPU identity record, bug-report
    uploads, all on one client): its connections to the store never pass the budget, while it writes."""
    node = cluster.node_names[0]
    database = f"budget_agent_{os.getpid()}"
    agent = start_agent(cluster, mongo, node, database, tmp_path, "--repair-poll-interval", "0.1",
                        "--repair-idle-poll-interval", "0.1")  # fmt: skip
    try:
        counts = []
        for i in range(40):  # 4 s: faults written, repairs read every 0.1 s
            if i % 10 == 0:
                simulator.inject(node, i // 10, kind="xid", value=31, directory=tmp_path)
            counts.append(sockets.connections_to(agent.pid, mongo.port))
            time.sleep(0.1)
        assert max(counts) <= BUDGET, counts
        assert max(counts) >= 1, counts  # it did reach the store
    finally:
        stop_agent(agent)
        with pymongo.MongoClient(mongo.uri) as client:
            client.drop_database(database)


def test_repair_watch_names_verified_rounds_and_whether_a_repair_is_open(mongo_db: Any) -> None:
    st = store.Store(mongo_db)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    done = {
        "step": "GPU_RESET",
        "request": "r0",
        "gpus": ["0000:3b:00"],
        "verified_at": now,
        "outcome": "repaired",
    }
    assert st.repair_watch("n1") == ([], False)  # no repair at all: the agent reads seldom
    mongo_db["repairs"].insert_one(
        {"_id": "old", "node": "n1", "rounds": [done], "janitor": {"state": "done"}}
    )
    assert st.repair_watch("n1") == ([], False)  # a finished one
    round_ = {"step": "GPU_RESET", "request": "r1", "gpus": ["0000:3b:00"]}
    mongo_db["repairs"].insert_one(
        {"_id": "r1", "node": "n1", "rounds": [round_], "janitor": {"state": "claimed"}}
    )
    assert st.repair_watch("n1") == ([], True)  # open, not verified yet: the agent reads often
    assert st.repair_watch("n2") == ([], False)  # another node's
    mongo_db["repairs"].update_one({"_id": "r1"}, {"$set": {"rounds.0.verified_at": now}})
    notices, active = st.repair_watch("n1")
    assert active
    assert [(n.round_id, n.step, n.gpus) for n in notices] == [("r1#0", "GPU_RESET", ("0000:3b:00",))]
    assert st.repairs_to_confirm("n1") == notices
    # a repair just opened: remediation decides its round, the janitor has none yet; read often already,
    # so that a reset done within one idle wait is confirmed within `repair_poll_interval`
    key = st.open_repair("n3", now)
    assert st.repair_watch("n3") == ([], True)
    for state in ("drain", "done"):  # waiting for the whole node's drain; then decided, nothing to do
        mongo_db["repairs"].update_one({"_id": key}, {"$set": {"remediation.state": state}})
        assert st.repair_watch("n3") == ([], state == "drain")
