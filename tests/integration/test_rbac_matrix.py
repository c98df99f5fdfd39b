"""The chart's RBAC matrix (charts/faultline/rbac-matrix.yaml, issue 15 item 8) against the installed chart.

`helm install` with every component switched on, and janitor.namespace a namespace of its own, into the
local API server (which authorizes with Node,RBAC: devtools/cluster.py). Then:
- each ServiceAccount the release made (and its Helm hooks': their RBAC is created from `helm get hooks`,
  as helm would when the hook runs) is one the matrix lists, and each one the matrix lists was made;
- one SubjectAccessReview per row, verb and scope, as the ServiceAccount with its token's groups,
  answers exactly as the matrix says (printed as a table; run with -s or -rP to see it);
- every grant of every Role, ClusterRole and binding the release made, read back from the API, is a
  `must` row of the ServiceAccount it binds: a permission added to the chart without a row fails here."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import procs, rbac_matrix, tools
from devtools.cluster import LocalCluster
from faultline import kube
from faultline.errors import NotFoundError, TransientError

pytestmark = pytest.mark.integration
CHART = Path(__file__).resolve().parents[2] / "charts" / "faultline"
DIGEST = "sha256:" + "0123456789abcdef" * 4
# `<key>.enabled` switches in values.yaml that are not components (every other one is switched on)
NOT_COMPONENTS = {
    "networkPolicy": "NetworkPolicies grant no API access",
    "podMonitor": "needs the Prometheus Operator's CRD, and grants no API access",
    "alerts": "a PrometheusRule: needs the Prometheus Operator's CRD, and grants no API access",
}
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def switches() -> list[str]:
    """Every component's `enabled` switch in values.yaml, on: a component added later is installed too."""
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return [f"{key}.enabled=true" for key, value in values.items()
            if isinstance(value, dict) and "enabled" in value and key not in NOT_COMPONENTS]  # fmt: skip


