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
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from devtools import procs, realnode, realnode_host
from devtools.cluster import LocalCluster
from faultline import kube
from faultline.errors import NotFoundError

LOCAL_CLASS = "faultline-local"  # the storage class `dev cluster up --real-nodes` provides a volume of


def directory(cluster: LocalCluster, name: str) -> Path:
    if cluster.real is None:
        raise RuntimeError("volumes are for real nodes: start the cluster with real_nodes")
    return cluster.real.dir / "volumes" / name


def add(cluster: LocalCluster, name: str, *, storage_class: str, size: str = "1Gi", node: str = "") -> Path:
    """A PersistentVolume `name` of `storage_class` and capacity `size` on the real node `node` (default:
    the first); returns its directory."""
    path = directory(cluster, name)
    node = node or cluster.real_node_names[0]
    if node not in cluster.real_node_names:
        raise ValueError(f"{node!r} is not a real node of this cluster ({cluster.real_node_names})")
    path.mkdir(parents=True)
    path.chmod(0o777)
    on_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    body = {
        "metadata": {"name": name, "labels": {realnode.LABEL: "true"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": storage_class,
            "volumeMode": "Filesystem",
            "hostPath": {"path": str(path), "type": "Directory"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_node]}]}},
        },
    }
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
