"""The Helm chart: what it renders for each set of values, and that the RBAC it grants is enough for
every component to do its job on the real control plane (and no more than asked: a few refusals are
checked). The workers run here as the chart's ServiceAccounts, with tokens minted for them."""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import procs, tools
from devtools.cluster import LocalCluster
from faultline import kube, store
from faultline.errors import ConflictError, ForbiddenError
from faultline.kube import lite
from faultline.models import Action, FaultState
from tests.integration.test_drainer import pod, pods_on
from tests.integration.test_janitor import _fault
from workers import breaker, drainer, janitor, quarantine, remediation

pytestmark = pytest.mark.integration
CHART = Path(__file__).resolve().parents[2] / "charts" / "faultline"
NS = "faultline-chart"
WORKERS = ("quarantine", "drain", "remediation", "janitor")
ALL_ON = ["quarantine.enabled=true", "drain.enabled=true", "remediation.enabled=true", "janitor.enabled=true"]


def render(*sets: str, namespace: str = NS) -> list[dict[str, Any]]:
    argv = [str(tools.binary("helm")), "template", "fl", str(CHART), "--namespace", namespace,
            "--set", "mongodb.uri=mongodb://mongo:27017"]  # fmt: skip
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode:
        raise ValueError(out.stderr.strip())
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def kinds(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def settings_files(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each component's settings file (`config.yaml` of its ConfigMap, passed with --config), by component."""
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: yaml.safe_load(d["data"]["config.yaml"])
            for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d["data"]}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def helm() -> None:
    tools.ensure("helm")


def test_defaults_monitor_only() -> None:
    docs = render()
    assert {k for k, _ in kinds(docs)} == {
        "Secret",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "ConfigMap",
    }
    agent = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    args = agent["containers"][0]["args"]
    assert args == ["agent", "--config=/etc/faultline/config/config.yaml"]
    assert settings_files(docs)["agent"]["gpu_backend"] == "nvml"
    env = {e["name"]: e for e in agent["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["MONGODB_URI"]["valueFrom"]["secretKeyRef"] == {"name": "fl-mongodb", "key": "uri"}


def test_each_worker_is_switched_on_by_its_value() -> None:
    for worker in ("quarantine", "drain", "remediation", "janitor"):
        deployments = {n for k, n in kinds(render(f"{worker}.enabled=true")) if k == "Deployment"}
        assert deployments == {f"fl-{worker}"}
    docs = render(*ALL_ON, "quarantine.dryRun=true", "drain.defaultMode=AllowCompletion", "janitor.cloud=gcp",
                  "janitor.rebootVia=cloud", "remediation.canReplace=true")  # fmt: skip
    args = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["args"]
            for d in docs if d["kind"] == "Deployment"}  # fmt: skip
    assert args["fl-quarantine"] == ["worker", "quarantine", "--config=/etc/faultline/config/config.yaml"]
    files = settings_files(docs)
    assert files["quarantine"]["dry_run"] is True
    assert files["drain"]["default_mode"] == "AllowCompletion"
    assert files["remediation"]["can_replace"] is True
    janitor_file = {"cloud": "gcp", "reboot_via": "cloud", "namespace": NS, "service_account": "fl-repair"}
    assert janitor_file.items() <= files["janitor"].items()


@pytest.mark.parametrize(
    "sets",
    [
        [],
        [*ALL_ON, "quarantine.rules=rules: []", "remediation.template=kind: X", "agent.gpuBackend=dcgm",
         "janitor.cloud=oci", "janitor.ociConfigSecret=oci", "janitor.awsRegion=eu-west-1"],
        [*ALL_ON, "quarantine.config.lease=45s", "drain.config.qps=50", "janitor.config.job_timeout=15m",
         "remediation.config.threads=7", "agent.config.gpu_poll_interval=2s", "quarantine.threads=3"],
    ],
)  # fmt: skip
def test_each_component_reads_its_settings_file(sets: list[str], tmp_path: Path) -> None:
    """Every settings file the chart renders is valid for its component's model (as `--config` reads it),
    and `<component>.config` sets any field, over the chart's own keys."""
    from cli import settings  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415

    files = settings_files(render(*sets))
    resolved = {}
    for component, values in files.items():
        path = tmp_path / f"{component}.yaml"
        path.write_text(yaml.safe_dump(values))
        env = {"MONGODB_URI": "mongodb://mongo:27017", "NODE_NAME": "node-1"}
        resolved[component] = settings.resolve(config.COMPONENTS[component], config_file=path, environ=env)
        assert resolved[component].sources["database"] == f"file {path}"
    if "quarantine.config.lease=45s" in sets:
        assert resolved["quarantine"].config.lease == dt.timedelta(seconds=45)  # type: ignore[attr-defined]
        assert resolved["quarantine"].config.threads == 3  # type: ignore[attr-defined]
        assert resolved["drain"].config.qps == 50  # type: ignore[attr-defined]
        assert resolved["janitor"].config.job_timeout == dt.timedelta(minutes=15)  # type: ignore[attr-defined]
        assert resolved["remediation"].config.threads == 7  # type: ignore[attr-defined]
        assert resolved["agent"].config.gpu_poll_interval == 2.0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("sets", "error"),
    [
        (["mongodb.uri="], "mongodb.uri (or mongodb.existingSecret) is required"),
        (["janitor.enabled=true", "janitor.cloud=ibm"], 'janitor.cloud: "ibm" is not one of'),
        (["janitor.enabled=true", "janitor.rebootVia=cloud"], "rebootVia=cloud needs janitor.cloud"),
    ],
)
def test_bad_values_are_refused_by_name(sets: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")):
        render(*sets)


def _apply_identities(api: Any, docs: list[dict[str, Any]]) -> None:
    """The chart's ServiceAccounts and RBAC (its workloads need images this machine cannot run)."""
    core, rbac = kube.core(api), kube.rbac(api)
    create = {
        "ServiceAccount": lambda d: core.create_namespaced_service_account(d["metadata"]["namespace"], d),
        "ClusterRole": rbac.create_cluster_role, "ClusterRoleBinding": rbac.create_cluster_role_binding,
        "Role": lambda d: rbac.create_namespaced_role(d["metadata"]["namespace"], d),
        "RoleBinding": lambda d: rbac.create_namespaced_role_binding(d["metadata"]["namespace"], d),
    }  # fmt: skip
    for doc in docs:
        if doc["kind"] in create:
            # made already by an earlier test in this session
            with contextlib.suppress(ConflictError), kube.client.translated("create", doc["kind"]):
                create[doc["kind"]](doc)


def test_the_charts_rbac_carries_a_repair_end_to_end(
    cluster: LocalCluster, api: Any, mongo_db: Any, namespace: str
) -> None:
    """Every component as its chart ServiceAccount: the agent's calls, then a fault through quarantine,
    drain, remediation and a janitor reboot Job to uncordon."""
    core = kube.core(api)
    with contextlib.suppress(ConflictError), kube.client.translated("create", f"Namespace {NS}"):
        core.create_namespace({"metadata": {"name": NS}})
    kube.resources.ensure_crds(api)
    _apply_identities(api, render(*ALL_ON))
    as_sa = {w: cluster.service_account_kubeconfig(NS, f"fl-{w}") for w in ("agent", *WORKERS)}
    node = cluster.node_names[3]

    # the agent: read its Node, patch a condition, post an Event (its three calls)
    agent = lite.Client.connect(as_sa["agent"])
    try:
        lite.read_node_status(agent, node)
        lite.patch_node_conditions(agent, node, [{"type": "ChartRbacCheck", "status": "True", "reason": "Ok",
                                                   "message": "agent RBAC"}], [])  # fmt: skip
        lite.post_node_event(agent, node, reason="ChartRbacCheck", note="agent RBAC", action="Check",
                             warning=False, controller="faultline.io/agent", instance="test")  # fmt: skip
    finally:
        agent.close()
    assert kube.nodes.conditions(api, node)["ChartRbacCheck"]["status"] == "True"
    kube.nodes.write_conditions(api, node, [], ["ChartRbacCheck"])

    clients = {w: kube.api_client(path) for w, path in as_sa.items() if w != "agent"}
    with pytest.raises(ForbiddenError) as refused:  # the drainer may not cordon
        kube.nodes.patch(clients["drain"], node, {"spec": {"unschedulable": True}})
    assert refused.value.status == 403
    with pytest.raises(ForbiddenError) as refused:  # the janitor runs Jobs only in its own namespace
        kube.jobs.create(clients["janitor"], "default", {"metadata": {"name": "x"}, "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "x", "image": "x"}]}}}})  # fmt: skip
    assert refused.value.status == 403

    core.create_namespaced_pod(namespace, pod("victim", node))
    procs.wait_for(
        "pod running", lambda: core.read_namespaced_pod("victim", namespace).status.phase == "Running", 20
    )
    st = store.Store(mongo_db)
    st.ensure_indexes()
    fault = _fault(node, "XID-79", Action.RESTART_BM)
    fast = {"lease": dt.timedelta(seconds=3), "threads": 2}
    workers: list[Any] = [
        quarantine.QuarantineWorker(st, clients["quarantine"], quarantine.Settings(
            hold_down=dt.timedelta(seconds=0.5), resync_interval=0.3,
            breaker=breaker.BreakerConfig(max_share=None, max_count=None), **fast), "q"),
        drainer.Drainer(st, clients["drain"], drainer.Settings(poll=0.3, resync_interval=0.3, **fast), "d"),
        remediation.Remediation(st, clients["remediation"], remediation.Settings(resync_interval=0.3, **fast), "r"),
        janitor.Janitor(st, clients["janitor"], janitor.Settings(
            namespace=NS, service_account="fl-repair", poll=0.3, reboot_timeout=dt.timedelta(seconds=30),
            validate_timeout=dt.timedelta(seconds=20), **fast), "j"),
    ]  # fmt: skip
    before = cluster.fakelet.nodes[node].boot_id
    try:
        for w in workers:
            w.start()
        st.write_fault(fault, 1)
        procs.wait_for("cordoned", lambda: bool(core.read_node(node).spec.unschedulable), 15)
        procs.wait_for("drained", lambda: pods_on(api, namespace, node) == [], 30)
        procs.wait_for("rebooted by the Job", lambda: cluster.fakelet.nodes[node].boot_id != before, 30)
        st.write_fault(
            fault.model_copy(update={"state": FaultState.RESOLVED, "resolved_at": dt.datetime.now(dt.UTC)}), 2
        )
        procs.wait_for("uncordoned", lambda: not core.read_node(node).spec.unschedulable, 30)
        repair = mongo_db["repairs"].find_one({"node": node})
        assert [r["outcome"] for r in repair["rounds"]] == ["Succeeded"]
        errors = sum(w.metrics.actions.labels(result="error")._value.get() for w in workers)
        assert errors == 0  # no call was refused on the way
    finally:
        for w in workers:
            w.halt()
        core.patch_node(node, {"spec": {"unschedulable": None}})
        kube.resources.delete_requests(
            api, label_selector=f"faultline.io/node={node}"
        )  # the node is shared with other tests of the session
