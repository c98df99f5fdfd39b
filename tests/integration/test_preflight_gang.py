"""Gangs end to end on the real control plane and FerretDB: four `faultline preflight` processes, as the
init containers of a four-pod job would run (each its node's simulated GPUs, the job's ServiceAccount
with only the chart's `<release>-preflight-gang` ClusterRole bound in its namespace, the gang named by
JobSet's label).

- one member's GPU has a pending row remapping: it fails, its gang's Lease says so, and the three others,
  passed and waiting for the gang, stop at once with the gang's reason (their timeout is far away); its
  finding reaches its node's agent through the ingest socket, becomes a fault in the store, and the
  quarantine worker cordons and taints the node;
- a gang whose four members pass proceeds together, and sends nothing to the agent."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import procs, tools
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import conditions, kube, store
from faultline.kube import lite
from faultline.kube import preflight as ops
from tests.integration.test_agent import poll, running_agent, sim
from workers import breaker, gang, quarantine

pytestmark = pytest.mark.integration
CHART = Path(__file__).resolve().parents[2] / "charts" / "faultline"
GANG = "jobset.sigs.k8s.io/jobset-name=train,jobset.sigs.k8s.io/restart-attempt=0"


def gang_role(api: Any, namespace: str) -> None:
    """The chart's gang ClusterRole (as `helm template` renders it), bound to the namespace's
    ServiceAccounts as preflight.gang.namespaces does."""
    out = subprocess.run(
        [
            str(tools.binary("helm")),
            "template",
            "fl",
            str(CHART),
            "--namespace",
            "fl",
            "--set",
            "preflight.enabled=true",
            "--set",
            f"preflight.gang.namespaces={{{namespace}}}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d and d["metadata"]["name"] == "fl-preflight-gang"]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["metadata"]["namespace"] == namespace
    role["metadata"]["name"] = binding["roleRef"]["name"] = f"{namespace}-gang"  # one per test: cluster-wide
    rbac = kube.rbac(api)
    with kube.client.translated("create", "ClusterRole"):
        rbac.create_cluster_role(role)
    with kube.client.translated("create", "RoleBinding"):
        rbac.create_namespaced_role_binding(namespace, binding)


@contextlib.contextmanager
def job_identity(cluster: LocalCluster, api: Any, namespace: str) -> Iterator[Path]:
    """A kubeconfig of the job's ServiceAccount, allowed the gang's Leases and nothing more."""
    kube.core(api).create_namespaced_service_account(namespace, {"metadata": {"name": "trainer"}})
    gang_role(api, namespace)
    user, groups = kube.access.service_account(namespace, "trainer")
    procs.wait_for(
        "the gang role in effect",
        lambda: kube.access.allowed(
            api,
            user,
            groups,
            verb="create",
            group="coordination.k8s.io",
            resource="leases",
            namespace=namespace,
        ),
        30,
    )
    assert not kube.access.allowed(
        api, user, groups, verb="create", group="coordination.k8s.io", resource="leases", namespace="default"
    )
    try:
        yield cluster.service_account_kubeconfig(namespace, "trainer")
    finally:
        with contextlib.suppress(Exception), kube.client.translated("delete", "ClusterRole"):
            kube.rbac(api).delete_cluster_role(f"{namespace}-gang")


def member(
    i: int, node: str, namespace: str, kubeconfig: Path, sim_dir: Path, tmp: Path, socket: Path | None = None
) -> subprocess.Popen[str]:
    """`faultline preflight` as the webhook's init container runs it (its environment), on the sim backend."""
    env = {
        **os.environ,
        "NODE_NAME": node,
        "POD_NAME": f"train-{i}",
        "POD_NAMESPACE": namespace,
        "FAULTLINE_GANG": GANG,
        "FAULTLINE_GANG_SIZE": "4",
        "FAULTLINE_EXPECTED_GPUS": "8",
        "FAULTLINE_GANG_TIMEOUT": "10m",
        "FAULTLINE_GANG_POLL": "200ms",
    }
    argv = [
        sys.executable,
        "-m",
        "faultline",
        "preflight",
        "--gpu-backend",
        "sim",
        "--sim-dir",
        str(sim_dir),
        "--kubeconfig",
        str(kubeconfig),
        "--termination-log",
        str(tmp / f"termination-{i}"),
    ]
    if socket is not None:
        argv += ["--ingest-socket", str(socket)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise
    return proc.returncode, err


def states(client: lite.Client, namespace: str) -> dict[str, str]:
    doc = ops.read_lease(client, namespace, gang.lease_name(GANG))
    return {m.pod: m.state for m in gang.parse(doc).members.values()} if doc else {}


def test_a_gang_with_one_bad_member_fails_fast_and_the_node_is_quarantined(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, namespace: str, tmp_path: Path
) -> None:
    nodes = cluster.node_names[:4]
    bad = nodes[1]
    sim(tmp_path, bad, "--gpu", "2", "--field", "remapped_rows_pending=1")  # what preflight reads; the agent
    # follows GPUs of its own (another directory), so only the preflight's report can quarantine the node
    socket = tmp_path / "run" / "ingest.sock"
    admin = lite.Client.connect(cluster.kubeconfig)
    core = kube.core(api)
    procs_: list[subprocess.Popen[str]] = []
    worker = None
    try:
        with (
            job_identity(cluster, api, namespace) as kubeconfig,
            running_agent(cluster, mongo, bad, tmp_path / "agent", "--ingest-socket", str(socket)) as faults,
        ):
            st = store.Store(faults.database)
            st.ensure_indexes()
            worker = quarantine.QuarantineWorker(
                st,
                api,
                quarantine.Settings(
                    resync_interval=0.3,
                    lease=dt.timedelta(seconds=5),
                    threads=2,
                    breaker=breaker.BreakerConfig(max_share=None, max_count=None),
                ),
                "q-preflight",
            )
            worker.start()
            procs.wait_for("the ingest socket", socket.exists, 10)
            good = [i for i, _ in enumerate(nodes) if i != 1]
            procs_ = [member(i, nodes[i], namespace, kubeconfig, tmp_path, tmp_path) for i in good]
            poll(
                "three members passed and waiting",
                lambda: states(admin, namespace) == {f"train-{i}": "passed" for i in good},
                60,
            )
            assert all(p.poll() is None for p in procs_)  # waiting for the fourth

            code, err = finish(member(1, bad, namespace, kubeconfig, tmp_path, tmp_path, socket))
            assert code == 1, err
            reason = (tmp_path / "termination-1").read_text()
            assert reason.startswith(
                "preflight remap failed: PREFLIGHT-REMAP-PENDING on GPU 0000:3a:00: a row "
                "remapping waits for a GPU reset"
            )
            for i, proc in zip(good, procs_, strict=True):
                code, err = finish(proc)
                assert code == 1, err
                text = (tmp_path / f"termination-{i}").read_text()  # the gang's reason, not its timeout (10m)
                assert text.startswith(
                    f"gang {GANG}: member train-1 on node {bad} failed preflight: preflight "
                    "remap failed: PREFLIGHT-REMAP-PENDING on GPU 0000:3a:00"
                ), text
            assert states(admin, namespace)["train-1"] == "failed"

            # the node: a fault from the ingest socket, cordoned and tainted by the quarantine worker
            poll(
                "the preflight fault",
                lambda: faults.find_one({"node": bad, "code": "PREFLIGHT-REMAP-PENDING"}),
                20,
            )
            doc = faults.find_one({"node": bad, "code": "PREFLIGHT-REMAP-PENDING"})
            assert (doc["fatal"], doc["action"], doc["entity"]) == (
                True,
                "COMPONENT_RESET",
                {"type": "GPU", "id": "0000:3a:00"},
            )
            poll("cordoned", lambda: bool(core.read_node(bad).spec.unschedulable), 20)
            taints = {(t.key, t.value) for t in core.read_node(bad).spec.taints or []}
            assert ("faultline.io/fault", "PREFLIGHT-REMAP-PENDING") in taints
            assert faults.count_documents({"node": {"$ne": bad}}) == 0  # the others reported nothing
    finally:
        for proc in procs_:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
        if worker is not None:
            worker.halt()
        admin.close()
        _release(api, bad)


def test_a_gang_whose_members_all_pass_proceeds_and_reports_nothing(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, namespace: str, tmp_path: Path
) -> None:
    nodes = cluster.node_names[:4]
    socket = tmp_path / "run" / "ingest.sock"
    with (
        job_identity(cluster, api, namespace) as kubeconfig,
        running_agent(cluster, mongo, nodes[0], tmp_path / "agent", "--ingest-socket", str(socket)) as faults,
    ):
        procs.wait_for("the ingest socket", socket.exists, 10)
        members = [
            member(i, node, namespace, kubeconfig, tmp_path, tmp_path, socket if i == 0 else None)
            for i, node in enumerate(nodes)
        ]
        results = [finish(p) for p in members]
        assert [code for code, _ in results] == [0, 0, 0, 0], results
        assert not list(tmp_path.glob("termination-*"))  # success writes nothing
        client = lite.Client.connect(cluster.kubeconfig)
        assert states(client, namespace) == {f"train-{i}": "passed" for i in range(4)}
        client.close()
        codes = [e["code"] for e in faults.database["health_events"].find({"node": nodes[0]})]
        assert [c for c in codes if c.startswith("PREFLIGHT-")] == [], codes  # and sends nothing


def _release(api: Any, node: str) -> None:
    """The node is shared with the session's other tests: faultline's cordon, taint, labels, annotations
    and conditions taken off."""
    node_doc = kube.core(api).read_node(node)
    taints = [
        {"key": t.key, "value": t.value, "effect": t.effect}
        for t in node_doc.spec.taints or []
        if not t.key.startswith("faultline.io/")
    ]
    meta = {
        kind: {k: None for k in getattr(node_doc.metadata, kind) or {} if k.startswith("faultline.io/")}
        for kind in ("labels", "annotations")
    }
    kube.core(api).patch_node(
        node, {"metadata": meta, "spec": {"unschedulable": None, "taints": taints or None}}
    )
    kube.nodes.write_conditions(api, node, [], sorted(conditions.OWNED_TYPES))
