"""Liveness that means something: each long-running component wedged for real (an API server that accepts
connections and never answers, a peer process of the analyzer stopped) fails its `/healthz` with the loop
that stalled named, and answers healthy again once the wedge goes. An outage that a loop waits out (the
store away) is not a stall.

The workers are the real ones (claim loops, resyncs, handlers) on FerretDB; what they call hangs."""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import procs
from devtools.mongo import LocalMongo
from faultline import kube, metrics, store
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id
from tests.fakes.blackhole import BlackHole
from tests.integration import analyzerutil
from workers import drainer, janitor, maintenance, object_monitor, quarantine, remediation

pytestmark = pytest.mark.integration
STALL = 1.0  # seconds without progress that fail the probe here (120 by default)
LEASE = dt.timedelta(seconds=5)


@pytest.fixture
def hole(tmp_path: Path) -> Iterator[tuple[BlackHole, Any]]:
    h = BlackHole()
    try:
        yield h, kube.api_client(h.kubeconfig(tmp_path))
    finally:
        h.close()


def probe(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def open_fault(node: str) -> Fault:
    now = dt.datetime.now(dt.UTC)
    return Fault(
        id=fault_id(node, "GPU", "0000:3b:00", "XID-79"), node=node, entity=Entity(type="GPU", id="0000:3b:00"),
        code="XID-79", component=Component.GPU, count=1, first_seen=now, last_seen=now, fatal=True,
        action=Action.RESTART_BM, state=FaultState.OPEN,
    )  # fmt: skip


def claim_worker(kind: str, st: store.Store, api: Any) -> Any:
    """One of the four claim workers, with work that makes it call the (hung) API server."""
    node = f"wedged-{kind}"
    if kind == "quarantine":  # a fatal fault: its claim cordons the node
        st.write_fault(open_fault(node), 1)
        settings: Any = quarantine.Settings(resync_interval=0.2, lease=LEASE)
        return quarantine.QuarantineWorker(st, api, settings, "q", stall=STALL)
    episode = dt.datetime.now(dt.UTC)
    # the node held by the quarantine (as its worker records it): what a drain and a repair start from
    st.record_hold(node, faults=[open_fault(node).id], owned={"cordoned": True}, at=episode, newly=True)
    hold = st.hold(node)
    assert hold is not None and hold.quarantined_at is not None
    episode = hold.quarantined_at
    if kind == "drain":  # a pending drain: its claim lists the node's pods
        st.open_drain(node, episode, fatal=True)
        return drainer.Drainer(st, api, drainer.Settings(resync_interval=0.2, lease=LEASE), "d", stall=STALL)
    if kind == "remediation":  # a pending repair of an open fatal fault: its claim asks for the repair
        st.write_fault(open_fault(node), 1)
        st.open_repair(node, episode)
        settings = remediation.Settings(resync_interval=0.2, lease=LEASE, require_drain=False)
        return remediation.Remediation(st, api, settings, "r", stall=STALL)
    # the janitor's resync lists the users' RemediationRequests
    return janitor.Janitor(st, api, janitor.Settings(lease=LEASE), "j", stall=STALL)


@pytest.mark.parametrize("kind", ["quarantine", "drain", "remediation", "janitor"])
def test_a_claim_worker_wedged_in_an_api_call_fails_its_probe_until_the_call_ends(
    kind: str, mongo_db: Any, hole: tuple[BlackHole, Any]
) -> None:
    black_hole, api = hole
    worker = claim_worker(kind, store.Store(mongo_db), api)
    server = metrics.serve(0, host="127.0.0.1", registry=worker.metrics.registry, health=worker.alive)
    port = server.server_address[1]
    try:
        assert probe(port) == (200, "ok\n")
        worker.start()
        procs.wait_for("the probe failing", lambda: probe(port)[0] == 503, 15)
        status, body = probe(port)
        stalled = [line.split(":")[1].strip() for line in body.splitlines()]
        stage = worker.loop.stage
        # a claim's handler or the maintenance pass (the quarantine's and the janitor's resyncs read the
        # API too) hangs; never the lease renewer, which only talks to the store
        wedged = {f"{stage}-maintain", *(f"{stage}-{i}" for i in range(8))}
        assert status == 503 and stalled and set(stalled) <= wedged, body
        if kind == "janitor":
            assert stalled == [f"{stage}-maintain"]  # it has no claim: only its resync can hang
        assert all("no progress for" in line for line in body.splitlines())
        black_hole.close()  # the hung call fails at once: the loop goes round again
        procs.wait_for("the probe passing again", lambda: probe(port) == (200, "ok\n"), 30)
    finally:
        black_hole.close()  # (again, when the test failed before: nothing may stay hung)
        assert worker.halt(15)
        server.close()
    assert worker.alive.names() == []  # every loop ended in order, none left watched


def test_a_claim_worker_waiting_out_a_store_outage_stays_healthy(hole: tuple[BlackHole, Any]) -> None:
    """An unreachable store is an outage every call times out on, not a wedge: the loops keep turning."""
    _, api = hole
    st = store.connect("mongodb://127.0.0.1:9/?directConnection=true", "nowhere", timeout=0.2)
    # a limit above the loops' own waits (a failed claim waits 1 s, the renewer a third of the lease)
    settings = drainer.Settings(resync_interval=0.2, lease=dt.timedelta(seconds=3))
    worker = drainer.Drainer(st, api, settings, "d", stall=3.0)
    server = metrics.serve(0, host="127.0.0.1", registry=worker.metrics.registry, health=worker.alive)
    try:
        worker.start()
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=8)
        while dt.datetime.now(dt.UTC) < deadline:
            answer = probe(server.server_address[1])
            assert answer == (200, "ok\n"), answer
    finally:
        worker.halt(10)
        server.close()
        st.close()


