"""The store the chart brings, as real pods (issue 13): `helm install oci://<loopback registry>/faultline`
with the default store (embedded: FerretDB in front of PostgreSQL), only the agent on (simulated GPUs),
into the local cluster with a real kubelet node. The store's images are the ones `make image-store` built,
pushed by digest and signed beside the project's; the PostgreSQL claim, naming no storage class, gets the
cluster's default one and a volume its provisioner makes (`devtools.volumes`); the pods find FerretDB and
PostgreSQL by their Service names (`devtools.clusterdns`) and reach them through kube-proxy.

(a) install: PostgreSQL (StatefulSet, its claim bound to a provisioned volume), FerretDB and the agent run on
    the real node, Ready, never restarted; an XID 79 on the agent's simulated GPU ends up in the embedded
    store, read from the host through FerretDB's Service (kube-proxy) with the Secret's URI, and the
    cluster DNS gives pods the name that URI holds;
(b) `helm upgrade` that rolls PostgreSQL and FerretDB (new resource requests): the same password, the
    fault still there (the volume kept the data), and a new fault written after it;
(c) `helm uninstall`: no pod, workload or Service of the release. The store's Secret (made by the chart's
    Secrets hook, not the release's: it holds the password the data was initialised with) and the
    PostgreSQL claim (a StatefulSet's claims outlive it) stay by design; the test removes them, and the
    provisioner then deletes the released volume and its directory.
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any, NoReturn

import dns.message
import dns.query
import pymongo
import pymongo.errors
import pytest

from devtools import procs, volumes
from devtools.cluster import LocalCluster
from faultline import kube
from faultline.errors import NotFoundError, TransientError
from sources import simulator
from tests.integration import chartutil
from tests.integration.chartutil import NODE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),  # the first real-node test starts the cluster: tools built, images pushed
    pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)"),
]
RELEASE = "fls"
STORAGE_CLASS = volumes.DEFAULT_CLASS  # the cluster's default: the chart's claim names no class
STORE = ("postgres", "ferretdb")


def _by_digest(ref: str) -> dict[str, str]:
    repository, _, digest = ref.partition("@")
    return {"repository": repository, "digest": digest}


def _values(
    cluster: LocalCluster, store: dict[str, str], state: Path, *, memory: str = "256Mi"
) -> dict[str, Any]:
    """The default store (embedded) with the registry's images and the test's storage class; `memory`:
    PostgreSQL's and FerretDB's memory request (an upgrade that changes it rolls both)."""
    assert cluster.real is not None
    return {
        "image": _by_digest(cluster.real.image),
        "store": {
            "embedded": {
                "ferretdb": {"image": _by_digest(store["ferretdb"]),
                             "resources": {"requests": {"cpu": "50m", "memory": memory}}},
                "postgres": {"image": _by_digest(store["postgres"]),
                             "storage": {"size": "1Gi"},  # storageClass "": the cluster's default
                             "resources": {"requests": {"cpu": "100m", "memory": memory}}},
            },
        },
        "agent": {
            "gpuBackend": "sim",
            "stateDir": str(state),
            "ingestSocket": str(state.parent / "ingest" / "ingest.sock"),
            "sysfsRoot": "",
            "terminationGracePeriodSeconds": 10,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "config": {"sim_dir": str(state / "sim"), "gpu_poll_interval": "500ms",
                       "repair_poll_interval": "500ms", "repair_idle_poll_interval": "2s", "snapshot_interval": "2s"},
        },
    }  # fmt: skip


def _read(api: Any, kind: str, name: str, ns: str | None = None) -> dict[str, Any]:
    """An object as plain JSON; `kind` as the client names it (secret, service, persistent_volume_claim,
    persistent_volume)."""
    core = kube.core(api)
    if ns is None:
        return dict(kube.client.read_json("read", name, getattr(core, f"read_{kind}"), name))
    return dict(kube.client.read_json("read", name, getattr(core, f"read_namespaced_{kind}"), name, ns))


def _secret(api: Any, ns: str) -> dict[str, str]:
    data = _read(api, "secret", f"{RELEASE}-store", ns).get("data") or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def _store_client(api: Any, ns: str) -> pymongo.MongoClient[Any]:
    """The embedded store as the release's pods reach it (the Secret's URI), but at FerretDB's cluster IP
    in place of its name: from the host, through kube-proxy's rules."""
    uri = _secret(api, ns)["uri"]
    name = f"{RELEASE}-ferretdb.{ns}.svc:27017"
    assert name in uri, uri.split("@")[-1]
    ip = _read(api, "service", f"{RELEASE}-ferretdb", ns)["spec"]["clusterIP"]
    return pymongo.MongoClient(uri.replace(name, f"{ip}:27017"), serverSelectionTimeoutMS=3000)


