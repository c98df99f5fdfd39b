"""The data model's contracts: deterministic ids, the fault key, and who owns the top-level names."""

from __future__ import annotations

import importlib.metadata
from datetime import UTC, datetime

from faultline import models

TOP_LEVEL = ("faultline", "sources", "patterns", "dataflows", "sinks", "workers", "cli", "devtools")


def test_ids_are_deterministic_and_distinct() -> None:
    ts = datetime(2026, 12, 1, tzinfo=UTC)
    a = models.event_id("n1", "kmsg", "GPU", "0000:3b:00", "XID-79", ts)
    assert a == models.event_id("n1", "kmsg", "GPU", "0000:3b:00", "XID-79", ts)
    assert a != models.event_id("n1", "kmsg", "GPU", "0000:3b:00", "XID-79", ts.replace(second=1))
    assert len(a) == 24
    assert models.fault_id("n1", "GPU", "x", "XID-79") != models.fault_id("n2", "GPU", "x", "XID-79")
    # the separator keeps ("a b", "c") and ("a", "b c") apart
    assert models.stable_id("a b", "c") != models.stable_id("a", "b c")


def test_fault_key_is_node_entity_code() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    fault = models.Fault(
        id=models.fault_id("n1", "GPU", "0000:3b:00", "XID-79"),
        node="n1",
        entity=models.Entity(type="GPU", id="0000:3b:00"),
        code="XID-79",
        component=models.Component.GPU,
        count=3,
        first_seen=now,
        last_seen=now,
        fatal=True,
        action=models.Action.RESTART_BM,
        state=models.FaultState.OPEN,
    )
    assert fault.key == ("n1", "GPU", "0000:3b:00", "XID-79")
    assert fault.id == models.fault_id(*fault.key)


def test_actions_are_ordered_by_disruption() -> None:
    order = list(models.Action)
    assert order.index(models.Action.NONE) < order.index(models.Action.COMPONENT_RESET)
    assert order.index(models.Action.COMPONENT_RESET) < order.index(models.Action.RESTART_BM)


def test_top_level_packages_belong_only_to_this_distribution() -> None:
    owners = importlib.metadata.packages_distributions()
    for name in TOP_LEVEL:
        assert set(owners.get(name, [])) == {"faultline"}, f"{name!r} is provided by {owners.get(name)}"
