"""Other systems' markers on a Node (workers.others): parsed from `yield_to`, found on the Node."""

from __future__ import annotations

from faultline import config
from workers import others

NODE = {
    "metadata": {"labels": {"pool": "gpu"}, "annotations": {"example.com/repairing": "yes"}},
    "spec": {
        "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1733400000", "effect": "NoSchedule"}]
    },
    "status": {"conditions": [{"type": "AcceleratedHardwareReady", "status": "True"}]},
}


def test_markers_found_by_kind_key_and_value() -> None:
    def found(*texts: str) -> str | None:
        hit = others.present(NODE, [others.parse(t) for t in texts])
        return None if hit is None else str(hit)

    assert found("taint:ToBeDeletedByClusterAutoscaler") == "taint:ToBeDeletedByClusterAutoscaler"
    assert found("condition:AcceleratedHardwareReady=False") is None
    assert found("condition:AcceleratedHardwareReady=True") == "condition:AcceleratedHardwareReady=True"
    assert found("label:pool=cpu", "label:pool") == "label:pool"
    assert found("annotation:example.com/repairing=no") is None
    assert found("annotation:example.com/repairing=yes") == "annotation:example.com/repairing=yes"
    assert found(*config.workers.YIELD_TO) == "taint:ToBeDeletedByClusterAutoscaler"
    assert others.present({}, [others.parse(t) for t in config.workers.YIELD_TO]) is None
    assert [str(others.parse(t)) for t in config.workers.YIELD_TO] == list(config.workers.YIELD_TO)
