"""RBAC matrix rows about named objects (resourceNames: the preflight webhook's own Secret and webhook
configuration): a named row asks its question of that object only, a grant by name is covered only by a
row naming the same object, and everyone's unnamed refusal still holds for the account."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from devtools import rbac_matrix

NAMES = rbac_matrix.Names(name="fl", release="flns", jobs="repairs")
MATRIX = """\
everyone:
  mustNot:
    - {verbs: [get], resource: secrets, where: ["{release}"], why: no Secrets}
serviceAccounts:
  webhook:
    name: "{name}-webhook"
    namespace: "{release}"
    runs: a webhook
    must:
      - {verbs: [get, update], resource: secrets, where: ["{release}"], names: ["{name}-webhook-tls"], why: its own}
    mustNot:
      - {verbs: [get], resource: secrets, where: ["{release}"], names: ["{name}-store"], why: not the store's}
"""


def load(tmp_path: Path, text: str = MATRIX) -> rbac_matrix.Matrix:
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return rbac_matrix.load(path)


def test_named_questions(tmp_path: Path) -> None:
    checks = rbac_matrix.checks(load(tmp_path), NAMES)
    assert {(c.verb, c.resource, c.namespace, c.name, c.allowed) for c in checks} == {
        ("get", "secrets", "flns", "fl-webhook-tls", True),
        ("update", "secrets", "flns", "fl-webhook-tls", True),
        ("get", "secrets", "flns", "fl-store", False),
        ("get", "secrets", "flns", "", False),  # everyone's, unnamed: still refused to the webhook
    }
    assert {c.what for c in checks if c.name == "fl-store"} == {"get secrets fl-store in flns"}


def test_a_grant_by_name_is_covered_by_that_name_only(tmp_path: Path) -> None:
    def role(names: list[str] | None) -> dict[str, object]:
        rule: dict[str, object] = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
        if names is not None:
            rule["resourceNames"] = names
        return {"kind": "Role", "metadata": {"name": "r", "namespace": "flns"}, "rules": [rule]}

    binding = {
        "kind": "RoleBinding",
        "metadata": {"name": "b", "namespace": "flns"},
        "roleRef": {"kind": "Role", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "fl-webhook", "namespace": "flns"}],
    }
    matrix = load(tmp_path)
    assert (
        rbac_matrix.uncovered(matrix, NAMES, rbac_matrix.grants([binding], [role(["fl-webhook-tls"])])) == []
    )
    assert rbac_matrix.uncovered(matrix, NAMES, rbac_matrix.grants([binding], [role(["fl-store"])])) == [
        "RoleBinding flns/b -> Role r grants flns/fl-webhook `get secrets fl-store in flns`: no `must` row of "
        "rbac-matrix.yaml says so"
    ]
    assert len(rbac_matrix.uncovered(matrix, NAMES, rbac_matrix.grants([binding], [role(None)]))) == 1


def test_a_bad_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(rbac_matrix.MatrixError, match=r"names: Value error, \['\*'\]: an object's name"):
        load(tmp_path, MATRIX.replace('names: ["{name}-store"]', 'names: ["*"]'))