def _helm(kubeconfig: Path, *args: str) -> str:
    out = subprocess.run([str(tools.binary("helm")), "--kubeconfig", str(kubeconfig), *args],
                         capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    assert out.returncode == 0, f"helm {' '.join(args[:2])}: {out.stderr}"
    return out.stdout


def _create(api: Any, doc: dict[str, Any]) -> None:
    """A ServiceAccount or an RBAC object of a hook, as helm creates it when the hook runs."""
    core, rbac = kube.core(api), kube.rbac(api)
    ns = doc["metadata"].get("namespace", "")
    create = {
        "ServiceAccount": lambda: core.create_namespaced_service_account(ns, doc),
        "ClusterRole": lambda: rbac.create_cluster_role(doc),
        "ClusterRoleBinding": lambda: rbac.create_cluster_role_binding(doc),
        "Role": lambda: rbac.create_namespaced_role(ns, doc),
        "RoleBinding": lambda: rbac.create_namespaced_role_binding(ns, doc),
    }[doc["kind"]]
    with kube.client.translated("create", f"{doc['kind']} {doc['metadata']['name']}"):
        create()


def _listed(api: Any, kind: str, selector: str) -> list[dict[str, Any]]:
    rbac, core = kube.rbac(api), kube.core(api)
    method = {
        "ClusterRole": rbac.list_cluster_role,
        "ClusterRoleBinding": rbac.list_cluster_role_binding,
        "Role": rbac.list_role_for_all_namespaces,
        "RoleBinding": rbac.list_role_binding_for_all_namespaces,
        "ServiceAccount": core.list_service_account_for_all_namespaces,
    }[kind]
    items = kube.client.read_json("list", kind, method, label_selector=selector)["items"]
    return [{**item, "kind": kind} for item in items]


@pytest.fixture(scope="module")
def release(cluster: LocalCluster) -> Iterator[rbac_matrix.Names]:
    """The chart installed with every component on; its hooks' identities created; all removed after
    the module's tests (the last one adds a rule)."""
    api = cluster.api()
    suffix = uuid.uuid4().hex[:6]
    names = rbac_matrix.Names(name=f"r{suffix}", release=f"rbac-{suffix}", jobs=f"rbac-jobs-{suffix}")
    core = kube.core(api)
    core.create_namespace({"metadata": {"name": names.jobs}})
    sets = [
        *switches(),
        f"janitor.namespace={names.jobs}",
        f"image.digest={DIGEST}",
        "export.sinks[0].name=ops",
        "export.sinks[0].url=https://events.example.invalid/",
    ]
    hooks: list[dict[str, Any]] = []
    try:
        _helm(cluster.kubeconfig, "install", names.name, str(CHART), "--namespace", names.release,
              "--create-namespace", *(a for s in sets for a in ("--set", s)))  # fmt: skip
        out = _helm(cluster.kubeconfig, "get", "hooks", names.name, "--namespace", names.release)
        hooks = [d for d in yaml.safe_load_all(out) if d and d["kind"] in ("ServiceAccount", *RBAC_KINDS)]
        for doc in hooks:
            _create(api, doc)
        yield names
    finally:
        subprocess.run([str(tools.binary("helm")), "--kubeconfig", str(cluster.kubeconfig), "uninstall",
                        names.name, "--namespace", names.release, "--no-hooks", "--wait"],
                       capture_output=True, check=False, timeout=120)  # fmt: skip
        rbac = kube.rbac(api)
        for doc in hooks:  # the hooks' cluster-wide objects (the namespaced ones go with their namespace)
            delete = {"ClusterRole": rbac.delete_cluster_role,
                      "ClusterRoleBinding": rbac.delete_cluster_role_binding}.get(doc["kind"])  # fmt: skip
            if delete is not None:
                with contextlib.suppress(NotFoundError), kube.client.translated("delete", doc["kind"]):
                    delete(doc["metadata"]["name"])
        for ns in (names.release, names.jobs):
            with contextlib.suppress(NotFoundError), kube.client.translated("delete", f"Namespace {ns}"):
                core.delete_namespace(ns, propagation_policy="Background")


def _answer(api: Any, check: rbac_matrix.Check) -> bool:
    ns, name = check.service_account.split("/")
    user, groups = kube.access.service_account(ns, name)
    resource, _, subresource = check.resource.partition("/")
    return kube.access.allowed(api, user, groups, verb=check.verb, group=check.group, resource=resource,
                               subresource=subresource, namespace=check.namespace, name=check.name)  # fmt: skip


def test_every_service_account_may_do_exactly_what_the_matrix_says(
    api: Any, release: rbac_matrix.Names, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = rbac_matrix.load()
    selector = f"app.kubernetes.io/instance={release.name}"

    # the accounts: made by the release (or its hooks) <=> listed in the matrix
    accounts = _listed(api, "ServiceAccount", selector)
    made = {f"{a['metadata']['namespace']}/{a['metadata']['name']}" for a in accounts}
    listed = {release.account(a): key for key, a in matrix.accounts.items()}
    assert made == set(listed), (
        f"ServiceAccounts made but not in {rbac_matrix.MATRIX.name}: {sorted(made - set(listed))}; "
        f"in it but not made: {sorted(set(listed) - made)}"
    )

    # every grant is a `must` row (read back from the API: what the chart really made)
    objects = [o for kind in RBAC_KINDS for o in _listed(api, kind, selector)]
    assert {o["kind"] for o in objects} == set(RBAC_KINDS)  # the read found the chart's objects
    grants = rbac_matrix.grants([o for o in objects if o["kind"].endswith("Binding")],
                                [o for o in objects if not o["kind"].endswith("Binding")])  # fmt: skip
    assert {g.subject for g in grants} <= made
    missing = rbac_matrix.uncovered(matrix, release, grants)
    assert not missing, "grants the matrix does not list:\n" + "\n".join(missing)

    # every question answered as the matrix says; RBAC's cache takes the new bindings in shortly after
    # they are created, so the allowed questions are polled first
    checks = rbac_matrix.checks(matrix, release)
    allowed = [c for c in checks if c.allowed]
    with contextlib.suppress(TransientError):  # a question still refused is reported below, with the rest
        procs.wait_for("the release's RBAC in effect", lambda: all(_answer(api, c) for c in allowed), 30)
    answers = [(c, _answer(api, c)) for c in checks]
    rows = [[c.service_account.split("/")[1], c.what, "allowed" if c.allowed else "denied",
             "allowed" if got else "denied", "" if got == c.allowed else "WRONG"] for c, got in answers]  # fmt: skip
    print(rbac_matrix.text_table(["ServiceAccount", "question", "matrix", "API server", ""], rows))
    counts = Counter((c.account, got) for c, got in answers)
    summary = [[key, str(counts[key, True]), str(counts[key, False])] for key in matrix.accounts]
    with capsys.disabled():
        print(f"\nRBAC matrix, {len(answers)} SubjectAccessReviews:")
        print(rbac_matrix.text_table(["ServiceAccount", "allowed", "denied"], summary))
    wrong = [f"{c.service_account} {c.what}: the API server says {'allowed' if got else 'denied'} ({c.why})"
             for c, got in answers if got != c.allowed]  # fmt: skip
    assert not wrong, "answers that differ from the matrix:\n" + "\n".join(wrong)
    assert {c.account for c in checks} == set(matrix.accounts)


def test_a_grant_the_matrix_does_not_list_is_found(api: Any, release: rbac_matrix.Names) -> None:
    """The coverage check on the real objects: a rule added to a component's ClusterRole (as a template
    change would) is named, and the API server then allows it."""
    matrix = rbac_matrix.load()
    selector = f"app.kubernetes.io/instance={release.name}"
    name = f"{release.name}-drain"
    added = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}
    with kube.client.translated("patch", f"ClusterRole {name}"):  # a JSON patch: add one rule
        kube.rbac(api).patch_cluster_role(name, [{"op": "add", "path": "/rules/-", "value": added}])
    objects = [o for kind in RBAC_KINDS for o in _listed(api, kind, selector)]
    grants = rbac_matrix.grants([o for o in objects if o["kind"].endswith("Binding")],
                                [o for o in objects if not o["kind"].endswith("Binding")])  # fmt: skip
    assert rbac_matrix.uncovered(matrix, release, grants) == [
        f"ClusterRoleBinding {name} -> ClusterRole {name} grants {release.release}/{name} "
        "`list secrets cluster-wide`: no `must` row of rbac-matrix.yaml says so"
    ]
    user, groups = kube.access.service_account(release.release, name)
    procs.wait_for("the added rule in effect",
                   lambda: kube.access.allowed(api, user, groups, verb="list", resource="secrets"), 30)  # fmt: skip
