"""PersistentVolumes on the local cluster's real nodes, provided statically the way a `local-path`
provisioner provides them on demand: a directory on the node, a hostPath PersistentVolume of the claim's
storage class pinned to that node by node affinity (so the scheduler puts the claim's pod there), reclaim
policy Retain (the data goes only when `remove` is asked).

The directory is mode 0777, as local-path makes it: a hostPath volume gets no `fsGroup`, and the pod's
user (PostgreSQL's 65532 in the chart) must write it. It lives under the real nodes' work directory, so
the cluster's stop, or the cleanup after a crash, removes it with the rest. No StorageClass object is
needed: a claim naming a class binds to a volume of that class by name.

    path = volumes.add(cluster, "store-data", storage_class="faultline-local", size="1Gi")
    volumes.remove(cluster, "store-data")     # the PersistentVolume and the directory

And on demand, as most clusters have it: a cluster with real nodes also runs a `Provisioner` for its
default StorageClass `local-path` (annotated `storageclass.kubernetes.io/is-default-class`, so the API
server's DefaultStorageClass admission gives it to every claim that names no class). For each pending
claim of that class it makes a volume as `add` does, bound to the claim (its `claimRef`), on the first real
node, named `pvc-<claim uid>`; once a claim is deleted and its volume Released, it deletes the volume and
its directory (reclaim policy Delete), as an external provisioner does. So `helm install` of a chart whose
StatefulSet asks for storage works as written.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from pathlib import Path
from typing import Any

from devtools import procs, realnode, realnode_host
from devtools.cluster import LocalCluster
from faultline import kube
from faultline.errors import AlreadyExistsError, NotFoundError

LOCAL_CLASS = "faultline-local"  # the storage class `dev cluster up --real-nodes` provides a volume of
DEFAULT_CLASS = "local-path"  # the cluster's default StorageClass, provided on demand by `Provisioner`
PROVISIONER = "faultline.dev/local-path"
log = logging.getLogger(__name__)


def directory(cluster: LocalCluster, name: str) -> Path:
    if cluster.real is None:
        raise RuntimeError("volumes are for real nodes: start the cluster with real_nodes")
    return cluster.real.dir / "volumes" / name


def _volume(
    name: str, path: Path, node: str, size: str, *, storage_class: str, reclaim: str
) -> dict[str, Any]:
    """A hostPath PersistentVolume in `path` on `node`, pinned there by node affinity."""
    on_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    return {
        "metadata": {"name": name, "labels": {realnode.LABEL: "true"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": reclaim,
            "storageClassName": storage_class,
            "volumeMode": "Filesystem",
            "hostPath": {"path": str(path), "type": "Directory"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_node]}]}},
        },
    }


def add(cluster: LocalCluster, name: str, *, storage_class: str, size: str = "1Gi", node: str = "") -> Path:
    """A PersistentVolume `name` of `storage_class` and capacity `size` on the real node `node` (default:
    the first); returns its directory."""
    path = directory(cluster, name)
    node = node or cluster.real_node_names[0]
    if node not in cluster.real_node_names:
        raise ValueError(f"{node!r} is not a real node of this cluster ({cluster.real_node_names})")
    path.mkdir(parents=True)
    path.chmod(0o777)
    body = _volume(name, path, node, size, storage_class=storage_class, reclaim="Retain")
    core = kube.core(cluster.api())
    kube.client.send_json("create", f"PersistentVolume {name}", core.create_persistent_volume, body)
    return path


def remove(cluster: LocalCluster, name: str, *, timeout: float = 60) -> None:
    """Delete the PersistentVolume (waiting until it is gone: a volume still bound to a claim in use
    stays until the claim is deleted) and then its directory."""
    core = kube.core(cluster.api())
    path = directory(cluster, name)

    def gone() -> bool:
        try:
            kube.client.read_json("read", f"PersistentVolume {name}", core.read_persistent_volume, name)
        except NotFoundError:
            return True
        return False

    with contextlib.suppress(NotFoundError):
        kube.client.send_json("delete", f"PersistentVolume {name}", core.delete_persistent_volume, name)
    procs.wait_for(f"PersistentVolume {name} deleted", gone, timeout)
    if realnode_host.mounts_under(path):
        raise RuntimeError(f"{path} is still mounted: {realnode_host.mounts_under(path)}")
    shutil.rmtree(path, ignore_errors=True)


class Provisioner:
    """The default StorageClass's provisioner: a thread that gives each pending claim of the class a
    hostPath volume on `node` under `root`, and deletes a Released volume it made with its directory."""

    def __init__(self, api: Any, root: Path, node: str, *, poll: float = 0.5) -> None:
        self.api, self.root, self.node, self.poll = api, root, node, poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="local-path-provisioner", daemon=True)

    def start(self) -> None:
        storage = kube.storage(self.api)
        body = {
            "metadata": {"name": DEFAULT_CLASS, "labels": {realnode.LABEL: "true"},
                         "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }  # fmt: skip
        with contextlib.suppress(AlreadyExistsError):  # a control plane restarted on its data
            kube.client.send_json(
                "create", f"StorageClass {DEFAULT_CLASS}", storage.create_storage_class, body
            )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.sync()
            except Exception:
                log.debug("local-path provisioner: pass failed", exc_info=True)

    def sync(self) -> None:
        """One pass: volumes for pending claims of the class, released volumes deleted."""
        core: Any = kube.core(self.api)  # its models' fields are all optional; these are set
        for claim in core.list_persistent_volume_claim_for_all_namespaces().items:
            spec, meta = claim.spec, claim.metadata
            pending = claim.status.phase == "Pending" and meta.deletion_timestamp is None
            if spec.storage_class_name == DEFAULT_CLASS and not spec.volume_name and pending:
                self._provide(core, claim)
        for volume in core.list_persistent_volume().items:
            annotations = volume.metadata.annotations or {}
            if annotations.get("pv.kubernetes.io/provisioned-by") == PROVISIONER and volume.status.phase in (
                "Released", "Failed"
            ):  # fmt: skip
                with contextlib.suppress(NotFoundError):
                    core.delete_persistent_volume(volume.metadata.name)
                shutil.rmtree(self.root / volume.metadata.name, ignore_errors=True)

    def _provide(self, core: Any, claim: Any) -> None:
        name = f"pvc-{claim.metadata.uid}"
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        size = (claim.spec.resources.requests or {}).get("storage", "1Gi")
        body = _volume(name, path, self.node, size, storage_class=DEFAULT_CLASS, reclaim="Delete")
        body["metadata"]["annotations"] = {"pv.kubernetes.io/provisioned-by": PROVISIONER}
        body["spec"]["accessModes"] = claim.spec.access_modes or ["ReadWriteOnce"]
        body["spec"]["claimRef"] = {"namespace": claim.metadata.namespace, "name": claim.metadata.name,
                                    "uid": claim.metadata.uid}  # fmt: skip
        with contextlib.suppress(AlreadyExistsError):  # made in an earlier pass, not yet bound
            kube.client.send_json("create", f"PersistentVolume {name}", core.create_persistent_volume, body)
