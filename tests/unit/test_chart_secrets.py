"""The chart's Secrets hook's data (workers.chart_secrets.wanted): random and fixed keys made only when
missing, derived keys always from the stored values."""

from __future__ import annotations

import pytest

from faultline import config
from workers import chart_secrets as cs

STORE = cs.SecretSpec("fl-store", random={"password": 32}, fixed={"username": "faultline"},
                      derived={"uri": "mongodb://${username}:${password}@fl-ferretdb:27017/?authSource=%24external"})  # fmt: skip


def test_made_once_then_kept() -> None:
    first = cs.wanted(STORE, {})
    password = first["password"].decode()
    assert len(password) == 32 and password.isalnum()
    assert (
        first["uri"] == f"mongodb://faultline:{password}@fl-ferretdb:27017/?authSource=%24external".encode()
    )
    assert cs.wanted(STORE, first) == first  # nothing new on a second run
    assert cs.wanted(STORE, {})["password"] != first["password"]  # drawn, not fixed


def test_a_stored_value_is_never_replaced_and_derived_keys_follow_it() -> None:
    have = {"password": b"old-one", "username": b"someone", "uri": b"mongodb://stale"}
    got = cs.wanted(STORE, have)
    assert (got["password"], got["username"]) == (b"old-one", b"someone")
    assert got["uri"] == b"mongodb://someone:old-one@fl-ferretdb:27017/?authSource=%24external"
    assert cs.wanted(cs.SecretSpec("tls"), {"ca.crt": b"x"}) == {"ca.crt": b"x"}  # keys of others kept


def test_a_template_naming_an_unknown_key_is_named() -> None:
    bad = cs.SecretSpec("fl-store", random={"password": 32}, derived={"uri": "x://${pasword}"})
    with pytest.raises(ValueError, match="Secret fl-store: derived key 'uri'"):
        cs.wanted(bad, {})


@pytest.mark.parametrize(
    ("item", "said"),
    [({"name": "s", "random": {"k": 8}}, "length 8 is not 16-512"), ({"name": "s", "fixed": {"bad key": "v"}}, "'bad key' is not a Secret key"),
     ({"name": "Bad_Name"}, "name")],
)  # fmt: skip
def test_bad_settings_are_named(item: dict[str, object], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        config.ChartSecretsConfig.model_validate({"secrets": [item]})