def test_the_object_monitor_with_a_hung_watch_fails_its_probe(
    mongo_db: Any, hole: tuple[BlackHole, Any]
) -> None:
    black_hole, api = hole
    settings = object_monitor.Settings.from_config(_object_monitor_config(mongo_db))
    monitor = object_monitor.ObjectMonitor(store.Store(mongo_db), api, settings, stall=STALL)
    try:
        monitor.start()
        # a watch's limit: its timeout (1 s) + the read's grace (30 s) + the stall limit (1 s)
        procs.wait_for("the probe failing", lambda: not monitor.alive(), 60)
        stalled = [s.name for s in monitor.alive.stalls()]
        assert stalled and all(name.startswith("watch ") for name in stalled), stalled
        black_hole.close()
        procs.wait_for("healthy again", monitor.alive, 30)
    finally:
        assert monitor.halt(10)


def _object_monitor_config(mongo_db: Any) -> Any:
    from faultline import config  # noqa: PLC0415

    # a short watch timeout: a quiet watch still beats at least every timeout + 30 s + stall
    return config.ObjectMonitorConfig(mongodb_uri="mongodb://unused", database=mongo_db.name,
                                      watch_timeout=1.0)  # fmt: skip


def test_the_maintenance_monitor_wedged_in_a_look_fails_its_probe(
    mongo_db: Any, hole: tuple[BlackHole, Any]
) -> None:
    black_hole, api = hole
    settings = maintenance.Settings(interval=dt.timedelta(seconds=1), readers={})
    monitor = maintenance.MaintenanceMonitor(store.Store(mongo_db), api, settings, "m", stall=STALL)
    try:
        monitor.start()  # a look reads the GPU nodes first: that call hangs
        procs.wait_for("the probe failing", lambda: not monitor.alive(), 15)
        assert [s.name for s in monitor.alive.stalls()] == [maintenance.LOOP]
        black_hole.close()
        procs.wait_for("healthy again", monitor.alive, 30)
    finally:
        assert monitor.halt(10)


PACK = """
pack: liveness
patterns:
  - id: gpu-repeat
    scope: cluster
    description: the same GPU fails twice within a day
    match: {codes: [XID-79]}
    window: {key: [gpu], within: 24h, count: 2}
    fault: {code: GPU-REPEATED-FAILURE, component: GPU, entity: {type: GPU-UUID, id: "{gpu}"}, fatal: true,
            action: CONTACT_SUPPORT}
    examples:
      match:
        - records:
            - {node: n1, code: XID-79, metadata: {gpu_uuid: GPU-1}}
            - {at: 1h, node: n2, code: XID-79, metadata: {gpu_uuid: GPU-1}}
          expect: {nodes: [n2], entity_id: GPU-1, count: 2}
      no_match:
        - records:
            - {node: n1, code: XID-79, metadata: {gpu_uuid: GPU-1}}
"""


def test_the_analyzer_whose_peer_process_hangs_fails_its_probe(
    mongo: LocalMongo, mongo_db: Any, tmp_path: Path
) -> None:
    """Two processes (Bytewax's cluster mode): the second stopped (SIGSTOP), the first can close no epoch
    and reads no more of the feed; its probe names the feed. Continued, it is healthy again."""
    pack = tmp_path / "cluster.yaml"
    pack.write_text(PACK)
    port = procs.free_port()
    command = [sys.executable, "-m", "faultline", "analyzer", "--mongodb-uri", mongo.uri, "--database",
               mongo_db.name, "--pack", str(pack), "--no-builtin", "--no-node-labels", "--poll", "100ms", "--lease", "5s", "--owner", "a", "--processes", "2",
               "--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--stall-timeout", "2s",
               "--process-port", str(procs.free_ports(2))]  # fmt: skip
    proc = procs.Proc("analyzer", command, tmp_path / "analyzer.log")
    text = (tmp_path / "analyzer.log").read_text
    try:
        procs.wait_for("its second process", lambda: "process 1 of 2 of a joining" in text(), 60, proc=proc)
        procs.wait_for("healthy", lambda: _probe_quietly(port) == (200, "ok\n"), 30, proc=proc)
        (second,) = analyzerutil.second_processes(proc.pid)
        os.kill(second, signal.SIGSTOP)
        try:
            procs.wait_for("the probe failing", lambda: _probe_quietly(port)[0] == 503, 30, proc=proc)
            assert "stalled: feed: no progress for" in probe(port)[1]
        finally:
            os.kill(second, signal.SIGCONT)
        procs.wait_for("healthy again", lambda: _probe_quietly(port) == (200, "ok\n"), 30, proc=proc)
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(30) == 0, proc.tail()
    finally:
        proc.stop()
    procs.wait_for("its second process gone", lambda: not analyzerutil.second_processes(), 10)


def _probe_quietly(port: int) -> tuple[int, str]:
    try:
        return probe(port)
    except OSError:  # not serving yet
        return 0, ""
