"""Gang records, pure: which gang a pod is in, the Lease's name, a record parsed from a Lease, the verdict
of a round and when a new round opens. The Lease on the real API server is
tests/integration/test_preflight_gang.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from workers import gang

KEYS = ("faultline.io/gang", "jobset.sigs.k8s.io/jobset-name", "volcano.sh/job-name")
SIZES = ("faultline.io/gang-size", "leaderworkerset.sigs.k8s.io/size")
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_identify() -> None:
    assert gang.identify({}, {}, keys=KEYS, size_keys=SIZES) is None
    g = gang.identify(
        {"volcano.sh/job-name": "v", "jobset.sigs.k8s.io/jobset-name": "j"},
        {"faultline.io/gang-size": "3"},
        keys=KEYS,
        size_keys=SIZES,
        round_keys=("attempt",),
    )
    assert g == gang.Gang("jobset.sigs.k8s.io/jobset-name=j", 3)  # the first key of the list wins
    assert gang.identify(
        {"faultline.io/gang": "a"},
        {"faultline.io/gang": "b", "attempt": "1"},
        keys=KEYS,
        size_keys=SIZES,
        round_keys=("attempt",),
    ) == gang.Gang("faultline.io/gang=a,attempt=1", None)
    assert (
        gang.identify({"faultline.io/gang": "  "}, {}, keys=KEYS, size_keys=SIZES) is None
    )  # blank: no gang
    for bad in ("0", "-1", "3.5", "x"):
        with pytest.raises(
            ValueError, match=f"faultline.io/gang-size: '{re.escape(bad)}' is not a gang size"
        ):
            gang.identify(
                {"faultline.io/gang": "a"}, {"faultline.io/gang-size": bad}, keys=KEYS, size_keys=SIZES
            )


@given(st.text(min_size=1, max_size=300))
@example("0" * 38)  # found by hypothesis: a readable part of 38 made a name of 64 characters
@example("a" * 300)
def test_lease_names_are_valid_and_distinct(value: str) -> None:
    name = gang.lease_name(f"jobset.sigs.k8s.io/jobset-name={value}")
    assert DNS_1123.match(name) and len(name) <= 63, name
    assert gang.lease_name(f"jobset.sigs.k8s.io/jobset-name={value}x") != name


def lease(round_: int, *members: tuple[str, str, int, float, str]) -> dict[str, Any]:
    annotations = {gang.ROUND: str(round_), gang.NAME: "g"}
    for pod, state, r, at, reason in members:
        annotations[gang.member_key(pod)] = json.dumps(
            {"pod": pod, "node": f"node-{pod}", "state": state, "round": r, "at": at, "reason": reason}
        )
    annotations[gang.MEMBER + "junk"] = "{not json"  # written by hand: ignored
    return {"metadata": {"name": "faultline-gang-g", "resourceVersion": "42", "annotations": annotations}}


G4 = gang.Gang("faultline.io/gang=g", 4)


def test_verdicts() -> None:
    def verdict(doc: dict[str, Any], g: gang.Gang = G4, round_: int = 1) -> tuple[str, str]:
        v = gang.decide(gang.parse(doc), g, round_=round_)
        return v.state, v.reason

    assert gang.parse(lease(1)).resource_version == "42"
    assert verdict(lease(1, ("a", "passed", 1, 1.0, ""), ("b", "checking", 1, 1.0, ""))) == (
        "wait",
        "gang faultline.io/gang=g: 1 of 4 members passed",
    )
    four = [(p, "passed", 1, 1.0, "") for p in "abcd"]
    assert verdict(lease(1, *four))[0] == "proceed"
    old = [(p, "passed", 1, 1.0, "") for p in "abcd"]
    assert (
        verdict(lease(2, *old, ("e", "passed", 2, 9.0, "")), round_=2)[0] == "wait"
    )  # last round's don't count
    failed = lease(
        1, *four[:3], ("x", "failed", 1, 5.0, "PREFLIGHT-ECC-DBE"), ("y", "failed", 1, 6.0, "later")
    )
    assert verdict(failed) == (
        "failed",
        "gang faultline.io/gang=g: member x on node node-x failed preflight (and 1 more): PREFLIGHT-ECC-DBE",
    )
    assert (
        verdict(lease(1, ("a", "passed", 1, 1.0, "")), gang.Gang("g", None))[0] == "proceed"
    )  # size unknown
    assert verdict(lease(1, ("x", "failed", 1, 1.0, "r")), gang.Gang("g", None))[0] == "failed"
    assert verdict(lease(3), round_=2)[0] == "failed"  # the round closed under a member still waiting


def test_a_failed_round_is_held_then_a_new_one_opens() -> None:
    record = gang.parse(lease(1, ("a", "passed", 1, 100.0, ""), ("x", "failed", 1, 200.0, "r")))
    assert gang.round_to_join(record, now=250.0, failure_hold=120.0) == 1  # the same attempt: fail fast
    assert gang.round_to_join(record, now=320.0, failure_hold=120.0) == 2  # a later attempt starts afresh
    passed = gang.parse(lease(1, ("a", "passed", 1, 100.0, "")))
    assert gang.round_to_join(passed, now=1e9, failure_hold=120.0) == 1
