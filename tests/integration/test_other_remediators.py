"""Another system repairing or removing a node (Karpenter disrupting it, EKS node auto repair about to
replace it): while the Node carries its marker, the remediation worker asks for no repair of it, says why
in the node's FaultlineRemediation condition, and repairs once the marker is gone. On the real control
plane and FerretDB."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devtools import fakelet, procs
from faultline import kube, store
from faultline.errors import ConfigError, NotFoundError
from tests.integration.test_janitor import _fault, setup
from tests.integration.test_workers_e2e import forget_repairs
from workers import remediation

pytestmark = pytest.mark.integration
__all__ = ["setup"]  # a fixture


@pytest.fixture
def node(api: Any) -> Iterator[str]:
    name = f"other-{uuid.uuid4().hex[:6]}"
    kube.core(api).create_node(fakelet.node_manifest(fakelet.SimNode(name, "10.9.0.2"), 8))
    yield name
    forget_repairs(api, name)
    with contextlib.suppress(NotFoundError):
        kube.nodes.delete(api, name)


def _condition(api: Any, node: str, kind: str) -> dict[str, Any]:
    conditions = kube.nodes.read(api, node).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def _requests(api: Any, node: str) -> list[str]:
    return [
        r["metadata"]["name"]
        for r in kube.resources.list_requests(api, label_selector=f"faultline.io/node={node}")
    ]


def test_no_repair_while_another_system_acts_on_the_node(
    api: Any, mongo_db: Any, node: str, setup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remediation, "YIELD_RETRY", dt.timedelta(seconds=1))
    st = store.Store(mongo_db)
    st.ensure_indexes()
    st.write_fault(_fault(node), 1)
    # Karpenter is disrupting the node (its v1 taint), and EKS's monitoring agent reports the GPUs broken
    kube.nodes.patch(
        api, node, {"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}
    )
    kube.nodes.patch_status(api, node, {"conditions": [{
        "type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error", "message": "x"}]})  # fmt: skip
    yield_to = (*remediation.Settings().yield_to, "condition:AcceleratedHardwareReady=False")
    settings = remediation.Settings(lease=dt.timedelta(seconds=5), threads=1, resync_interval=60.0,
                                    require_drain=False, yield_to=yield_to)  # fmt: skip
    key = st.open_repair(node, dt.datetime.now(dt.UTC).replace(microsecond=0))
    worker = remediation.Remediation(st, api, settings, "r-other")
    worker.start()
    try:
        procs.wait_for("deferred to Karpenter", lambda: _condition(api, node, "FaultlineRemediation").get(
            "reason") == "OtherRemediator", 15)  # fmt: skip
        assert "taint:karpenter.sh/disrupted" in _condition(api, node, "FaultlineRemediation")["message"]
        looks = worker.metrics.actions.labels(result="deferred")._value.get()
        procs.wait_for("looked at again", lambda: worker.metrics.actions.labels(
            result="deferred")._value.get() >= looks + 2, 15)  # fmt: skip
        assert _requests(api, node) == [] and not st.repairs.find_one({"_id": key}).get("rounds")
        # Karpenter gave the node up; EKS's condition still says it will replace it
        kube.nodes.patch(api, node, {"spec": {"taints": None}})
        procs.wait_for("deferred to EKS's repair", lambda: "condition:AcceleratedHardwareReady=False" in _condition(
            api, node, "FaultlineRemediation").get("message", ""), 15)  # fmt: skip
        assert _requests(api, node) == []
        kube.nodes.patch_status(api, node, {"conditions": [{
            "type": "AcceleratedHardwareReady", "status": "True", "reason": "Ok", "message": "x"}]})  # fmt: skip
        procs.wait_for("then faultline repairs", lambda: len(_requests(api, node)) == 1, 15)
        # the request is created before its round is recorded: wait for the round, then check there is one
        procs.wait_for(
            "the round recorded", lambda: bool(st.repairs.find_one({"_id": key}).get("rounds")), 15
        )
        assert len(st.repairs.find_one({"_id": key})["rounds"]) == 1 and len(_requests(api, node)) == 1
    finally:
        worker.halt()


def test_a_bad_marker_is_named_at_start() -> None:
    for bad, said in [
        ("karpenter.sh/disrupted", "KIND:KEY[=VALUE]"),
        ("condition:Ready", "needs its status"),
        ("taint:a=b", "names its key only"),
        ("label:bad key", "'bad key' is not a label key"),
    ]:
        with pytest.raises(ConfigError, match="remediation yield_to") as caught:
            remediation.markers((bad,))
        assert said in str(caught.value), bad
