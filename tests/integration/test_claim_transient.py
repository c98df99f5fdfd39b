"""A transient failure does not spend a stage's attempt cap, on the real control plane and FerretDB:
found by the chaos suite, where a 12 s API server restart parked a repair whose janitor (5 attempts)
retried with back-off 0.5, 1, 2 and 4 s, and the node stayed cordoned for good."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from devtools import procs
from devtools.cluster import LocalCluster
from faultline import store
from faultline.errors import ApiUnavailableError
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

    def handle(claim: store.Claim) -> str:
        tries.append(claim.status.attempts)
        if len(tries) <= 3:
            raise ApiUnavailableError("get", f"Node {node}", "connection refused (the API server restarting)")
        return store.DONE

    st.write_fault(f, revision=1)
    run_loop(handle, "transient_cap_test", max_attempts=2)
    procs.wait_for("done after the outage", lambda: item(st, f.id).quarantine.state == store.DONE, 30)
    assert tries == [1, 2, 3, 4]  # never parked at the stage's cap of 2


@pytest.mark.parametrize(
    ("exc", "cap"),
    [(ApiUnavailableError("get", "Node n", "refused"), common.TRANSIENT_ATTEMPTS), (ValueError("a bug"), 5)],
)
def test_the_attempt_cap_by_kind_of_failure(exc: Exception, cap: int) -> None:
    assert common.attempt_cap(exc, 5) == cap
    assert common.attempt_cap(exc, 50) == 50  # a stage's larger cap stands
