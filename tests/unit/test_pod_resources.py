"""The kubelet pod-resources client against a real gRPC server on a Unix socket (`tests.fakes.kubelet`:
the local cluster's kubelet has no device plugin, so a server implementing the proto is the honest
double), the matching of device ids to the node's GPUs, and when the watch writes the mapping."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import grpc
import pytest

from devtools import procs
from faultline.errors import TransientError
from sources import pod_resources
from sources.gpu import GpuDevice
from tests.fakes import kubelet

GPUS = [GpuDevice(i, f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}", f"0000:{0x18 + i:02x}:00") for i in range(4)]
UUID = [g.uuid for g in GPUS]


def test_list_reads_every_container_device_and_skips_fields_it_does_not_know() -> None:
    pods: kubelet.Pods = {
        ("train", "a"): {"main": [("nvidia.com/gpu", [UUID[0], UUID[1]])], "side": []},
        ("train", "b"): {"main": [("nvidia.com/gpu", [UUID[2]]), ("rdma/ib", ["mlx5_0"])]},
        ("web", "c"): {"main": []},
    }
    with kubelet.serving(pods) as (socket, fake):
        got = pod_resources.list_devices(socket)
    assert fake.calls == 1
    assert sorted(got, key=lambda d: (d.pod, d.device_id)) == [
        pod_resources.Device("train", "a", "main", "nvidia.com/gpu", UUID[0]),
        pod_resources.Device("train", "a", "main", "nvidia.com/gpu", UUID[1]),
        pod_resources.Device("train", "b", "main", "nvidia.com/gpu", UUID[2]),
        pod_resources.Device("train", "b", "main", "rdma/ib", "mlx5_0"),
    ]


def test_a_kubelet_that_fails_or_is_not_there_is_a_transient_error_naming_the_socket(tmp_path: Path) -> None:
    with kubelet.serving() as (socket, fake):
        fake.fail = grpc.StatusCode.INTERNAL
        with pytest.raises(
            TransientError, match=rf"kubelet pod-resources at {socket}: INTERNAL: .*on purpose"
        ):
            pod_resources.list_devices(socket)
    missing = tmp_path / "none.sock"
    with pytest.raises(TransientError, match=rf"kubelet pod-resources at {missing}: UNAVAILABLE"):
        pod_resources.list_devices(missing, timeout=2.0)


def dev(device_id: str, resource: str = "nvidia.com/gpu", pod: str = "p") -> pod_resources.Device:
    return pod_resources.Device("ns", pod, "c", resource, device_id)


@pytest.mark.parametrize(
    ("device", "gpu"),
    [
        (dev(UUID[1]), "0000:19:00"),                       # the device plugin's default: the GPU's UUID
        (dev(UUID[1].upper()), "0000:19:00"),               # ids compared without case
        (dev("2"), "0000:1a:00"),                           # its index strategy
        (dev(f"{UUID[3]}::1", "nvidia.com/gpu.shared"), "0000:1b:00"),  # a time-sliced replica
    ],
)  # fmt: skip
def test_device_ids_match_the_nodes_gpus(device: pod_resources.Device, gpu: str) -> None:
    (assignment,), unmapped = pod_resources.match([device], GPUS)
    assert (assignment.gpu, assignment.device, assignment.namespace, assignment.pod) == (
        gpu, device.device_id, "ns", "p",
    )  # fmt: skip
    assert unmapped == []


def test_ids_that_match_no_gpu_are_unmapped_and_other_resources_ignored() -> None:
    devices = [
        dev("MIG-1234", "nvidia.com/mig-1g.10gb"),
        dev("GPU-not-here"),
        dev("7"),
        dev("eth1", "rdma/roce"),
    ]
    assignments, unmapped = pod_resources.match(devices, GPUS)
    assert assignments == []
    assert unmapped == ["7", "GPU-not-here", "MIG-1234"]


class Link:
    """The watch's store side as plain lists (the store operations it calls are tested on FerretDB in
    tests/integration/test_drain_scope.py)."""

    def __init__(self) -> None:
        self.episode: dt.datetime | None = None
        self.calls: list[str] = []
        self.written: list[tuple[dt.datetime | None, list[tuple[str, str]], list[str]]] = []

    def link(self) -> pod_resources.StoreLink:
        def episode() -> dt.datetime | None:
            self.calls.append("episode")
            return self.episode

        def record(at: dt.datetime, ep: dt.datetime | None, rows: Any, bad: list[str]) -> None:
            self.written.append((ep, sorted((a.gpu, a.pod) for a in rows), bad))

        return pod_resources.StoreLink(episode, record)


def test_the_watch_writes_when_the_pods_or_the_nodes_quarantine_change() -> None:
    side = Link()
    devices = [dev(UUID[0], pod="a")]

    def read() -> list[pod_resources.Device]:
        side.calls.append("kubelet")
        return list(devices)

    watch = pod_resources.GpuPodsWatch("n1", GPUS, read, side.link())
    assert watch.step() is True  # the first read is always written
    assert side.calls == ["episode", "kubelet"]  # the episode before the kubelet: the read is after it
    assert watch.step() is False  # nothing changed: no write
    devices.append(dev(UUID[2], pod="b"))
    assert watch.step() is True
    episode = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    side.episode = episode  # the node was quarantined: written again for this episode, pods unchanged
    assert watch.step() is True
    assert watch.step() is False
    assert side.written == [
        (None, [("0000:18:00", "a")], []),
        (None, [("0000:18:00", "a"), ("0000:1a:00", "b")], []),
        (episode, [("0000:18:00", "a"), ("0000:1a:00", "b")], []),
    ]


def test_the_watch_thread_survives_a_failing_kubelet_and_writes_once_it_answers() -> None:
    side = Link()
    with kubelet.serving({("ns", "a"): {"c": [("nvidia.com/gpu", [UUID[1]])]}}) as (socket, fake):
        fake.fail = grpc.StatusCode.UNAVAILABLE
        watch = pod_resources.GpuPodsWatch(
            "n1", GPUS, lambda: pod_resources.list_devices(socket), side.link(), interval=0.05
        )
        watch.start()
        try:
            procs.wait_for("two failed reads", lambda: fake.calls >= 2, 10)
            assert side.written == [] and watch.failing is not None and "UNAVAILABLE" in watch.failing
            fake.fail = None
            procs.wait_for("the mapping written", lambda: bool(side.written), 10)
        finally:
            watch.close()
    assert side.written[0] == (None, [("0000:19:00", "a")], [])
    assert not watch.thread.is_alive()
