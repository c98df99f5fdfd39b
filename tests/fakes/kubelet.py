"""A stand-in for the kubelet's pod-resources API: a real gRPC server on a Unix socket serving
`v1.PodResourcesLister/List` from the project's own proto. The local cluster's real kubelet has no
device plugin, so it never reports a GPU: this server is the honest test double for what a GPU node's
kubelet answers (pods -> containers -> devices {resource_name, device_ids}).

It also answers with fields faultline's minimal proto leaves out (a CPU id list, field 3 of each
container), encoded by hand, as a newer kubelet would: the client must skip them."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc

from sources.kubelet import podresources_pb2, podresources_pb2_grpc

# (namespace, pod) -> container -> [(resource name, [device ids])]
Pods = dict[tuple[str, str], dict[str, list[tuple[str, list[str]]]]]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


class FakePodResources(podresources_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, pods: Pods | None = None) -> None:
        self.pods: Pods = dict(pods or {})
        self.calls = 0
        self.lock = threading.Lock()
        self.fail: grpc.StatusCode | None = None  # answer every call with this error

    def List(
        self, request: podresources_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> podresources_pb2.ListPodResourcesResponse:
        with self.lock:
            self.calls += 1
            if self.fail is not None:
                context.abort(self.fail, "the fake kubelet is failing on purpose")
            answer = podresources_pb2.ListPodResourcesResponse()
            for (namespace, name), containers in sorted(self.pods.items()):
                pod = answer.pod_resources.add(name=name, namespace=namespace)
                for container, devices in containers.items():
                    c = pod.containers.add(name=container)
                    for resource, ids in devices:
                        c.devices.add(resource_name=resource, device_ids=ids)
                    # a field this proto does not know (cpu_ids = 3, packed int64s): skipped by the client
                    packed = _varint(2) + _varint(5)
                    c.MergeFromString(bytes([3 << 3 | 2]) + _varint(len(packed)) + packed)
            return answer


@contextlib.contextmanager
def serving(pods: Pods | None = None) -> Iterator[tuple[Path, FakePodResources]]:
    """The fake on a Unix socket in a new short temporary directory (socket paths are limited to 107
    bytes): (socket path, servicer). Stopped and removed on exit."""
    directory = Path(tempfile.mkdtemp(prefix="fl-kubelet-"))
    socket = directory / "kubelet.sock"
    servicer = FakePodResources(pods)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="fake-kubelet"))
    podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    try:
        yield socket, servicer
    finally:
        server.stop(grace=None).wait()
        shutil.rmtree(directory, ignore_errors=True)
