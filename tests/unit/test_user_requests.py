"""A person's RemediationRequest: what the janitor accepts, what it refuses and why (pure `check`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from faultline import config, store
from workers import remedies, user_requests
from workers.user_requests import ADOPT, REFUSE, WAIT, Limits, Request

NOW = dt.datetime(2026, 12, 3, 12, tzinfo=dt.UTC)
NODE = {"metadata": {"name": "gpu-1"}, "status": {"capacity": {"nvidia.com/gpu": "8"}}}
LIMITS = Limits(actions=("GPU_RESET", "REBOOT", "REPLACE"), caps=remedies.Caps(), can_replace=False)


def req(action: str = "REBOOT", **kw: Any) -> Request:
    fields: dict[str, Any] = {"name": "reboot-gpu-1", "uid": "u-1", "by": "alice", "node": "gpu-1",
                              "action": action, "gpus": (), "fault_keys": (), "reason": "", "created": NOW,
                              "phase": None}  # fmt: skip
    fields.update(kw)
    return Request(**fields)


def fault(key: str, gpu: str = "0000:3a:00", *, fatal: bool = True, state: str = "open") -> store.FaultRecord:
    return store.FaultRecord.model_validate({
        "_id": key, "node": "gpu-1", "entity": {"type": "GPU", "id": gpu}, "code": "XID-79", "component": "GPU",
        "first_seen": NOW, "last_seen": NOW, "fatal": fatal, "action": "RESTART_BM", "state": state,
    })  # fmt: skip


def repair(rid: str, *, janitor: str = "done", remediation: str = "done", outcome: str | None = "Succeeded",
           user: dict[str, Any] | None = None, started: bool = True, days_ago: float = 1) -> store.Repair:  # fmt: skip
    at = NOW - dt.timedelta(days=days_ago)
    round_ = {"step": "REBOOT", "request": rid, "fault_keys": ["f-old"], "outcome": outcome,
              "at": at if outcome else None, "started_at": at if started else None}  # fmt: skip
    return store.Repair.model_validate({
        "_id": rid, "node": "gpu-1", "rounds": [round_], "user": user,
        "janitor": {"state": janitor}, "remediation": {"state": remediation},
    })  # fmt: skip


def check(r: Request, *, node: dict[str, Any] | None = NODE, repairs: tuple[store.Repair, ...] = (),
          faults: tuple[store.FaultRecord, ...] = (), live: frozenset[str] = frozenset({"u-1"}),
          limits: Limits = LIMITS) -> user_requests.Verdict:  # fmt: skip
    return user_requests.check(r, node, list(repairs), list(faults), live=set(live), limits=limits, now=NOW)


@pytest.mark.parametrize(
    ("request_", "node", "says"),
    [
        (req("CONTACT_SUPPORT"), NODE, "CONTACT_SUPPORT is not a repair faultline carries out"),
        (
            req("RESET_EVERYTHING"),
            NODE,
            "spec.action: 'RESET_EVERYTHING' is not one of GPU_RESET, REBOOT, REPLACE",
        ),
        (req("REPLACE"), NODE, "REPLACE needs a cloud provider"),
        (req(), None, "spec.node: node 'gpu-1' does not exist"),
        (req(gpus=("3",)), NODE, "spec.gpus: REBOOT acts on the whole node and cannot target GPUs"),
        (req("GPU_RESET"), NODE, "spec.gpus: name the GPUs to reset"),
        (req("GPU_RESET", gpus=("8",)), NODE, "spec.gpus[0] '8': node gpu-1 has 8 GPUs (indices 0-7)"),
        (req("GPU_RESET", gpus=("1", "01")), NODE, "spec.gpus[1] '01': named twice"),
        (
            req("GPU_RESET", gpus=("gpu three",)),
            NODE,
            "spec.gpus[0] 'gpu three': not a GPU index, PCI bus id",
        ),
        (
            req("GPU_RESET", gpus=("0000:3a:00", "0000:3A:00.0")),
            NODE,
            "spec.gpus[1] '0000:3A:00.0': named twice",
        ),
        (
            req("GPU_RESET", gpus=("2",)),
            {"metadata": {"name": "gpu-1"}},
            "reports no nvidia.com/gpu capacity",
        ),
        (req(fault_keys=("nope",)), NODE, "spec.faultKeys[0] 'nope': not an open fault of node gpu-1"),
    ],
)
def test_refused_with_the_reason(request_: Request, node: dict[str, Any] | None, says: str) -> None:
    verdict = check(request_, node=node)
    assert verdict.outcome == REFUSE and says in verdict.message, verdict


def test_actions_the_janitor_is_not_allowed_to_take_for_people() -> None:
    limits = Limits(actions=("GPU_RESET",), caps=remedies.Caps(), can_replace=True)
    verdict = check(req(), limits=limits)
    assert verdict.outcome == REFUSE
    assert verdict.message == ("spec.action: this janitor carries out GPU_RESET for requests people create, "
                               "not REBOOT (its user_actions setting)")  # fmt: skip
    none = Limits(actions=(), caps=remedies.Caps(), can_replace=True)
    assert "carries out nothing for requests people create" in check(req(), limits=none).message


def test_a_person_may_not_ask_for_replace_unless_the_janitor_is_told_so() -> None:
    """REPLACE terminates the instance: out of `user_actions` by default, a person opts in to it."""
    default = config.JanitorConfig.model_fields["user_actions"].default
    assert "REPLACE" not in default
    limits = Limits(actions=default, caps=remedies.Caps(can_replace=True), can_replace=True)
    verdict = check(req("REPLACE"), limits=limits)
    assert verdict.outcome == REFUSE and "not REPLACE (its user_actions setting)" in verdict.message
    opted_in = config.JanitorConfig(
        mongodb_uri="mongodb://x", user_actions=("GPU_RESET", "REBOOT", "REPLACE")
    )
    assert "REPLACE" in opted_in.user_actions


def test_a_reboot_validates_the_nodes_open_fatal_faults() -> None:
    faults = (fault("f1"), fault("f2", "0000:3b:00"), fault("f3", fatal=False), fault("f4", state="resolved"))
    verdict = check(req(reason="stuck"), faults=faults)
    assert verdict.outcome == ADOPT and verdict.turn == 1, verdict
    r = verdict.round
    assert r is not None
    assert (r.step, r.request, r.job) == ("REBOOT", "reboot-gpu-1", "request-u-1")
    assert r.fault_keys == ["f1", "f2"] and r.gpus == ["0000:3a:00", "0000:3b:00"]
    assert r.reason == "stuck (requested by alice)" and r.requested_at == NOW
    assert verdict.message == "accepted: REBOOT of node gpu-1, validating f1, f2"


def test_announced_maintenance_is_not_what_a_persons_reboot_validates() -> None:
    announced = {"code": "CSP-MAINTENANCE-REBOOT", "metadata": {"repair": "provider"}}
    maintenance = fault("csp").model_copy(update=announced)
    verdict = check(req(reason="stuck"), faults=(fault("f1"), maintenance))
    assert verdict.round is not None and verdict.round.fault_keys == ["f1"]


def test_a_reset_validates_the_faults_of_the_gpus_named_by_bus_id() -> None:
    faults = (fault("f1"), fault("f2", "0000:3b:00"))
    verdict = check(req("GPU_RESET", gpus=("00000000:3B:00.0", "5")), faults=faults)
    assert verdict.outcome == ADOPT and verdict.round is not None
    assert verdict.round.fault_keys == ["f2"] and verdict.round.gpus == ["00000000:3B:00.0", "5"]
    healthy = check(req("GPU_RESET", gpus=("GPU-8b3c2a1e-0f1d-4e7a-9c2b-5d6e7f8a9b0c",)))
    assert healthy.outcome == ADOPT and healthy.message.endswith("no open fault to validate")


def test_named_fault_keys_are_the_ones_validated() -> None:
    verdict = check(req(fault_keys=("f2",)), faults=(fault("f1"), fault("f2", fatal=False)))
    assert verdict.round is not None and verdict.round.fault_keys == ["f2"]


def test_a_repair_running_on_the_node_refuses_the_request() -> None:
    for busy in (
        repair("gpu-1/2026-12-03T11:00:00", janitor="claimed", outcome=None),  # faultline's own
        repair(
            "gpu-1/request-1", janitor="pending", outcome=None, user={"name": "a", "uid": "u-0", "turn": 1}
        ),
        repair("gpu-1/2026-12-03T11:30:00", janitor="idle", remediation="claimed", outcome=None),  # deciding
    ):
        verdict = check(req(), repairs=(busy,), live=frozenset({"u-1", "u-0"}))
        assert verdict.outcome == REFUSE, verdict
        assert verdict.message.startswith(f"a repair of node gpu-1 is already running: {busy.id}")
    waiting = repair("gpu-1/2026-12-03T11:00:00", janitor="done", remediation="pending")  # no one on it
    assert check(req(), repairs=(waiting,)).outcome == ADOPT


def test_a_deleted_request_not_started_yet_is_waited_for_not_refused() -> None:
    """Its claim cancels it; the request after it is adopted at the next pass, in the next turn."""
    gone = repair("gpu-1/request-1", janitor="pending", outcome=None, started=False,
                  user={"name": "reboot-gpu-1", "uid": "u-0", "turn": 1})  # fmt: skip
    assert check(req(), repairs=(gone,)).outcome == WAIT
    cancelled = repair(
        "gpu-1/request-1", outcome=remedies.CANCELLED, user={"name": "r", "uid": "u-0", "turn": 1}
    )
    verdict = check(req(), repairs=(cancelled,))
    assert verdict.outcome == ADOPT and verdict.turn == 2


def test_the_repair_caps_apply_below_the_last_step() -> None:
    past = tuple(repair(f"gpu-1/2026-11-2{i}", days_ago=i) for i in range(1, 5))  # 4 repairs in 7 days
    verdict = check(req(), repairs=past)
    assert verdict.outcome == REFUSE
    assert verdict.message == ("node gpu-1: repeat offender: 4 repairs in 7 days, 0:00:00 (the repair caps): "
                               "no REBOOT; faultline's ladder goes to CONTACT_SUPPORT next")  # fmt: skip
    cancelled = tuple(repair(r.id, outcome=remedies.CANCELLED, days_ago=1) for r in past)
    assert check(req(), repairs=cancelled).outcome == ADOPT  # no repair happened
    replace = Limits(actions=LIMITS.actions, caps=remedies.Caps(can_replace=True), can_replace=True)
    assert check(req("REPLACE"), repairs=past, limits=replace).outcome == ADOPT  # the last step itself
    old = (repair("gpu-1/a", days_ago=1), repair("gpu-1/b", days_ago=2), repair("gpu-1/c", days_ago=3))
    per_fault = check(req(fault_keys=("f-old",)), repairs=old, faults=(fault("f-old"),))
    assert per_fault.outcome == REFUSE and "3 repairs did not clear these faults" in per_fault.message


def test_parse_reads_who_asked() -> None:
    obj = {
        "metadata": {"name": "r", "uid": "u", "creationTimestamp": "2026-12-03T12:00:00Z",
                     "managedFields": [{"manager": "kubectl-create", "operation": "Create"}]},
        "spec": {"node": "gpu-1", "action": "GPU_RESET", "gpus": ["3"], "faultKeys": ["k"], "reason": "why"},
    }  # fmt: skip
    r = user_requests.parse(obj)
    assert (r.by, r.gpus, r.fault_keys, r.created, r.phase) == (
        "field manager kubectl-create", ("3",), ("k",), NOW, None)  # fmt: skip
    obj["metadata"]["annotations"] = {user_requests.REQUESTED_BY: "alice@example.com"}
    obj["status"] = {"phase": "Pending"}
    assert (user_requests.parse(obj).by, user_requests.parse(obj).phase) == ("alice@example.com", "Pending")


@pytest.mark.parametrize(
    ("gpu", "bus"),
    [("0000:3a:00", "0000:3a:00"), ("00000000:3A:00.0", "0000:3a:00"), ("3", None), ("GPU-1", None)],
)
def test_pci(gpu: str, bus: str | None) -> None:
    assert user_requests.pci(gpu) == bus