def _faults(client: pymongo.MongoClient[Any]) -> list[dict[str, Any]]:
    """The faults of the real node in the store ([] while the store does not answer)."""
    try:
        return list(client["faultline"]["faults"].find({"node": NODE}))
    except pymongo.errors.PyMongoError:
        return []


def _fail(message: str, release: chartutil.Release) -> NoReturn:
    raise AssertionError(f"{message}\n{release.diagnosis()}")


@pytest.mark.usefixtures("sim_nodes_cordoned")
def test_the_chart_brings_its_store_as_real_pods_keeps_it_across_an_upgrade_and_leaves_the_data_at_uninstall(
    real_cluster: LocalCluster, helm_env: dict[str, str], tmp_path: Path
) -> None:
    real = real_cluster.real
    assert real is not None and real.state is not None
    assert not real.proxy_off, f"Services are not routed on this cluster's real node: {real.proxy_off}"
    started = time.monotonic()
    api = real_cluster.api()
    core = kube.core(api)
    store_images = real.registry.push_store_images()
    ns = f"fls-{uuid.uuid4().hex[:6]}"
    state = tmp_path / "node" / "state"
    (state / "sim").mkdir(parents=True)

    # the volume comes from the cluster's default StorageClass, provided on demand (devtools/volumes.py);
    # the namespace's deletion at the end releases it when the test did not get that far
    with chartutil.Release(real_cluster, helm_env, RELEASE, ns, values=tmp_path / "values.yaml") as release:
        # -- (a) install: the store and the agent, real pods on the real node -----------------------------
        installed = time.monotonic()
        release.install(_values(real_cluster, store_images, state), create_namespace=True)
        ready_after: dict[str, float] = {}

        def all_ready() -> bool:
            for component in (*STORE, "agent"):
                if component not in ready_after and chartutil.ready(release.pod(component) or {}):
                    ready_after[component] = time.monotonic() - installed
            return len(ready_after) == 3

        try:
            procs.wait_for("PostgreSQL, FerretDB and the agent Ready", all_ready, 300, interval=0.5)
        except TransientError as exc:
            _fail(str(exc), release)
        pods = {c: release.pod(c) for c in (*STORE, "agent")}
        for component, pod in pods.items():
            assert pod is not None and pod["spec"]["nodeName"] == NODE, component
            if chartutil.restarts(pod) != [0]:
                _fail(f"{component} restarted: {chartutil.restarts(pod)}", release)
        for component in STORE:  # the images by digest from the loopback registry
            image_id = pods[component]["status"]["containerStatuses"][0]["imageID"]  # type: ignore[index]
            assert image_id.endswith(store_images[component].split("@")[1]), (component, image_id)
        claim = _read(api, "persistent_volume_claim", f"data-{RELEASE}-postgres-0", ns)
        volume = f"pvc-{claim['metadata']['uid']}"  # the provisioner's, bound to the claim
        assert claim["status"]["phase"] == "Bound" and claim["spec"]["volumeName"] == volume, claim["status"]
        assert (
            claim["spec"]["storageClassName"] == STORAGE_CLASS
        )  # given by the DefaultStorageClass admission

        # the name the Secret's URI holds, as the pods' resolver asks for it (kubelet's clusterDNS)
        ip = _read(api, "service", f"{RELEASE}-ferretdb", ns)["spec"]["clusterIP"]
        asked = dns.message.make_query(f"{RELEASE}-ferretdb.{ns}.svc.cluster.local.", "A")
        reply = dns.query.udp(asked, real.state.gateway, timeout=5)
        assert [r.address for rrset in reply.answer for r in rrset] == [ip], reply

        simulator.inject(NODE, 3, kind="xid", value=79, directory=state / "sim")
        with contextlib.closing(_store_client(api, ns)) as client:
            procs.wait_for("the XID 79 fault in the embedded store", lambda: bool(_faults(client)), 90,
                           interval=0.5)  # fmt: skip
            first = _faults(client)
        assert [f["code"] for f in first] == ["XID-79"], first
        password = _secret(api, ns)["password"]
        print(f"\nembedded store: images pushed {installed - started:.1f} s after the test began; Ready after "
              + ", ".join(f"{c} {s:.1f} s" for c, s in ready_after.items()) + " (from helm install)")  # fmt: skip

        # -- (b) upgrade: PostgreSQL and FerretDB roll; the data and the password stay ------------------
        old = {c: pods[c]["metadata"]["uid"] for c in STORE}  # type: ignore[index]
        upgraded = time.monotonic()
        release.upgrade(_values(real_cluster, store_images, state, memory="200Mi"))

        def rolled() -> bool:
            now = {c: release.pod(c) for c in STORE}
            return all(
                p is not None and p["metadata"]["uid"] != old[c] and chartutil.ready(p)
                for c, p in now.items()
            )

        try:
            procs.wait_for("new PostgreSQL and FerretDB pods Ready", rolled, 240, interval=0.5)
        except TransientError as exc:
            _fail(str(exc), release)
        rolled_after = time.monotonic() - upgraded
        assert _secret(api, ns)["password"] == password
        with contextlib.closing(_store_client(api, ns)) as client:
            procs.wait_for("the store answering after the upgrade", lambda: bool(_faults(client)), 60,
                           interval=0.5)  # fmt: skip
            assert [(f["_id"], f["code"]) for f in _faults(client)] == [(f["_id"], f["code"]) for f in first]
            simulator.inject(NODE, 5, kind="xid", value=79, directory=state / "sim")
            procs.wait_for("a second fault written after the upgrade", lambda: len(_faults(client)) == 2, 90,
                           interval=0.5)  # fmt: skip
        for component in (*STORE, "agent"):
            pod = release.pod(component)
            assert pod is not None and chartutil.ready(pod), component
            if chartutil.restarts(pod) != [0]:
                _fail(f"{component} restarted: {chartutil.restarts(pod)}", release)
        print(f"embedded store: upgrade rolled PostgreSQL and FerretDB in {rolled_after:.1f} s")

        # -- (c) uninstall: the release goes; its Secret and claim stay by design ---------------------
        release.uninstall(timeout=120)
        assert not kube.apps(api).list_namespaced_stateful_set(ns).items
        assert not kube.apps(api).list_namespaced_deployment(ns).items
        assert not kube.apps(api).list_namespaced_daemon_set(ns).items
        assert not core.list_namespaced_service(ns).items
        kept = _read(api, "secret", f"{RELEASE}-store", ns)
        assert "meta.helm.sh/release-name" not in (kept["metadata"].get("annotations") or {})  # the hook's
        claim = _read(api, "persistent_volume_claim", f"data-{RELEASE}-postgres-0", ns)
        assert claim["spec"]["volumeName"] == volume
        core.delete_namespaced_secret(f"{RELEASE}-store", ns)
        core.delete_namespaced_persistent_volume_claim(f"data-{RELEASE}-postgres-0", ns)

        def claim_gone() -> bool:
            try:
                _read(api, "persistent_volume_claim", f"data-{RELEASE}-postgres-0", ns)
            except NotFoundError:
                return True
            return False

        def volume_gone() -> bool:
            try:
                _read(api, "persistent_volume", volume)
            except NotFoundError:
                return not volumes.directory(real_cluster, volume).exists()
            return False

        procs.wait_for("the PostgreSQL claim deleted", claim_gone, 60, interval=0.5)
        # reclaim policy Delete: the provisioner deletes the released volume and its directory
        procs.wait_for("the claim's volume and its directory deleted", volume_gone, 60, interval=0.5)
        print(f"embedded store test: {time.monotonic() - started:.1f} s")
