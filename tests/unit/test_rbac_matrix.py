"""The chart's RBAC matrix as data (issue 15 item 8): docs/rbac.md is generated from it, a bad row is
refused by name, questions are expanded per verb and scope (an account's own `must` excepting it from
everyone's `mustNot`), and a grant no `must` row lists is named. The API server's answers are checked in
tests/integration/test_rbac_matrix.py."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from devtools import rbac_matrix
from tests.conftest import ROOT

NAMES = rbac_matrix.Names(name="fl", release="flns", jobs="repairs")


def test_the_doc_page_is_generated_from_the_matrix() -> None:
    assert rbac_matrix.main(["--check", str(ROOT / "docs" / "rbac.md")]) == 0, (
        "run python -m devtools.rbac_matrix docs/rbac.md"
    )


def test_render_replaces_only_the_block_between_the_markers() -> None:
    text = f"before\n{rbac_matrix.START}\nold\n{rbac_matrix.END}\nafter\n"
    assert rbac_matrix.render(text, "new") == f"before\n{rbac_matrix.START}\nnew\n{rbac_matrix.END}\nafter\n"
    with pytest.raises(ValueError, match="markers"):
        rbac_matrix.render("no markers", "new")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


ACCOUNT = """\
serviceAccounts:
  worker:
    name: "{name}-worker"
    namespace: "{release}"
    runs: a worker
    must:
      - {verbs: [get, patch], resource: nodes, why: reads and cordons}
      - {verbs: [create], group: batch, resource: jobs, where: ["{jobs}"], why: repair Jobs}
    mustNot:
      - {verbs: [delete], resource: nodes, why: never}
"""


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (ACCOUNT.replace("[get, patch]", '["*"]'), "serviceAccounts.worker.must.0.verbs: Value error, not a verb"),
        (ACCOUNT.replace("resource: nodes,", "resource: '*',", 1), "serviceAccounts.worker.must.0.resource"),
        (ACCOUNT.replace("why: never", "why: never, scope: all"), "mustNot.0.scope: Extra inputs"),
        (ACCOUNT.replace('["{jobs}"]', '["{other}"]'), "must.1.where: Value error, ['{other}']: a scope is"),
        (ACCOUNT.replace('"{name}-worker"', "worker"), "serviceAccounts.worker.name"),
        (ACCOUNT.replace("[delete]", "[patch]"), "must: patch nodes (cluster) is also in serviceAccounts.worker.mustNot"),
        (ACCOUNT.replace("why: repair Jobs}", "why: repair Jobs}\n      - {verbs: [get], resource: nodes, why: x}"),
         "get nodes (cluster) twice"),
        ("serviceAccounts: {}", "serviceAccounts: Dictionary should have at least 1 item"),
        ("serviceAccounts: [", "not YAML"),
    ],
)  # fmt: skip
def test_a_bad_matrix_is_refused_naming_the_row(tmp_path: Path, text: str, error: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(rbac_matrix.MatrixError, match=r"^" + str(path).replace(".", r"\.")) as refused:
        rbac_matrix.load(path)
    assert error in str(refused.value)


def test_checks_ask_one_question_per_verb_and_scope(tmp_path: Path) -> None:
    everyone = """\
everyone:
  mustNot:
    - {verbs: [create], group: batch, resource: jobs, where: [cluster, "{jobs}"], why: no Jobs}
    - {verbs: [get], resource: secrets, where: [cluster, "{release}"], why: no Secrets}
