"""A transient failure does not spend a stage's attempt cap, on the real control plane and FerretDB:
found by the chaos suite, where a 12 s API server restart parked a repair whose janitor (5 attempts)
retried with back-off 0.5, 1, 2 and 4 s, and the node stayed cordoned for good."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from faultline import store
from faultline.errors import ApiUnavailableError
from faultline.models import RepairStep
from tests.integration.test_claim_errors import fault, item, run_loop, st
from workers import common

pytestmark = pytest.mark.integration
__all__ = ["run_loop", "st"]  # fixtures


def test_a_transient_failure_is_tried_past_the_stage_cap_and_then_succeeds(
    st: store.Store, run_loop: Callable[..., common.ClaimLoop], cluster: LocalCluster
) -> None:
    node = cluster.node_names[0]
    f = fault(node, "XID-48")
    tries: list[int] = []

    def handle(claim: store.Claim) -> store.State:
        tries.append(claim.status.attempts)
        if len(tries) <= 3:
            raise ApiUnavailableError("get", f"Node {node}", "connection refused (the API server restarting)")
        return store.State.DONE

    st.write_fault(f, revision=1)
    run_loop(handle, "transient_cap_test", max_attempts=2)
    procs.wait_for("done after the outage", lambda: item(st, f.id).quarantine.state == store.State.DONE, 30)
    assert tries == [1, 2, 3, 4]  # never parked at the stage's cap of 2


@pytest.mark.parametrize(
    ("exc", "cap"),
    [(ApiUnavailableError("get", "Node n", "refused"), common.TRANSIENT_ATTEMPTS), (ValueError("a bug"), 5)],
)
def test_the_attempt_cap_by_kind_of_failure(exc: Exception, cap: int) -> None:
    assert common.attempt_cap(exc, 5) == cap
    assert common.attempt_cap(exc, 50) == 50  # a stage's larger cap stands


def test_waits_hold_no_thread_and_spend_no_attempt(
    st: store.Store, run_loop: Callable[..., common.ClaimLoop], cluster: LocalCluster
) -> None:
    """One claimer thread keeps four items waiting at once (each held between its looks) and finishes
    each when its condition holds: the janitor's reboot waits, in little. Looks are not attempts: a stage cap of 2 never parks an item that waited ten times."""
    nodes = cluster.node_names[:4]
    faults = [fault(n, "XID-48") for n in nodes]
    looks: dict[str, list[int]] = {f.id: [] for f in faults}
    turns: list[str] = []  # the items in the order they were looked at

    def handle(claim: store.Claim) -> common.Outcome:
        seen = looks[str(claim.doc["key"])]
        seen.append(claim.status.attempts)
        turns.append(str(claim.doc["key"]))
        if len(seen) < 10:  # not there yet: look again in 50 ms
            return common.Wait(0.05)
        return store.State.DONE

    for f in faults:
        st.write_fault(f, revision=1)
    run_loop(handle, "wait_test", max_attempts=2)
    procs.wait_for(
        "every item done",
        lambda: all(item(st, f.id).quarantine.state == store.State.DONE for f in faults),
        60,
    )
    for f in faults:
        assert looks[f.id] == [1] * 10  # every look the first attempt: waits spent none
    # looked at in turns while all four waited, not one after the other: before any item was done,
    # every other one had been looked at more than once
    first_done = next(i for i in range(len(turns)) if turns[: i + 1].count(turns[i]) == 10)
    assert all(turns[:first_done].count(f.id) >= 2 for f in faults), turns


def test_a_wait_records_what_its_look_found_before_the_next_look(
    st: store.Store, run_loop: Callable[..., common.ClaimLoop], cluster: LocalCluster
) -> None:
    """A janitor's look at a validating round that is not done yet records what it found (`RoundLook`:
    when it looked, a moved deadline) as the claim is held: the next look, on the document re-read,
    sees it, and a look that moves nothing leaves the deadline as it was."""
    node, t0 = cluster.node_names[0], dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)
    round_ = store.RepairRound(step=RepairStep.REBOOT, request="look-test", requested_at=t0)
    assert st.adopt_request(node, store.UserRequest(name="look-test", uid="u1", turn=1), round_)
    seen: list[tuple[dt.datetime | None, dt.datetime | None]] = []

    def handle(claim: store.Claim) -> common.Outcome:
        last = store.Repair.from_doc(claim.doc).rounds[0]
        seen.append((last.checked_at, last.validate_until))
        if len(seen) < 4:  # the second look moves the deadline; every look says when it was
            until = t0 + dt.timedelta(hours=1) if len(seen) == 2 else None
            return common.Wait(0.05, store.RoundLook(0, checked_at=t0 + dt.timedelta(seconds=len(seen)),
                                                     validate_until=until))  # fmt: skip
        return store.State.DONE

    run_loop(handle, "look_test", stage=store.Stage.JANITOR, collection=store.Work.REPAIRS)
    repair_id = store.user_repair_key(node, 1)
    done = store.State.DONE
    procs.wait_for("done", lambda: (r := st.repair(repair_id)) is not None and r.janitor.state == done, 30)
    hour, s = t0 + dt.timedelta(hours=1), dt.timedelta(seconds=1)
    assert seen == [(None, None), (t0 + s, None), (t0 + 2 * s, hour), (t0 + 3 * s, hour)]
