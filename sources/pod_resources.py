"""Which pods use which GPU on this node, from the kubelet's pod-resources API, for the drainer's partial
drains (`workers.drain_scope`).

The kubelet serves `v1.PodResourcesLister/List` on a Unix socket (by default
/var/lib/kubelet/pod-resources/kubelet.sock): every pod on the node, its containers, and the device ids
of each resource a container was given (`sources/kubelet/podresources.proto`). For `nvidia.com/gpu` the
NVIDIA device plugin's ids are GPU UUIDs (`GPU-...`), or the GPU's index with its index strategy;
shared (time-sliced) GPUs add `::<replica>`. `match` turns them into the GPU's PCI bus id, the id faults
name; an id it cannot match (a MIG device, `nvidia.com/mig-*`) is reported as unmapped, and the
drainer then drains the whole node.

`GpuPodsWatch` reads the kubelet every `interval` seconds on its own thread (one local gRPC call) and
records the mapping in the store (`Store.record_gpu_pods`) only when it changed, or when the node's
quarantine episode (`NodeHold.quarantined_at`, read before the kubelet) is not the one of the last
write: the drainer trusts a mapping only when it was read after the node was cordoned. A failed read
(the kubelet restarting, the store away) is logged and tried again at the next interval.

This module imports grpc: the agent imports it only when `pod_resources_socket` is set.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from faultline import store
from faultline.errors import TransientError
from sources.gpu import GpuDevice
from sources.kubelet import podresources_pb2, podresources_pb2_grpc
from sources.poller import Poller

log = logging.getLogger(__name__)
DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")  # prefixes of the resources that are GPUs
MAX_MESSAGE = 16 * 1024 * 1024  # a node's answer (every pod and device) stays far below this


@dataclass(frozen=True)
class Device:
    """One device id of one resource the kubelet gave one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


def list_devices(socket: Path, *, timeout: float = 5.0) -> list[Device]:
    """Every device the kubelet at `socket` has given a container, as (pod, container, resource, id).
    TransientError when the kubelet does not answer (not there, restarting)."""
    options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
    with grpc.insecure_channel(f"unix:{socket}", options=options) as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
        try:
            answer = stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "ERROR"
            raise TransientError(f"kubelet pod-resources at {socket}: {name}: {details}", delay=5.0) from exc
    return [
        Device(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
        for pod in answer.pod_resources
        for container in pod.containers
        for devices in container.devices
        for device_id in devices.device_ids
    ]


Assignments = list[store.GpuAssignment]


def match(devices: Iterable[Device], gpus: Iterable[GpuDevice]) -> tuple[Assignments, list[str]]:
    """The GPU devices among `devices` as assignments to this node's GPUs (by UUID, or by index), and
    the GPU device ids that match none of them. Other resources (NICs, FPGAs) are left out."""
    known: dict[str, str] = {}
    for gpu in gpus:
        known[gpu.uuid.lower()] = gpu.pci
        known[str(gpu.index)] = gpu.pci
    assignments, unmapped = [], []
    for d in devices:
        if not d.resource.startswith(GPU_RESOURCES):
            continue
        pci = known.get(d.device_id.split("::", 1)[0].strip().lower())
        if pci is None:
            unmapped.append(d.device_id)
            continue
        assignments.append(store.GpuAssignment(
            gpu=pci, device=d.device_id, namespace=d.namespace, pod=d.pod, container=d.container
        ))  # fmt: skip
    return assignments, sorted(set(unmapped))


Record = Callable[[dt.datetime, dt.datetime | None, Assignments, list[str]], None]


@dataclass(frozen=True)
class StoreLink:
    """What the watch asks of the store: the node's quarantine episode, where the mapping goes, and how
    its connection is closed (after the watch's thread ended)."""

    episode: Callable[[], dt.datetime | None]
    record: Record
    close: Callable[[], None] = lambda: None


def store_link(st: store.Store, node: str) -> StoreLink:
    """The node's episode and mapping in the store (the agent's one client: closing the link leaves it
    open for its owner)."""

    def connected() -> store.Store:
        return st

    def episode() -> dt.datetime | None:
        with store.unreachable_is_transient("reading the node's quarantine"):
            hold = connected().hold(node)
        return hold.quarantined_at if hold is not None and hold.quarantined else None

    def record(at: dt.datetime, ep: dt.datetime | None, rows: Assignments, bad: list[str]) -> None:
        with store.unreachable_is_transient("recording the node's GPU pods"):
            connected().record_gpu_pods(node, read_at=at, episode=ep, assignments=rows, unmapped=bad)

    return StoreLink(episode, record, lambda: None)


class GpuPodsWatch(Poller):
    """Reads the kubelet every `interval` seconds and records the node's GPU -> pods mapping when it
    changed or the node's quarantine episode did (see the module docstring)."""

    def __init__(
        self, node: str, gpus: Iterable[GpuDevice], read: Callable[[], list[Device]], link: StoreLink, *,
        interval: float = 10.0, clock: Callable[[], dt.datetime] = store.utcnow,
    ) -> None:  # fmt: skip
        super().__init__(node, "gpu pods", interval, link.close)
        self.gpus = list(gpus)
        self.read = read
        self.link = link
        self.clock = clock
        self.written: tuple[object, ...] | None = None  # what the last write recorded

    def step(self) -> bool:
        """One read; whether it was recorded. The episode is read first, so the kubelet's answer is from
        after it (after the cordon, for a quarantined node)."""
        episode = self.link.episode()
        assignments, unmapped = match(self.read(), self.gpus)
        rows = sorted((a.gpu, a.device, a.namespace, a.pod, a.container) for a in assignments)
        current = (episode, tuple(rows), tuple(unmapped))
        if current == self.written:
            return False
        self.link.record(self.clock(), episode, assignments, unmapped)
        self.written = current
        log.info("gpu pods recorded", extra={"node": self.node, "pods": len({r[2:4] for r in rows}),
                                             "episode": episode, "unmapped": len(unmapped)})  # fmt: skip
        return True

    def look(self) -> bool:
        self.step()
        return True
