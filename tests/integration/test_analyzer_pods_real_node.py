"""The analyzer spread over pods on two machines: `helm install` with `analyzer.pods: 2` into the local
cluster with a second real node added (its own kubelet and containerd), the session's FerretDB as the
store, the agent off.

The StatefulSet's two pods land on different real nodes (the chart's default anti-affinity), find each
other by their stable names (the headless Service, published before they are Ready) and run as one
Bytewax cluster: pod 0 takes the lease and reads the feed, both keep windows (each writes the checkpoints
of its own partitions), and every GPU's repeated failure is derived once. When pod 1 is deleted, pod 0's
flow fails and its container starts again; the StatefulSet's new pod 1 joins it and they go on from the
checkpoints, counting nothing twice. `helm uninstall` then leaves the nodes as they were; the added node
is stopped and its Node deleted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from devtools import procs
from devtools.cluster import LocalCluster
from faultline import kube, store
from faultline.errors import NotFoundError, TransientError
from faultline.models import Action, Component, Entity, HealthEvent, event_id, fault_id
from tests.integration import analyzerutil, chartutil
from tests.integration.chartutil import NODE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),  # the first real-node test starts the cluster and may build the image
    pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)"),
]
RELEASE = "flp"
SECOND = "real-node-02"
GPUS = [f"GPU-{i}" for i in range(16)]  # windows of 16 GPUs: spread over both pods' partitions
PACK = analyzerutil.gpu_repeat_pack("pods")
T0 = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)


def xid(node: str, second: int, gpu: str) -> HealthEvent:
    ts = T0 + dt.timedelta(seconds=second)
    return HealthEvent(
        id=event_id(node, "kmsg", "GPU", "0000:3b:00", "XID-79", ts), node=node, component=Component.GPU,
        check="xid", code="XID-79", entities=(Entity(type="GPU", id="0000:3b:00"),), healthy=False, fatal=True,
        action=Action.RESTART_BM, metadata={"gpu_uuid": gpu}, generated_at=ts, observed_at=ts,
    )  # fmt: skip


@pytest.fixture
def second_node(real_cluster: LocalCluster) -> Iterator[str]:
    """A second real node for the test's pods; stopped and its Node deleted after."""
    real = real_cluster.real
    assert real is not None
    api = real_cluster.api()
    real.add_node(SECOND)
    try:
        procs.wait_for(f"{SECOND} Ready", lambda: _node_ready(api, SECOND), 90, interval=1)
        yield SECOND
    finally:
        real.remove_node(SECOND)
        with contextlib.suppress(ApiException):  # already gone
            kube.core(api).delete_node(SECOND)


def _node_ready(api: Any, name: str) -> bool:
    try:
        return kube.nodes.conditions(api, name).get("Ready", {}).get("status") == "True"
    except NotFoundError:  # not registered yet
        return False


def _count(db: Any, node: str, gpu: str) -> int | None:
    doc = db["faults"].find_one({"_id": fault_id(node, "GPU-UUID", gpu, "GPU-REPEATED-FAILURE")})
    return None if doc is None else int(doc["count"])


@pytest.mark.usefixtures("sim_nodes_cordoned")
def test_the_analyzer_runs_as_one_cluster_of_pods_on_two_real_nodes(
    real_cluster: LocalCluster, second_node: str, real_store: str, store_db: tuple[str, Any],
    helm_env: dict[str, str], tmp_path: Path,
) -> None:  # fmt: skip
    started = time.monotonic()
    seconds: dict[str, float] = {}
    api = real_cluster.api()
    core = kube.core(api)
    database, db = store_db
    ns = f"flp-{uuid.uuid4().hex[:6]}"
    uri = f"mongodb://{real_store}/?retryWrites=false&directConnection=true"
    values = chartutil.chart_values(real_cluster, uri, database, tmp_path / "node" / "state")
    values["agent"]["enabled"] = False
    values["retention"] = {"enabled": False}
    values["analyzer"] = {
        "enabled": True, "pods": 2, "builtinPacks": False, "packs": {"pods.yaml": PACK}, "nodeLabels": False,
        "config": {"poll": "100ms", "checkpoint_interval": "300ms", "lease": "10s"},
    }  # fmt: skip
    st = store.Store(db)
    st.record_batch(
        [xid("n1", i, g) for i, g in enumerate(GPUS)], []
    )  # before the analyzer: read at its start

    def pods() -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in release.pods()
                if not p["metadata"].get("deletionTimestamp")}  # fmt: skip

    def both_running() -> bool:
        now = pods()
        return len(now) == 2 and all(chartutil.ready(p) for p in now.values())

    def wait(what: str, check: Any, timeout: float = 120) -> None:
        try:
            procs.wait_for(what, check, timeout, interval=0.5)
        except TransientError as exc:
            raise AssertionError(f"{exc}\n{release.diagnosis()}") from exc

    with chartutil.Release(
        real_cluster, helm_env, RELEASE, ns, values=tmp_path / "values.yaml", db=db
    ) as release:
        core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
        installed = release.install(values)
        wait("both analyzer pods Ready", both_running)
        seconds["install to Ready"] = time.monotonic() - installed
        running = pods()
        assert sorted(running) == [f"{RELEASE}-analyzer-0", f"{RELEASE}-analyzer-1"], running
        placed = {name: p["spec"]["nodeName"] for name, p in running.items()}
        assert sorted(placed.values()) == sorted([NODE, second_node]), placed  # on two machines

        st.record_batch([xid("n2", 100 + i, g) for i, g in enumerate(GPUS)], [])
        written = time.monotonic()
        wait("every GPU's derived fault", lambda: all(_count(db, "n2", g) == 2 for g in GPUS))
        seconds["events to derived faults"] = time.monotonic() - written
        owners = {d["owner"].split("/")[1] for d in db["analyzer"].find({}, {"owner": 1})}
        first, second = sorted(running)
        assert len(owners) == 2 and any(o.startswith(f"{first}.") for o in owners) and second in owners, (
            owners
        )

        # pod 1 lost: pod 0's flow fails and its container starts again; the new pod 1 joins it
        core.delete_namespaced_pod(second, ns, grace_period_seconds=0)
        wait(
            "pod 0's container started again",
            lambda: sum(chartutil.restarts(pods().get(first) or {"status": {}})) >= 1,
        )
        st.record_batch([xid("n3", 200 + i, g) for i, g in enumerate(GPUS)], [])
        wait("both pods Ready again", both_running, 180)
        wait("every third event counted", lambda: all(_count(db, "n3", g) == 3 for g in GPUS), 180)
        time.sleep(1)  # a record counted twice would show by now
        assert [_count(db, n, g) for n in ("n2", "n3") for g in GPUS] == [2] * len(GPUS) + [3] * len(GPUS)
        log = core.read_namespaced_pod_log(first, ns, previous=True)
        assert "analyzer: the cluster's flow failed (a pod of it gone?)" in log, log

        release.uninstall()
        seconds["test"] = time.monotonic() - started
        print("\nanalyzer over two real nodes: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
