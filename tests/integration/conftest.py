"""Session-scoped real infrastructure: a local control plane with simulated GPU nodes, and FerretDB.

Each test gets its own namespace or database. The binaries are built (or found current) by the
fixtures themselves, so these tests never skip. When the session's fixtures end, no process they
started may be left: the outermost fixture asserts it.

`real_cluster` is a second control plane with a real node (kubelet, containerd, runc, bridge CNI; needs
root), started only by the tests that ask for it; when it stops, the machine must be as it was before it
started (addresses, links, iptables rules, mounts, network namespaces, cgroups, processes): asserted by
`no_host_change_left_behind` at the end of the session.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest

from devtools import procs, realnode_check, realnode_host, tools
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube

# Imported while pytest collects, before any test of this run starts.
RUN_STARTED = time.time()
INFRA = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "ferretdb",
    "postgres",
    "runuser",
)
STARTED: list[int] = []


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    yield
    left = [pid for pid in STARTED if procs.alive(pid)]
    named = [f"{pid} {name}" for pid, name in procs.pids_named(INFRA) if pid in STARTED]
    assert not left, f"processes left after the session: {named or left}"


@pytest.fixture(scope="session")
def built_this_run() -> Callable[[Path], bool]:
    """built_this_run(path): whether the file was written during this test run. The image modules use an
    image that another test of the same run built (test_image.py as the first of the two builds it
    compares, test_store_images.py as the store images it examines), never one from before the run (its
    recipe may have changed since)."""

    def written(path: Path) -> bool:
        return path.is_file() and path.stat().st_mtime >= RUN_STARTED

    return written


HOST_CHANGES: list[str] = []  # what a real-node cluster left on the machine after it stopped


@pytest.fixture(scope="session", autouse=True)
def no_host_change_left_behind() -> Iterator[None]:
    yield
    assert not HOST_CHANGES, f"real nodes left changes on the machine: {HOST_CHANGES}"


@pytest.fixture(scope="session")
def real_nodes_watched() -> Iterator[None]:
    """Asked for by whatever starts real nodes: at the session's end, none of their marks (state files,
    node addresses, bridges, iptables chains, container cgroups, mounts) may be on the machine."""
    yield
    HOST_CHANGES.extend(realnode_check.leftovers())


@pytest.fixture(scope="session")
def real_cluster(mongo: LocalMongo, real_nodes_watched: None) -> Iterator[LocalCluster]:
    """One real node and one simulated node, and the project's image in the cluster's loopback registry
    (`cluster.real.image`). Needs root."""
    # Real nodes of an earlier run that was killed (their owner is gone) are undone first, as starting
    # would undo them anyway: the comparison below is of this session's own changes.
    for cleaned in realnode_host.cleanup_stale():
        print(f"undid the host changes of a dead earlier run's real nodes ({cleaned})")
    before = realnode_check.host_snapshot()
    c = LocalCluster(nodes=1, real_nodes=1, node_prefix="sim-node")
    try:
        c.start()
        assert c.real is not None
        STARTED.extend(p.pid for p in (*c.procs, *c.real.procs))
        if c.real.registry.proc is not None:
            STARTED.append(c.real.registry.proc.pid)
        yield c
    finally:
        work = c.dir / "real"
        c.stop()
        after = realnode_check.host_snapshot()
        HOST_CHANGES.extend(realnode_check.snapshot_diff(before, after))
        HOST_CHANGES.extend(f"process {pid}" for pid in realnode_host.processes_under(work))


@pytest.fixture(scope="session")
def real_store(real_cluster: LocalCluster, mongo: LocalMongo) -> str:
    """The session's FerretDB as pods on the real node reach it (host:port)."""
    return real_cluster.expose(mongo.port)


@pytest.fixture
def sim_nodes_cordoned(real_cluster: LocalCluster) -> Iterator[None]:
    """The simulated nodes of the real-node cluster run no real pod: cordoned, a test's pods (and the
    chart's) can only go to the real node."""
    api = real_cluster.api()
    for sim in real_cluster.node_names:
        kube.nodes.patch(api, sim, {"spec": {"unschedulable": True}})
    try:
        yield
    finally:
        for sim in real_cluster.node_names:
            kube.nodes.patch(api, sim, {"spec": {"unschedulable": None}})


@pytest.fixture
def helm_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a test's helm commands: its cache, configuration and data in the test's own
    directory (an OCI chart pulled by one test is not another's)."""
    tools.ensure("helm")
    return {**os.environ, "HELM_CACHE_HOME": str(tmp_path / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(tmp_path / "helm" / "config"),
            "HELM_DATA_HOME": str(tmp_path / "helm" / "data")}  # fmt: skip


@pytest.fixture
def store_db(mongo: LocalMongo) -> Iterator[tuple[str, Any]]:
    """A database of its own in the session's FerretDB for a chart's release: its name and a handle."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo.uri, serverSelectionTimeoutMS=10_000)
    name = f"t_chart_{uuid.uuid4().hex[:8]}"
    try:
        yield name, client[name]
    finally:
        client.drop_database(name)
        client.close()


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(nodes=5) as c:
        STARTED.extend(p.pid for p in c.procs)
        yield c


@pytest.fixture(scope="session")
def mongo() -> Iterator[LocalMongo]:
    with LocalMongo() as m:
        assert m.proc is not None
        STARTED.append(m.proc.pid)
        yield m


@pytest.fixture(scope="session")
def mongo_pg() -> Iterator[LocalMongo]:
    """FerretDB storing in PostgreSQL (what the throughput benchmarks use): the store's contract is
    tested on it too."""
    with LocalMongo(backend="postgresql") as m:
        assert m.proc is not None and m.postgres is not None and m.postgres.proc is not None
        STARTED.extend((m.proc.pid, m.postgres.proc.pid))
        yield m


@pytest.fixture
def api(cluster: LocalCluster) -> Any:
    return cluster.api()


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"t-{request.node.name[:40].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:6]}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-")
    core = kube.core(cluster.api())
    core.create_namespace({"metadata": {"name": name}})
    procs.wait_for(
        "the namespace's default ServiceAccount",
        lambda: bool(core.read_namespaced_service_account("default", name)),
        30,
    )
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def mongo_db(mongo: LocalMongo, request: pytest.FixtureRequest) -> Iterator[Any]:
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo.uri, serverSelectionTimeoutMS=10_000)
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield client[name]
    client.drop_database(name)
    client.close()
