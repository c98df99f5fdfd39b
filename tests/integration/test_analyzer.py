"""The cluster analyzer as a process (`faultline analyzer`) on a real store (FerretDB): it reads every
node's events from the feed the agents' writes make, derives faults that the quarantine worker's queue
takes like any other, and across a stop, a kill and a take-over by a standby replica it counts every
event exactly once."""

from __future__ import annotations

import datetime as dt
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.models import Action, Component, Entity, HealthEvent, event_id, fault_id
from tests.integration import analyzerutil

pytestmark = pytest.mark.integration
T0 = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)
ZONE = "topology.kubernetes.io/zone"

PACK = analyzerutil.gpu_repeat_pack("test-cluster")


ZONE_PATTERN = """
  - id: zone-burst
    scope: cluster
    description: fatal faults on three nodes of one zone within ten minutes
    match: {fatal: true}
    window: {key: ["zone=label:topology.kubernetes.io/zone"], within: 10m, count: 3, distinct: node}
    fault: {code: ZONE-INCIDENT, entity: {type: ZONE, id: "{zone}"}, nodes: every}
    examples:
      match:
        - records:
            - {node: a, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z1}}
            - {at: 1m, node: b, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z1}}
            - {at: 2m, node: c, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z1}}
          expect: {nodes: [a, b, c], entity_id: z1}
      no_match:
        - records:
            - {node: a, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z1}}
            - {at: 1m, node: b, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z2}}
            - {at: 2m, node: c, code: XID-79, fatal: true}
"""


def xid(node: str, i: int, uuid: str = "GPU-1", code: str = "XID-79") -> HealthEvent:
    ts = T0 + dt.timedelta(seconds=i)
    return HealthEvent(
        id=event_id(node, "kmsg", "GPU", "0000:3b:00", code, ts), node=node, component=Component.GPU,
        check="xid", code=code, entities=(Entity(type="GPU", id="0000:3b:00"),), healthy=False, fatal=True,
        action=Action.RESTART_BM, metadata={"gpu_uuid": uuid}, generated_at=ts, observed_at=ts,
    )  # fmt: skip


class Analyzer:
    def __init__(
        self, mongo: LocalMongo, database: str, pack: Path, log: Path, name: str, *extra: str
    ) -> None:
        self.log = log.open("a")
        labels = [] if "--kubeconfig" in extra else ["--no-node-labels"]  # no API server: no node labels
        owner = [] if "--peer" in extra else ["--owner", name]  # pods of a cluster are named by their place
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "faultline", "analyzer", "--mongodb-uri", mongo.uri, "--database", database,
             "--pack", str(pack), "--no-builtin", *labels, "--poll", "100ms",
             "--checkpoint-interval", "200ms", "--lease", "5s", *owner, *extra],
            stdout=self.log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.path = log

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.popen.send_signal(sig)
        try:
            return self.popen.wait(30)
        finally:
            self.log.close()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def says(self, text: str) -> bool:
        return text in self.path.read_text()


@pytest.fixture
def analyzers(mongo: LocalMongo, mongo_db: Any, tmp_path: Path) -> Iterator[Any]:
    pack = tmp_path / "cluster.yaml"
    pack.write_text(PACK + ZONE_PATTERN)
    started: list[Analyzer] = []

    def start(name: str, *extra: str, processes: int = 1) -> Analyzer:
        more = ("--processes", str(processes)) if processes > 1 else ()
        a = Analyzer(mongo, mongo_db.name, pack, tmp_path / f"{name}.log", name, *extra, *more)
        started.append(a)
        return a

    yield start
    for a in started:
        if a.alive():
            a.popen.kill()
            a.popen.wait(10)
            a.log.close()


def count(db: Any, node: str) -> int | None:
    """The count of the derived fault on `node` (GPU-1's repeated failures), None before there is one."""
    doc = db["faults"].find_one({"_id": fault_id(node, "GPU-UUID", "GPU-1", "GPU-REPEATED-FAILURE")})
    return None if doc is None else int(doc["count"])


def status(db: Any) -> str:
    """`faultline status` against the test's database."""
    uri = "mongodb://{}:{}/".format(*db.client.address)
    done = subprocess.run([sys.executable, "-m", "faultline", "status", "--mongodb-uri", uri, "--database", db.name],
                          check=True, capture_output=True, text=True, timeout=60)  # fmt: skip
    return done.stdout


def caught_up(st: store.Store) -> bool:
    from patterns.cluster import PARTITIONS  # noqa: PLC0415

    position = st.analyzer_position(PARTITIONS)
    return all(position.get(w, 0) >= n for w, n in st.feed_heads().items())


