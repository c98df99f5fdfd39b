"""The agent's Kubernetes sink: conditions from a cache, an outage kept in a backlog, Events posted once.
The sink's thread is off here: `drain()` is what it runs."""

from __future__ import annotations

from typing import Any

import pytest

from faultline import conditions
from faultline.errors import ApiUnavailableError, ForbiddenError
from faultline.kube import lite
from faultline.models import Component, NodeUpdate
from sinks import kube as kube_sink
from tests.unit.test_conditions import fault


class FakeApi:
    """Stands in for the light transport's calls (the real ones are tested against the API server)."""

    def __init__(self) -> None:
        self.conditions: dict[str, dict[str, str]] = {
            "Ready": {"status": "True", "reason": "", "message": ""}
        }
        self.down = False
        self.reads = 0
        self.patches: list[list[dict[str, str]]] = []
        self.events: list[str] = []

    def check(self) -> None:
        if self.down:
            raise ApiUnavailableError("get", "Node n", "connection refused")

    def read_node_status(self, _client: Any, _node: str) -> dict[str, Any]:
        self.check()
        self.reads += 1
        return {"status": {"conditions": [{"type": t, **c} for t, c in self.conditions.items()]}}

    def patch_node_conditions(
        self, _client: Any, node: str, items: list[dict[str, str]], delete: list[str]
    ) -> Any:
        if not items and not delete:
            return None
        self.check()
        self.patches.append(items)
        for item in items:
            self.conditions[item["type"]] = {k: item[k] for k in ("status", "reason", "message")}
        for t in delete:
            self.conditions.pop(t, None)
        return self.read_node_status(None, node)

    def post_node_event(self, _client: Any, _node: str, *, reason: str, **_: Any) -> None:
        self.check()
        self.events.append(reason)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    api = FakeApi()
    monkeypatch.setattr(lite.Client, "connect", classmethod(lambda cls, *a, **k: object()))
    for name in ("read_node_status", "patch_node_conditions", "post_node_event"):
        monkeypatch.setattr(lite, name, getattr(api, name))
    return api


def sink() -> Any:
    return kube_sink._Partition(None, {}, sorted(conditions.OWNED_TYPES), background=False)


def write(part: Any, items: list[NodeUpdate]) -> bool:
    part.write_batch(items)
    return bool(part.drain())


def update(*faults: Any) -> NodeUpdate:
    return NodeUpdate("n", list(faults), [(f, 1) for f in faults])


def test_unchanged_conditions_cost_no_call_and_a_resync_reads_again(
    fake: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = sink()
    write(part, [update(fault("XID-79"))])
    assert fake.conditions["GpuHealthy"]["reason"] == "XID-79"
    assert (fake.reads, len(fake.patches), fake.events) == (2, 1, ["XID-79"])  # a read, a patch (it answers)
    write(part, [NodeUpdate("n", [fault("XID-79")], [])])
    assert (fake.reads, len(fake.patches)) == (2, 1)  # the cache says nothing changed
    fake.conditions["GpuHealthy"]["status"] = "True"  # someone edits faultline's condition
    monkeypatch.setattr(kube_sink, "RESYNC_S", 0.0)
    write(part, [NodeUpdate("n", [fault("XID-79")], [])])
    assert fake.conditions["GpuHealthy"]["status"] == "False"  # put back after the re-read


def test_an_outage_waits_in_the_backlog_and_nothing_is_posted_twice(fake: FakeApi) -> None:
    part = sink()
    write(part, [update(fault("XID-79"))])
    fake.down = True
    nic = fault("NIC-LINK-DOWN", Component.NIC, entity="mlx5_0")
    write(part, [update(fault("XID-79"), nic)])  # no exception: kept for later
    write(
        part, [NodeUpdate("n", [fault("XID-79", resolved=True), nic], [(fault("XID-79", resolved=True), 3)])]
    )
    assert len(part.backlog) == 2
    assert fake.conditions["NicHealthy"]["status"] == "True"  # not written during the outage
    fake.down = False
    assert write(part, [])
    assert part.backlog == []
    assert fake.conditions["NicHealthy"]["status"] == "False"
    assert fake.conditions["GpuHealthy"]["status"] == "True"  # the latest state, not the one in between
    assert fake.events == [
        "XID-79",
        "NIC-LINK-DOWN",
        "XID-79Resolved",
    ]  # the first XID-79 event was rate-limited


def test_refusals_wait_in_the_backlog_too(fake: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*_: Any) -> Any:
        raise ForbiddenError("get", "Node n", "forbidden", status=403)

    monkeypatch.setattr(lite, "read_node_status", forbidden)
    part = sink()
    assert not write(part, [update(fault("XID-79"))])  # logged and kept: RBAC may be fixed
    assert len(part.backlog) == 1
