"""Red team: the preflight gang's Lease rights, as the chart renders them, on the real API server. Only the
ServiceAccounts named in `preflight.gang.serviceAccounts` may write Leases, and only gang Leases: a bound
account cannot take over another application's Lease (its leader election) in its namespace, and the
namespace's other accounts get nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devtools import kubeconfig, procs
from devtools.cluster import LocalCluster
from faultline import kube
from faultline.errors import ApiError, ForbiddenError
from faultline.kube import lite
from faultline.kube import preflight as kpreflight
from tests.integration import chartutil, test_forged_evidence

pytestmark = [pytest.mark.integration, pytest.mark.redteam]


def _rendered(namespace: str, *sets: str) -> list[dict[str, Any]]:
    """The chart's gang ClusterRole, RoleBindings and admission policy for a release in `namespace`."""
    docs = chartutil.rendered_for_test(
        "fl", namespace, "templates/preflight.yaml", "preflight.enabled=true", *sets
    )
    return [d for d in docs if d["metadata"]["name"].startswith("fl-preflight-gang")]


@pytest.fixture
def accounts(
    cluster: LocalCluster, api: Any, namespace: str, tmp_path: Path
) -> Iterator[dict[str, lite.Client]]:
    """The chart's gang objects with `preflight.gang.serviceAccounts=[NS/trainer]` in force, and clients as
    `trainer` and as `other`, both ServiceAccounts of the namespace."""
    core, rbac = kube.core(api), client.RbacAuthorizationV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    docs = _rendered(namespace, f"preflight.gang.serviceAccounts={{{namespace}/trainer}}")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    made: list[tuple[Any, str]] = []
    clients: dict[str, lite.Client] = {}
    try:
        for doc in docs:
            name = doc["metadata"]["name"]
            if doc["kind"] == "ClusterRole":
                rbac.create_cluster_role(doc)
                made.append((rbac.delete_cluster_role, name))
            elif doc["kind"] == "RoleBinding":
                assert doc["metadata"]["namespace"] == namespace
                rbac.create_namespaced_role_binding(namespace, doc)  # gone with the namespace
            elif doc["kind"] == "ValidatingAdmissionPolicy":
                admission.create_validating_admission_policy(doc)
                made.append((admission.delete_validating_admission_policy, name))
            else:
                admission.create_validating_admission_policy_binding(doc)
                made.append((admission.delete_validating_admission_policy_binding, name))
        for sa in ("trainer", "other"):
            core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
            token = kube.tokens.mint(api, namespace, sa)
            config = kubeconfig.write(tmp_path / f"{sa}.kubeconfig", cluster.server, cluster.pki.ca, sa,
                                      {"token": token})  # fmt: skip
            clients[sa] = lite.Client.connect(config)
        # another application's Lease (its leader election), made by its own controller
        client.CoordinationV1Api(api).create_namespaced_lease(
            namespace, {"metadata": {"name": "app-leader"}, "spec": {"holderIdentity": "app-0"}}
        )
        # the policy compiles in the background: wait until it refuses the bound account a foreign Lease
        procs.wait_for("the admission policy in force", lambda: test_forged_evidence._refused(
            lambda: kpreflight.annotate_lease(clients["trainer"], namespace, "app-leader", {"x": "1"})), 30)  # fmt: skip
        yield clients
    finally:
        for c in clients.values():
            c.close()
        for delete, name in reversed(made):
            with contextlib.suppress(Exception):
                delete(name)


def test_a_bound_account_writes_gang_leases_and_nothing_else(
    accounts: dict[str, lite.Client], api: Any, namespace: str
) -> None:
    trainer, other = accounts["trainer"], accounts["other"]
    # what the init containers do: create, read and annotate their gang's Lease
    kpreflight.create_lease(trainer, namespace, "faultline-gang-job-1-abc", annotations={"m": "1"}, labels={})
    kpreflight.annotate_lease(
        trainer, namespace, "faultline-gang-job-1-abc", {"faultline.io/gang-round": "1"}
    )
    lease = kpreflight.read_lease(trainer, namespace, "faultline-gang-job-1-abc")
    assert lease is not None and lease["metadata"]["annotations"]["faultline.io/gang-round"] == "1"
    # another application's Lease: neither taken over nor made
    with pytest.raises(ApiError) as caught:
        kpreflight.annotate_lease(trainer, namespace, "app-leader", {"taken": "yes"})
    assert "may write only gang Leases (faultline-gang-*), not app-leader" in str(caught.value)
    with pytest.raises(ApiError):
        kpreflight.create_lease(trainer, namespace, "other-leader", annotations={}, labels={})
    leader = client.CoordinationV1Api(api).read_namespaced_lease("app-leader", namespace)
    assert leader.spec.holder_identity == "app-0" and "taken" not in (leader.metadata.annotations or {})
    # the namespace's other accounts: no Lease right at all
    with pytest.raises(ForbiddenError):
        kpreflight.create_lease(other, namespace, "faultline-gang-job-2-def", annotations={}, labels={})
    with pytest.raises(ForbiddenError):
        kpreflight.read_lease(other, namespace, "faultline-gang-job-1-abc")


def test_the_chart_binds_only_what_it_is_told() -> None:
    both = _rendered("faultline", "preflight.gang.serviceAccounts={train/a,train/b,lab/c}",
                     "preflight.gang.namespaces={research,train}")  # fmt: skip
    bindings = {d["metadata"]["namespace"]: d["subjects"] for d in both if d["kind"] == "RoleBinding"}
    assert bindings == {
        "lab": [{"kind": "ServiceAccount", "name": "c", "namespace": "lab"}],
        "research": [
            {
                "kind": "Group",
                "apiGroup": "rbac.authorization.k8s.io",
                "name": "system:serviceaccounts:research",
            }
        ],
        "train": [
            {
                "kind": "Group",
                "apiGroup": "rbac.authorization.k8s.io",
                "name": "system:serviceaccounts:train",
            },
            {"kind": "ServiceAccount", "name": "a", "namespace": "train"},
            {"kind": "ServiceAccount", "name": "b", "namespace": "train"},
        ],
    }
    (policy,) = [d for d in both if d["kind"] == "ValidatingAdmissionPolicy"]
    condition = policy["spec"]["matchConditions"][0]["expression"]
    assert (
        '["system:serviceaccount:train:a","system:serviceaccount:train:b","system:serviceaccount:lab:c"]'
        in condition
    )
    assert '["system:serviceaccount:research:","system:serviceaccount:train:"]' in condition
    # nothing bound, or the policy off: no binding, no policy
    assert {d["kind"] for d in _rendered("faultline")} == {"ClusterRole"}
    off = _rendered(
        "faultline", "preflight.gang.serviceAccounts={lab/c}", "preflight.gang.restrictLeases=false"
    )
    assert {d["kind"] for d in off} == {"ClusterRole", "RoleBinding"}
