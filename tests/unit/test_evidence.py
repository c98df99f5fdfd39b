"""faultline.evidence: what is signed, by whom, and what a verifier makes of it."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path
from typing import Any

import pytest

from faultline import evidence, store
from faultline.errors import ConfigError
from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id

NOW = dt.datetime(2026, 12, 4, 12, 0, 0, 123456, tzinfo=dt.UTC)


def _doc(node: str = "n1", **change: Any) -> tuple[str, dict[str, Any]]:
    fault = Fault(
        id=fault_id(node, "GPU", "0000:3b:00", "XID-79"), node=node, entity=Entity(type="GPU", id="0000:3b:00"),
        code="XID-79", component=Component.GPU, count=2, first_seen=NOW, last_seen=NOW, fatal=True,
        action=Action.RESTART_BM, state=FaultState.OPEN, metadata={"gpu": "3"},
    )  # fmt: skip
    return fault.id, {**store.fault_doc(fault), "revision": 4, **change}


def _stored(doc: dict[str, Any]) -> dict[str, Any]:
    """The document as the store gives it back: times in whole milliseconds, a typed record's dump."""
    out = dict(doc)
    for k in ("first_seen", "last_seen"):
        out[k] = doc[k].replace(microsecond=doc[k].microsecond // 1000 * 1000)
    return store.FaultRecord.from_doc({"_id": "x", **out}).model_dump()


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, evidence.NodeKey]:
    return {n: evidence.NodeKey.load_or_create(tmp_path / n, n) for n in ("n1", "n2")}


def _verifier(
    keys: dict[str, evidence.NodeKey], cluster: evidence.ClusterKey | None = None
) -> evidence.Verifier:
    return evidence.Verifier(lambda node: keys[node].public if node in keys else None, cluster)


def test_an_agents_signature_verifies_as_the_store_gives_the_fault_back(
    keys: dict[str, evidence.NodeKey],
) -> None:
    key, doc = _doc()
    doc["evidence"] = keys["n1"].sign(key, doc)
    verdict = _verifier(keys).verify(key, _stored(doc))
    assert verdict == evidence.Verdict(True, "node:n1")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"fatal": False}, "does not match"),
        ({"code": "XID-48"}, "does not match"),
        ({"state": "resolved"}, "does not match"),
        ({"revision": 5}, "does not match"),
        ({"metadata": {"gpu": "4"}}, "does not match"),
        ({"node": "n2"}, "written for node n2 by node n1's agent"),
    ],
)
def test_any_change_after_signing_is_refused(
    keys: dict[str, evidence.NodeKey], change: dict[str, Any], reason: str
) -> None:
    key, doc = _doc()
    doc["evidence"] = keys["n1"].sign(key, doc)
    verdict = _verifier(keys).verify(key, _stored({**doc, **change}))
    assert not verdict.ok and reason in verdict.reason


def test_a_signature_from_another_nodes_agent_or_none(keys: dict[str, evidence.NodeKey]) -> None:
    key, doc = _doc("n1")
    posing = {**doc, "evidence": {**keys["n2"].sign(key, doc), "by": "node:n1"}}
    assert "does not match" in _verifier(keys).verify(key, posing).reason
    assert _verifier(keys).verify(key, doc).reason == "not signed"
    unknown = _verifier({}).verify(key, {**doc, "evidence": keys["n1"].sign(key, doc)})
    assert unknown.retry and unknown.reason == "its Node publishes no agent key"


def test_cluster_components_sign_with_the_shared_key(keys: dict[str, evidence.NodeKey]) -> None:
    key, doc = _doc()
    secret = b"s" * 32
    doc["evidence"] = evidence.ClusterKey(secret, "analyzer").sign(key, doc)
    assert _verifier(keys, evidence.ClusterKey(secret)).verify(key, _stored(doc)).ok
    assert (
        "does not match the cluster key"
        in _verifier(keys, evidence.ClusterKey(b"t" * 32)).verify(key, doc).reason
    )
    assert "no evidence key" in _verifier(keys).verify(key, doc).reason
    other = {**doc, "evidence": {**doc["evidence"], "by": "cluster:janitor"}}  # the MAC names its signer
    assert not _verifier(keys, evidence.ClusterKey(secret)).verify(key, other).ok
    with pytest.raises(ConfigError, match="at least 32"):
        evidence.ClusterKey(b"short")
    with pytest.raises(ConfigError, match="does not sign faults"):
        evidence.ClusterKey(secret, "drain")


def test_the_agents_key_is_kept_private_and_across_restarts(tmp_path: Path) -> None:
    first = evidence.NodeKey.load_or_create(tmp_path / "state", "n1")
    again = evidence.NodeKey.load_or_create(tmp_path / "state", "n1")
    assert first.public == again.public and first.public.startswith("ed25519:")
    assert stat.S_IMODE((tmp_path / "state" / evidence.KEY_FILE).stat().st_mode) == 0o600
    (tmp_path / "state" / evidence.KEY_FILE).write_text("not a key")
    with pytest.raises(ConfigError, match="not a PEM private key"):
        evidence.NodeKey.load_or_create(tmp_path / "state", "n1")


def test_a_published_key_that_is_not_one() -> None:
    assert evidence.public_key(None) is None
    assert evidence.public_key("rsa:abc") is None
    assert evidence.public_key("ed25519:!!!") is None
    assert evidence.public_key("ed25519:" + "A" * 8) is None
