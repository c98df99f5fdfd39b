"""Node conditions from open faults, the change set to apply, and the Event rate limit."""

from __future__ import annotations

import datetime as dt

from faultline import conditions
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def fault(code: str, component: Component = Component.GPU, *, fatal: bool = True, entity: str = "0000:3b:00",
          action: Action = Action.RESTART_BM, resolved: bool = False) -> Fault:  # fmt: skip
    etype = {Component.GPU: "GPU", Component.NIC: "NIC", Component.NVSWITCH: "NVSWITCH"}.get(
        component, "NODE"
    )
    return Fault(
        id=fault_id("n", etype, entity, code), node="n", entity=Entity(type=etype, id=entity), code=code,
        component=component, count=2, first_seen=T0, last_seen=T0, fatal=fatal, action=action,
        state=FaultState.RESOLVED if resolved else FaultState.OPEN, resolved_at=T0 if resolved else None,
    )  # fmt: skip


def test_no_faults_means_every_check_healthy() -> None:
    got = conditions.desired([])
    assert set(got) == {"GpuHealthy", "NvSwitchHealthy", "NicHealthy", "NodeHealthy", "GpuMonitorHealthy"}
    assert all((c.status, c.reason) == ("True", "NoFaults") for c in got.values())


def test_a_monitor_problem_is_its_own_condition_even_when_not_fatal() -> None:
    got = conditions.desired([fault("GPU-MONITOR-UNHEALTHY", Component.MONITOR, fatal=False, entity="")])
    assert (got["GpuMonitorHealthy"].status, got["GpuMonitorHealthy"].reason) == (
        "False", "GPU-MONITOR-UNHEALTHY"
    )  # fmt: skip
    assert got["GpuHealthy"].status == "True"  # the GPUs are not blamed for the monitor


def test_the_most_severe_fatal_fault_names_the_condition() -> None:
    got = conditions.desired(
        [
            fault("XID-13", fatal=False, action=Action.RESTART_APP),
            fault("XID-48", action=Action.COMPONENT_RESET, entity="0000:1a:00"),
            fault("XID-79"),
            fault("XID-95", resolved=True),
        ],
        gpu_names={"0000:3b:00": "GPU 3 GPU-5c2b8f0e"},
    )
    gpu = got["GpuHealthy"]
    assert (gpu.status, gpu.reason) == ("False", "XID-79")
    assert gpu.message.startswith(
        "XID-79 on GPU 3 GPU-5c2b8f0e (0000:3b:00) x2 (fatal); XID-48 on gpu 0000:1a:00"
    )
    assert "XID-95" not in gpu.message
    assert got["NicHealthy"].status == "True"


def test_non_fatal_faults_keep_the_condition_true_but_say_so() -> None:
    nic = conditions.desired([fault("NIC-LINK-DOWN", Component.NIC, fatal=False, entity="ib0")])["NicHealthy"]
    assert (nic.status, nic.reason) == ("True", "NonFatalFaults")
    assert nic.message == "NIC-LINK-DOWN on nic ib0 x2"


def test_messages_are_bounded() -> None:
    many = [fault(f"XID-{i}", entity=f"0000:{i:02x}:00") for i in range(100)]
    message = conditions.desired(many)["GpuHealthy"].message
    assert len(message) <= conditions.MESSAGE_LIMIT
    assert message.endswith("; and 100 in all")


def test_diff_writes_changes_and_deletes_checks_that_went_away() -> None:
    wanted = conditions.desired([fault("XID-79")], types=["GpuHealthy", "NicHealthy"])
    current = {
        "Ready": {"status": "True", "reason": "KubeletReady", "message": "x"},
        "NicHealthy": {"status": "True", "reason": "NoFaults", "message": "no open faults"},
        "NvSwitchHealthy": {"status": "True", "reason": "NoFaults", "message": "no open faults"},
    }
    changed, stale = conditions.diff(current, wanted)
    assert [c.type for c in changed] == ["GpuHealthy"]
    assert stale == ["NvSwitchHealthy"]  # owned and no longer produced; Ready is not ours


def test_patch_body_sets_transition_time_only_on_transitions() -> None:
    c = conditions.Condition("GpuHealthy", "False", "XID-79", "m")
    assert "lastTransitionTime" in c.as_patch(T0, transitioned=True)
    assert "lastTransitionTime" not in c.as_patch(T0, transitioned=False)


def test_event_limiter() -> None:
    limiter = conditions.EventLimiter(interval=60)
    assert limiter.allow("n1", "XID-79", 0.0)
    assert not limiter.allow("n1", "XID-79", 59.0)
    assert limiter.allow("n2", "XID-79", 59.0)
    assert limiter.allow("n1", "XID-79", 60.0)


def test_conditions_are_rewritten_when_their_heartbeat_is_old_even_unchanged() -> None:
    now = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
    wanted = conditions.desired([], types=["GpuHealthy", "NicHealthy"])

    def current(age_s: float) -> dict[str, dict[str, str]]:
        beat = (now - dt.timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {t: {"status": "True", "reason": "NoFaults", "message": "no open faults", "lastHeartbeatTime": beat}
                for t in wanted}  # fmt: skip

    assert conditions.changes(current(60), wanted, now) == ([], [])  # fresh and unchanged: no call
    patches, _ = conditions.changes(current(conditions.HEARTBEAT_S), wanted, now)
    assert {p["type"] for p in patches} == {"GpuHealthy", "NicHealthy"}
    assert all(
        p["lastHeartbeatTime"] == "2026-12-03T12:00:00Z" and "lastTransitionTime" not in p for p in patches
    )


def test_stale_conditions_turn_unknown_and_keep_their_last_heartbeat() -> None:
    now = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
    current = {
        "GpuHealthy": {"status": "False", "reason": "XID-79", "message": "x", "lastHeartbeatTime": "2026-12-03T11:40:00Z"},
        "NicHealthy": {"status": "True", "reason": "NoFaults", "message": "", "lastHeartbeatTime": "2026-12-03T11:58:00Z"},
        "NodeHealthy": {"status": "Unknown", "reason": "AgentNotReporting", "message": "",
                        "lastHeartbeatTime": "2026-12-03T10:00:00Z"},  # already said
        "Ready": {"status": "True", "reason": "KubeletReady", "message": "", "lastHeartbeatTime": "2026-12-03T10:00:00Z"},
    }  # fmt: skip
    (patch,) = conditions.stale(current, now, dt.timedelta(minutes=15))
    assert (
        patch["type"] == "GpuHealthy"
        and patch["status"] == "Unknown"
        and patch["reason"] == "AgentNotReporting"
    )
    assert (
        patch["lastHeartbeatTime"] == "2026-12-03T11:40:00Z"
        and patch["lastTransitionTime"] == "2026-12-03T12:00:00Z"
    )
    assert "has not reported since 2026-12-03T11:40:00Z; it last said False (XID-79)" in patch["message"]
