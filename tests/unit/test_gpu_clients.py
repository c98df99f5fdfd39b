"""Pausing a node's GPU clients for a GPU reset (workers.gpu_clients): what is on is paused and comes
back; what someone switched off stays off."""

from __future__ import annotations

from workers import gpu_clients

KEYS = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.dcgm-exporter",
)


def test_pause_and_resume() -> None:
    labels = {
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.dcgm": "false",
        "pool": "a",
    }
    paused = gpu_clients.pause(labels, KEYS)
    assert paused == {
        "nvidia.com/gpu.deploy.device-plugin": "paused-for-gpu-reset",
        "faultline.io/gpu-clients": "paused",
    }
    during = {**labels, **{k: v for k, v in paused.items() if v is not None}}
    assert gpu_clients.resume(during, KEYS) == {
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "faultline.io/gpu-clients": None,
    }
    assert gpu_clients.resume(labels, KEYS) == {}  # nothing paused: nothing to do
    assert gpu_clients.pause({}, KEYS) == {
        "faultline.io/gpu-clients": "paused"
    }  # no GPU Operator: the agent alone