def wait(what: str, check: Any, a: Analyzer | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if a is not None and not a.alive():
            raise AssertionError(f"the analyzer exited before {what}:\n{a.path.read_text()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f":\n{a.path.read_text()[-3000:]}" if a else ""))


@pytest.mark.parametrize("processes", [1, 2])
def test_derives_faults_from_every_nodes_events_once_across_restarts_and_takeover(
    analyzers: Any, mongo_db: Any, processes: int
) -> None:
    """With `--processes 2` each replica is two processes (Bytewax's cluster mode): the second decodes
    and keeps windows too, ends with the first, and dies with it."""
    st = store.Store(mongo_db)
    st.record_batch([xid("n1", 0)], [])  # GPU-1 on n1; before the analyzer ever ran: read at its first start
    st.record_batch([xid("n1", 5, uuid="GPU-2")], [])  # another GPU: never counted for GPU-1
    analyzers = functools.partial(analyzers, processes=processes)
    a = analyzers("a")
    wait("the analyzer taking the lease", lambda: a.says("analyzer: active as a"), a)
    if processes == 2:
        wait("its second process", lambda: a.says("analyzer: process 1 of 2 of a joining"), a)
    st.record_batch([xid("n2", 10, code="XID-95")], [])  # the same GPU, moved to n2, fails again
    wait("the derived fault", lambda: count(mongo_db, "n2") == 2, a)
    fault = st.faults.find_one({"node": "n2"})
    assert fault["state"] == "open" and fault["fatal"] is True and fault["action"] == "CONTACT_SUPPORT"
    assert fault["pattern"] == "gpu-repeat" and fault["metadata"]["window"] == "GPU-1"
    assert fault["metadata"]["records"].split(",") == [xid("n1", 0).id, xid("n2", 10, code="XID-95").id]
    assert fault["first_seen"] == store.utc(T0) and fault["entity"] == {"type": "GPU-UUID", "id": "GPU-1"}
    # the quarantine worker's work item, as for any fault
    assert (
        mongo_db["queue"].find_one({"_id": f"quarantine/{fault['_id']}"})["quarantine"]["state"] == "pending"
    )

    # an orderly stop writes the checkpoints; what comes meanwhile is read at the next start, once
    wait("the checkpoints", lambda: caught_up(st), a)
    assert "cluster analyzer: active: a; feed read up to 3 of 3 (0 behind)" in status(mongo_db)
    assert a.stop() == 0
    assert "cluster analyzer: no replica active; feed read up to 3 of 3 (0 behind)" in status(mongo_db)
    st.record_batch([xid("n2", 20, code="XID-95")], [])
    b = analyzers("b", "--checkpoint-interval", "10m")  # writes no checkpoint of its own before it is killed
    wait("the third event counted", lambda: count(mongo_db, "n2") == 3, b)
    st.record_batch([xid("n3", 30)], [])
    wait("the fourth event counted", lambda: count(mongo_db, "n3") == 4, b)
    assert b.stop(signal.SIGKILL) == -signal.SIGKILL

    # two replicas: one takes the lease once b's runs out; it reads again from a's checkpoints (b counted
    # 20 and 30 after them) and counts nothing twice
    c, d = analyzers("c"), analyzers("d")
    wait("one replica active", lambda: c.says("active as") or d.says("active as"), None, 30)
    active, standby = (c, d) if c.says("active as") else (d, c)
    st.record_batch([xid("n3", 40)], [])
    wait("the fifth event counted", lambda: count(mongo_db, "n3") == 5 and caught_up(st), active)
    assert (count(mongo_db, "n2"), count(mongo_db, "n1")) == (3, None)
    assert not standby.says("active as")

    # the active replica dies: the standby takes over from the checkpoints
    assert active.stop(signal.SIGKILL) == -signal.SIGKILL
    wait("the standby taking over", lambda: standby.says("active as"), standby, 30)
    st.record_batch([xid("n1", 50)], [])
    wait("the sixth event counted", lambda: count(mongo_db, "n1") == 6 and caught_up(st), standby)
    time.sleep(1)  # a record counted twice would show by now
    assert [count(mongo_db, n) for n in ("n1", "n2", "n3")] == [6, 3, 5]
    assert standby.stop() == 0
    # no process of any replica is left: the second processes end with their first, or die with it
    wait("every analyzer process gone", lambda: not analyzerutil.second_processes(), None, 10)


def test_a_replica_whose_second_process_dies_stops_and_a_standby_takes_over(
    analyzers: Any, mongo_db: Any
) -> None:
    """The processes of a replica are one Bytewax cluster: without one of them it cannot go on, so the
    first stops (exit 1) instead of hanging, and the standby takes the lease and counts what came."""
    st = store.Store(mongo_db)
    a = analyzers("a", processes=2)
    wait("its second process", lambda: a.says("analyzer: process 1 of 2 of a joining"), a)
    standby = analyzers("b")
    st.record_batch([xid("n1", 0)], [])
    wait("the feed read", lambda: caught_up(st), a)
    (second,) = analyzerutil.second_processes(a.popen.pid)
    os.kill(second, signal.SIGKILL)
    assert a.popen.wait(20) == 1
    a.log.close()
    assert a.says("analyzer: process 1 of 2 exited with -9: stopping")
    wait("the standby taking over", lambda: standby.says("active as b"), standby, 30)
    st.record_batch([xid("n2", 10)], [])
    wait("the event after counted", lambda: count(mongo_db, "n2") == 2, standby)
    assert standby.stop() == 0


def test_two_pods_are_one_cluster_whose_windows_are_kept_in_both_and_count_once_across_their_loss(
    analyzers: Any, mongo_db: Any
) -> None:
    """An analyzer spread over pods (`--peer` for each pod, as the chart's StatefulSet gives them; here two
    pods on loopback, each told its place): pod 0 takes the lease and reads, pod 1 joins it; both keep
    windows (each writes the checkpoints of its partitions) and their faults count every event once. A pod
    running other settings (an update half done) waits instead of joining, and pod 0 waiting for it still
    stops on SIGTERM, giving the lease back. When pod 1 is killed, pod 0 stops (exit 1, said): the cluster
    cannot go on without it; started again, the two go on from the checkpoints. Pod 1 stopped by a signal
    stops at once (exit 0) and pod 0 with it (exit 1); when pod 0 stops, pod 1's flow ends with it (exit
    0)."""
    st = store.Store(mongo_db)
    peers = [f"127.0.0.1:{procs.free_port()}", f"127.0.0.1:{procs.free_port()}"]
    flags = [arg for p in peers for arg in ("--peer", p)]
    gpus = [f"GPU-{i}" for i in range(12)]  # windows of 12 GPUs: spread over both pods' partitions
    st.record_batch([xid("n1", i, uuid=g) for i, g in enumerate(gpus)], [])

    rounds = iter(range(100))

    def both(leader: Any = None) -> tuple[Any, Any]:
        n = next(rounds)  # a log of its own each time: what it says is this start's
        member = analyzers(f"pod-1-{n}", *flags, "--peer-index", "1")  # may start first: it waits for pod 0
        if leader is None:  # no lease held: pod 1 waits for it
            wait(
                "pod 1 waiting",
                lambda: member.says(f"analyzer: pod 1 of 2: waiting for pod 0 ({peers[0]})"),
                member,
            )
            leader = analyzers(f"pod-0-{n}", *flags, "--peer-index", "0")
        wait("pod 0 active", lambda: leader.says(f"analyzer: active as analyzer/{peers[0]}/"), leader)
        wait(
            "pod 1 joining",
            lambda: member.says("analyzer: pod 1 of 2 (processes 1 to 1 of 2) joining"),
            member,
        )
        return leader, member

    # a pod 1 of other settings (the checkpoints' interval) does not join pod 0: it waits, and stops on a signal
    leader = analyzers("pod-0-first", *flags, "--peer-index", "0")
    odd = analyzers("pod-1-old", *flags, "--peer-index", "1", "--checkpoint-interval", "300ms")
    wait(
        "pod 1 of other settings waiting",
        lambda: odd.says("pod 0 holds the lease running other settings"),
        odd,
    )
    assert odd.stop() == 0 and odd.says("analyzer: stopped") and not odd.says("joining")
    # pod 0, whose cluster never formed, stops on SIGTERM all the same and gives the lease back
    wait(
        "pod 0 forming its cluster",
        lambda: leader.says("analyzer: process 0 of 2 (pod 0 of 2) listening"),
        leader,
    )
    assert leader.stop() == 0 and leader.says("stopped before its cluster formed (the lease given back)")
    assert st.analyzer_lease() is None
    leader, member = both()
    st.record_batch([xid("n2", 100 + i, uuid=g, code="XID-95") for i, g in enumerate(gpus)], [])
    wait("every GPU's derived fault", lambda: all(gpu_count(mongo_db, "n2", g) == 2 for g in gpus), leader)
    wait("the checkpoints", lambda: caught_up(st), leader)
    owners = {d["owner"].split("/")[1] for d in mongo_db["analyzer"].find({}, {"owner": 1})}
    assert owners == {peers[0], socket.gethostname()}  # pod 0's partitions, and pod 1's

    # pod 1 is lost: pod 0 cannot go on and says why; both again, from the checkpoints
    assert member.stop(signal.SIGKILL) == -signal.SIGKILL
    assert leader.popen.wait(30) == 1
    leader.log.close()
    assert leader.says("analyzer: the cluster's flow failed (a pod of it gone?)")
    st.record_batch([xid("n3", 200 + i, uuid=g) for i, g in enumerate(gpus)], [])  # while none runs
    leader, member = both()
    wait("every third event counted", lambda: all(gpu_count(mongo_db, "n3", g) == 3 for g in gpus), leader)
    wait("the feed read", lambda: caught_up(st), leader)
    time.sleep(1)  # a record counted twice would show by now
    assert [gpu_count(mongo_db, n, g) for n in ("n2", "n3") for g in gpus] == [2] * 12 + [3] * 12

    # pod 1 stopped by a signal: at once, and pod 0's flow fails with it
    assert member.stop() == 0 and member.says("analyzer: stopped")
    assert leader.popen.wait(30) == 1
    leader.log.close()
    leader, member = both()

    # pod 0 stops (its lease given back): pod 1's flow ends with the cluster's
    assert leader.stop() == 0
    assert member.popen.wait(30) == 0
    member.log.close()
    assert member.says("analyzer: the cluster's flow ended: stopped")


def gpu_count(db: Any, node: str, gpu: str) -> int | None:
    doc = db["faults"].find_one({"_id": fault_id(node, "GPU-UUID", gpu, "GPU-REPEATED-FAILURE")})
    return None if doc is None else int(doc["count"])


def test_windows_keyed_by_a_node_label_read_from_the_api_server(
    analyzers: Any, mongo_db: Any, cluster: LocalCluster, api: Any
) -> None:
    """A topology key: the zone label of the nodes, as the analyzer reads it from the real API server."""
    names = cluster.node_names[:4]
    zones = {names[0]: "zone-a", names[1]: "zone-a", names[2]: "zone-b", names[3]: "zone-a"}
    for name, zone in zones.items():
        kube.nodes.patch(api, name, {"metadata": {"labels": {ZONE: zone}}})
    try:
        a = analyzers("a", "--kubeconfig", str(cluster.kubeconfig))
        wait("the analyzer taking the lease", lambda: a.says("analyzer: active as a"), a)
        st = store.Store(mongo_db)
        for i, name in enumerate(names[:3]):  # two nodes of zone-a and one of zone-b: no incident yet
            st.record_batch([xid(name, 100 + i, uuid=f"GPU-{i}")], [])
        wait("caught up", lambda: caught_up(st), a)
        assert st.faults.count_documents({"code": "ZONE-INCIDENT"}) == 0
        st.record_batch([xid(names[3], 110, uuid="GPU-3")], [])  # the third node of zone-a
        wait("the zone incident", lambda: st.faults.count_documents({"code": "ZONE-INCIDENT"}) == 3, a)
        got = {d["node"]: (d["entity"], d["count"]) for d in st.faults.find({"code": "ZONE-INCIDENT"})}
        assert got == {n: ({"type": "ZONE", "id": "zone-a"}, 3) for n in (names[0], names[1], names[3])}
        assert a.stop() == 0
    finally:
        for name in zones:
            kube.nodes.patch(api, name, {"metadata": {"labels": {ZONE: None}}})


def test_one_replica_holds_the_lease_and_one_that_lost_it_learns_so(mongo_db: Any) -> None:
    from dataflows.cluster import Leadership  # noqa: PLC0415

    st = store.Store(mongo_db)
    lease = dt.timedelta(seconds=1)
    a, b = Leadership(st, "a", lease), Leadership(st, "b", lease)
    assert a.try_acquire() and a.holding()
    assert not b.try_acquire()  # a holds it
    time.sleep(1.2)  # a stopped renewing (a long pause, cut off from the store): its lease ran out
    assert b.try_acquire() and b.holding()
    lost = threading.Event()
    a.keep(on_lost=lost.set)  # a comes back and renews: it learns it was taken over
    assert lost.wait(5) and a.lost.is_set() and not a.holding()
    a.release()  # gives nothing back: it holds nothing
    assert not Leadership(st, "c", lease).try_acquire()  # b still holds it
    b.release()  # an orderly stop gives it back at once
    c = Leadership(st, "c", lease)
    assert c.try_acquire()
    c.release()
