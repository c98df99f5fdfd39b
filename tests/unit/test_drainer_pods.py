"""Which pods a drain moves (`workers.drainer.evictable`): not DaemonSet or mirror pods, not finished
ones, not the janitor's own repair pods (whatever their namespace), and with `gpu_only` only GPU pods."""

from __future__ import annotations

from typing import Any

import pytest

from workers.drainer import evictable


def _pod(*, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         owner: str | None = None, phase: str = "Running", gpus: int = 0) -> dict[str, Any]:  # fmt: skip
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {"name": "p", "namespace": "team-a", "labels": labels or {}, "annotations": annotations or {},
                     "ownerReferences": [{"kind": owner, "name": "o"}] if owner else []},
        "spec": {"containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": phase},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "gpu_only", "moved"),
    [
        (_pod(), False, True),
        (_pod(owner="ReplicaSet"), False, True),
        (_pod(owner="DaemonSet"), False, False),
        (_pod(annotations={"kubernetes.io/config.mirror": "x"}), False, False),
        (_pod(phase="Succeeded"), False, False),
        (_pod(phase="Failed"), False, False),
        (
            _pod(labels={"faultline.io/repair": "reboot", "faultline.io/node": "n1"}, owner="Job"),
            False,
            False,
        ),
        (_pod(labels={"faultline.io/node": "n1"}, owner="Job"), False, True),  # only the repair label counts
        (_pod(gpus=0), True, False),
        (_pod(gpus=2), True, True),
    ],
)
def test_which_pods_a_drain_moves(pod: dict[str, Any], gpu_only: bool, moved: bool) -> None:
    assert evictable(pod, gpu_only) is moved