"""
    text = ACCOUNT + everyone
    checks = rbac_matrix.checks(rbac_matrix.load(_write(tmp_path, text)), NAMES)
    got = {(c.verb, c.resource, c.namespace, c.allowed) for c in checks}
    assert got == {
        ("get", "nodes", "", True), ("patch", "nodes", "", True), ("create", "jobs", "repairs", True),
        ("delete", "nodes", "", False),
        ("create", "jobs", "", False),  # everyone's; in {jobs} the account's own `must` excepts it
        ("get", "secrets", "", False), ("get", "secrets", "flns", False),
    }  # fmt: skip
    assert {c.service_account for c in checks} == {"flns/fl-worker"}
    assert len(checks) == len(got)


def _binding(kind: str, name: str, role_kind: str, role: str, ns: str = "") -> dict[str, Any]:
    meta = {"name": name, **({"namespace": ns} if ns else {})}
    return {"kind": kind, "metadata": meta, "roleRef": {"kind": role_kind, "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "fl-worker", "namespace": "flns"}]}  # fmt: skip


def _role(kind: str, name: str, rules: list[dict[str, Any]], ns: str = "") -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, **({"namespace": ns} if ns else {})}, "rules": rules}


def test_every_grant_must_be_a_must_row_in_its_scope(tmp_path: Path) -> None:
    matrix = rbac_matrix.load(_write(tmp_path, ACCOUNT))
    roles = [
        _role("ClusterRole", "fl-worker", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]),
        _role("Role", "fl-worker-jobs", [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}],
              "repairs"),
    ]  # fmt: skip
    bindings = [_binding("ClusterRoleBinding", "fl-worker", "ClusterRole", "fl-worker"),
                _binding("RoleBinding", "fl-worker-jobs", "Role", "fl-worker-jobs", "repairs")]  # fmt: skip
    assert rbac_matrix.uncovered(matrix, NAMES, rbac_matrix.grants(bindings, roles)) == []

    roles[0]["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]})
    roles[0]["rules"].append({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]})
    roles[0]["rules"].append({"nonResourceURLs": ["/metrics"], "verbs": ["get"]})
    # the jobs rule again, cluster-wide: the row says the jobs namespace only
    bindings.append(_binding("ClusterRoleBinding", "wide", "ClusterRole", "fl-worker-jobs"))
    roles.append(_role("ClusterRole", "fl-worker-jobs", roles[1]["rules"]))
    missing = rbac_matrix.uncovered(matrix, NAMES, rbac_matrix.grants(bindings, roles))
    assert missing == [
        "ClusterRoleBinding fl-worker -> ClusterRole fl-worker grants flns/fl-worker `list secrets cluster-wide`: "
        "no `must` row of rbac-matrix.yaml says so",
        "ClusterRoleBinding fl-worker -> ClusterRole fl-worker grants flns/fl-worker `* *.* cluster-wide`: "
        "no `must` row of rbac-matrix.yaml says so",
        "ClusterRoleBinding fl-worker -> ClusterRole fl-worker grants flns/fl-worker "
        "`get nonResourceURLs:/metrics cluster-wide`: no `must` row of rbac-matrix.yaml says so",
        "ClusterRoleBinding wide -> ClusterRole fl-worker-jobs grants flns/fl-worker "
        "`create jobs.batch cluster-wide`: no `must` row of rbac-matrix.yaml says so",
    ]
    other = _binding("RoleBinding", "x", "Role", "absent", "flns")
    with pytest.raises(rbac_matrix.MatrixError, match="RoleBinding flns/x: its Role absent was not found"):
        rbac_matrix.grants([other], roles)


def test_the_charts_matrix_loads_and_refuses_what_the_issue_names() -> None:
    """The chart's own file: the agent lists no Secret and deletes no Node; the drainer evicts but
    cannot delete a Node; nobody escalates, binds or impersonates; only the uninstall hook, as an
    exception, deletes RemediationRequests."""
    matrix = rbac_matrix.load()
    checks = {(c.account, c.verb, c.group, c.resource, c.namespace): c.allowed
              for c in rbac_matrix.checks(matrix, NAMES)}  # fmt: skip
    assert checks[("agent", "list", "", "secrets", "")] is False
    assert checks[("agent", "delete", "", "nodes", "")] is False
    assert checks[("drain", "create", "", "pods/eviction", "")] is True
    assert checks[("drain", "delete", "", "nodes", "")] is False
    for account in matrix.accounts:
        for verb, resource in (("escalate", "clusterroles"), ("bind", "clusterroles"), ("escalate", "roles")):
            assert checks[(account, verb, "rbac.authorization.k8s.io", resource, "")] is False
        for resource in ("users", "groups", "serviceaccounts"):
            assert checks[(account, "impersonate", "", resource, "")] is False
        allowed = checks[(account, "deletecollection", "faultline.io", "remediationrequests", "")]
        assert allowed is (account == "uninstall"), account
