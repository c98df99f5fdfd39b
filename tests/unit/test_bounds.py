"""Named limits (`faultline.bounds`): what faultline writes where the Kubernetes API bounds it stays within
the bound, and quoted input is cut before it is quoted."""

from __future__ import annotations

from faultline import bounds
from faultline.kube import bodies


def test_a_node_event_stays_within_the_api_servers_limits() -> None:
    body = bodies.node_event(
        "gpu-node-01", reason="FaultlineQuarantined", note="x" * 5000, action="Quarantine", warning=True,
        controller="faultline.io/quarantine", instance="quarantine/" + "i" * 300,
    )  # fmt: skip
    assert len(body["note"]) == bounds.EVENT_NOTE == 1024
    assert len(body["reportingInstance"]) == bounds.EVENT_INSTANCE == 128
    short = bodies.node_event(
        "n", reason="R", note="n", action="A", warning=False, controller="c", instance="i"
    )
    assert (short["note"], short["reportingInstance"]) == ("n", "i")


def test_clip_and_quote() -> None:
    assert bounds.clip("short", 10) == "short"
    assert bounds.clip("a" * 600, bounds.STORED_TEXT) == "a" * 500
    assert bounds.quote("a" * 100) == repr("a" * bounds.QUOTED_INPUT)
    assert bounds.quote("abcd", 3) == "'abc'"
