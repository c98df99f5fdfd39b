"""Errors drive the claim loop, on the real control plane and FerretDB: a permanent error parks the work
item after one try (its reason stored, a Warning Event on its Node, a metric, `faultline status`); a
transient one is claimed again only after its delay; every item is parked once out of attempts."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.errors import PermanentError, TransientError
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from workers import common


def fault(node: str, code: str = "XID-79") -> Fault:
    now = dt.datetime.now(dt.UTC)
    return Fault(
        id=fault_id(node, "GPU", "0000:3b:00", code), node=node, entity=Entity(type="GPU", id="0000:3b:00"),
        code=code, component=Component.GPU, count=1, first_seen=now, last_seen=now, fatal=True,
        action=Action.RESTART_BM, state=FaultState.OPEN,
    )  # fmt: skip


def item(st: store.Store, key: str) -> store.WorkItem:
    return store.WorkItem.from_doc(st.queue.find_one({"_id": f"{store.Stage.QUARANTINE}/{key}"}) or {})


def events(api: Any, node: str, reason: str) -> list[Any]:
    got = kube.core(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    return [e for e in got if e.reason == reason]


@pytest.fixture
def st(mongo_db: Any) -> store.Store:
    s = store.Store(mongo_db)
    s.ensure_indexes()
    return s


@pytest.fixture
def run_loop(st: store.Store, api: Any) -> Iterator[Callable[..., common.ClaimLoop]]:
    loops: list[common.ClaimLoop] = []

    def start(
        handle: Callable[[store.Claim], common.Outcome], name: str, *, stage: store.Stage = store.Stage.QUARANTINE,
        collection: store.Work = store.Work.QUEUE, **kwargs: Any,
    ) -> common.ClaimLoop:  # fmt: skip
        loop = common.ClaimLoop(st, stage, f"{name}-owner", handle, lease=dt.timedelta(minutes=1), threads=1,
                                metrics=common.WorkerMetrics(name), collection=collection, every=0.2,
                                refresh=0.1, api=api, **kwargs)  # fmt: skip
        loop.start()
        loops.append(loop)
        return loop

    yield start
    for loop in loops:
        assert loop.halt(10)


def test_a_permanent_error_parks_the_item_after_one_try_with_an_event_and_status(
    st: store.Store, run_loop: Callable[..., common.ClaimLoop], api: Any, cluster: LocalCluster,
    mongo: LocalMongo, mongo_db: Any,
) -> None:  # fmt: skip
    node = cluster.node_names[0]
    bad, good = fault(node, "XID-79"), fault(node, "XID-48")
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def handle(claim: store.Claim) -> store.State:
        key = str(claim.doc["key"])
        with lock:
            calls[key] = calls.get(key, 0) + 1
        if key == bad.id:
            raise PermanentError("the rule names a taint the API server refuses")
        return store.State.DONE

    st.write_fault(bad, revision=1)
    loop = run_loop(handle, "perm_test")
    procs.wait_for("parked", lambda: item(st, bad.id).quarantine.state == store.State.PARKED, 20)
    # the loop goes on: a later item is handled, and the parked one is never claimed again
    st.write_fault(good, revision=1)
    procs.wait_for("the next item done", lambda: item(st, good.id).quarantine.state == store.State.DONE, 20)
    assert calls == {bad.id: 1, good.id: 1}
    parked = item(st, bad.id).quarantine
    assert parked.attempts == 1
    assert parked.error == "PermanentError: the rule names a taint the API server refuses"
    assert loop.metrics.registry.get_sample_value("faultline_perm_test_parked_total") == 1.0
    procs.wait_for("the Warning Event", lambda: len(events(api, node, "FaultlineWorkParked")) >= 1, 10)
    event = events(api, node, "FaultlineWorkParked")[-1]
    assert event.type == "Warning" and bad.id in event.message

    env = {**os.environ, "COLUMNS": "400"}  # one table row per line
    shown = subprocess.run(
        [sys.executable, "-m", "faultline", "status", "--mongodb-uri", mongo.uri, "--database", mongo_db.name],
        capture_output=True, text=True, timeout=60, env=env, check=True,
    )  # fmt: skip
    row = next((line for line in shown.stdout.splitlines() if f"quarantine/{bad.id}" in line), "")
    assert row, shown.stdout
    assert node in row and "PermanentError: the rule names a taint" in row, row
    assert f"quarantine/{good.id}" not in shown.stdout


def test_a_transient_error_is_retried_after_its_delay_and_not_before(
    st: store.Store, run_loop: Callable[..., common.ClaimLoop], cluster: LocalCluster
) -> None:
    node = cluster.node_names[1]
    f = fault(node)
    delay = 2.0
    tries: list[float] = []

    def handle(claim: store.Claim) -> store.State:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise TransientError("the API server is busy", delay=delay)
        return store.State.DONE

    st.write_fault(f, revision=1)
    run_loop(handle, "transient_test")
    procs.wait_for("the first try", lambda: len(tries) >= 1, 20)
    procs.wait_for("given back", lambda: item(st, f.id).quarantine.state != store.State.CLAIMED, 10)
    back = item(st, f.id).quarantine
    assert back.state == store.State.PENDING and back.error == "TransientError: the API server is busy"
    assert back.retry_after is not None and back.updated_at is not None
    assert back.retry_after - back.updated_at >= dt.timedelta(seconds=delay - 0.05)
    procs.wait_for("retried and done", lambda: item(st, f.id).quarantine.state == store.State.DONE, 20)
    assert len(tries) == 2
    assert tries[1] - tries[0] >= delay - 0.01  # not claimed again before its delay


def test_an_item_that_keeps_failing_backs_off_and_is_parked_at_its_attempt_cap(
    st: store.Store, run_loop: Callable[..., common.ClaimLoop], cluster: LocalCluster
) -> None:
    node = cluster.node_names[2]
    f = fault(node)
    tries: list[float] = []

    def handle(claim: store.Claim) -> store.State:
        tries.append(time.monotonic())
        raise ValueError("a bug")

    st.write_fault(f, revision=1)
    loop = run_loop(handle, "cap_test", max_attempts=3)
    procs.wait_for("parked", lambda: item(st, f.id).quarantine.state == store.State.PARKED, 30)
    parked = item(st, f.id).quarantine
    assert len(tries) == 3 and parked.attempts == 3
    assert parked.error == "3 attempts, the last: ValueError: a bug"
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert gaps[0] >= store.retry_delay(1) - 0.01 and gaps[1] >= store.retry_delay(2) - 0.01  # backing off
    assert loop.metrics.registry.get_sample_value("faultline_cap_test_parked_total") == 1.0
