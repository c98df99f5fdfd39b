"""The chart's object monitor (objectMonitor.enabled): its Deployment, the rules it runs from its ConfigMap
(the built-in rules the chart carries, then objectMonitor.rules and .overrides) and the RBAC the chart makes
from those rules: get, list and watch of exactly the resources they name. Rendered with `helm template`;
then the monitor runs on the real control plane as the chart's ServiceAccount, every watch listing."""

from __future__ import annotations

import contextlib
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import procs, tools
from devtools.cluster import LocalCluster
from faultline import kube, store
from faultline.errors import ConflictError, ForbiddenError
from patterns import object_rules
from tests.integration.test_chart import CHART, EXTERNAL, NS, _apply_identities, render, settings_files
from workers import object_monitor

pytestmark = pytest.mark.integration
ON = "objectMonitor.enabled=true"
BUILTIN = Path(__file__).resolve().parents[2] / "patterns" / "objects" / "kube.yaml"
CONFIG_DIR = "/etc/faultline/config"
USER_RULES = """\
objectMonitor:
  enabled: true
  rules:
    - id: stuck-rollouts
      description: a GPU deployment makes no progress
      watch: {api_version: apps/v1, kind: Deployment}
      when: >-
        has(object.status.conditions) && object.status.conditions.exists(c,
          c.type == "Progressing" && c.status == "False")
      node: '"rollouts"'
      fault: {code: ROLLOUT-STUCK}
      examples:
        match: [{object: {kind: Deployment, metadata: {name: d}, status: {conditions: [{type: Progressing, status: "False"}]}}}]
        no_match: [{object: {kind: Deployment, metadata: {name: d}, status: {}}}]
    - id: lab-gadgets
      description: a gadget of the lab reports a broken GPU
      watch: {api_version: lab.example.com/v1, kind: Gadget, resource: gadgetry, namespace: lab}
      when: 'has(object.status.broken) && object.status.broken'
      node: object.spec.node
      fault: {code: GADGET-BROKEN, component: GPU, fatal: true, action: COMPONENT_RESET}
      examples:
        match: [{object: {kind: Gadget, metadata: {name: g}, spec: {node: n1}, status: {broken: true}}}]
        no_match: [{object: {kind: Gadget, metadata: {name: g}, spec: {node: n1}, status: {}}}]
  overrides:
    gpu-pod-unschedulable: {enabled: false}
    gpu-pod-admission-error: {enabled: false}
    node-not-ready: {for: 5m}
"""


@pytest.fixture(scope="module", autouse=True)
def helm() -> None:
    tools.ensure("helm")


def render_file(path: Path, *sets: str) -> list[dict[str, Any]]:
    argv = [str(tools.binary("helm")), "template", "fl", str(CHART), "--namespace", NS, "-f", str(path),
            *(a for s in (EXTERNAL, *sets) for a in ("--set", s))]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def grants(docs: list[dict[str, Any]]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """(where: cluster or the Role's namespace, API group, resource, verbs) the monitor's roles grant."""
    out = set()
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"] == "fl-object-monitor":
            where = doc["metadata"].get("namespace", "cluster")
            for rule in doc.get("rules") or []:
                out |= {
                    (where, g, r, tuple(rule["verbs"])) for g in rule["apiGroups"] for r in rule["resources"]
                }
    return out


def loaded(docs: list[dict[str, Any]], tmp_path: Path) -> tuple[dict[str, Any], object_rules.RuleSet]:
    """The monitor's settings file, and its rules loaded as the monitor loads them (the ConfigMap's files
    at the paths the settings name)."""
    configmap = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "fl-object-monitor-config"
    )
    settings = yaml.safe_load(configmap["data"]["config.yaml"])
    paths = []
    for path in settings["rules"]:
        local = tmp_path / Path(path).name
        local.write_text(configmap["data"][Path(path).name])
        paths.append(local)
    return settings, object_rules.load(paths, builtin=settings.get("builtin_rules", True))


def wanted(rules: object_rules.RuleSet) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {(r.watch.namespace or "cluster", r.watch.group, r.watch.plural, ("get", "list", "watch"))
            for r in rules.enabled()}  # fmt: skip


def test_off_by_default() -> None:
    assert not [d for d in render(EXTERNAL) if "object-monitor" in d["metadata"]["name"]]


def test_on_it_runs_the_builtin_rules_from_its_configmap_with_read_access_to_nodes_and_pods(
    tmp_path: Path,
) -> None:
    from cli import settings as resolve  # noqa: PLC0415
    from faultline import config  # noqa: PLC0415

    docs = render(ON, EXTERNAL, "objectMonitor.evaluateInterval=10s")
    deployment = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "fl-object-monitor"
    )
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "fl-object-monitor"
    assert pod["containers"][0]["args"] == ["object-monitor", f"--config={CONFIG_DIR}/config.yaml"]
    settings, rules = loaded(docs, tmp_path)
    assert settings["builtin_rules"] is False  # the chart's copy, whose watches the RBAC below was made from
    assert settings["rules"] == [f"{CONFIG_DIR}/builtin-rules.yaml"]
    assert (tmp_path / "builtin-rules.yaml").read_text() == BUILTIN.read_text()
    assert set(rules.rules) == {"gpus-not-advertised", "node-not-ready", "gpu-pod-unschedulable",
                                "gpu-pod-admission-error"}  # fmt: skip
    assert grants(docs) == {("cluster", "", "nodes", ("get", "list", "watch")),
                            ("cluster", "", "pods", ("get", "list", "watch"))} == wanted(rules)  # fmt: skip
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(settings_files(docs)["object-monitor"]))
    cfg = resolve.resolve(config.COMPONENTS["object-monitor"], config_file=file,
                          environ={"MONGODB_URI": "mongodb://mongo:27017"}).config  # fmt: skip
    assert cfg.evaluate_interval.total_seconds() == 10  # type: ignore[attr-defined]


def test_the_rbac_is_made_from_exactly_the_rules_that_run(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(USER_RULES)
    docs = render_file(values)
    settings, rules = loaded(docs, tmp_path)
    assert settings["rules"] == [f"{CONFIG_DIR}/builtin-rules.yaml", f"{CONFIG_DIR}/rules.yaml"]
    assert {r.id for r in rules.enabled()} == {"gpus-not-advertised", "node-not-ready", "stuck-rollouts",
                                               "lab-gadgets"}  # fmt: skip
    assert rules.rules["node-not-ready"].for_s == 300.0
    assert (
        grants(docs)
        == wanted(rules)
        == {
            ("cluster", "", "nodes", ("get", "list", "watch")),  # the pod rules are off: no pods
            ("cluster", "apps", "deployments", ("get", "list", "watch")),  # the plural guessed from the kind
            (
                "lab",
                "lab.example.com",
                "gadgetry",
                ("get", "list", "watch"),
            ),  # named; one namespace: a Role there
        }
    )
    binding = next(
        d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "fl-object-monitor"
    )
    assert binding["metadata"]["namespace"] == "lab"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fl-object-monitor", "namespace": NS}]

    # without the built-in rules only the user's run, and only their resources are granted
    docs = render_file(values, "objectMonitor.builtinRules=false", "objectMonitor.overrides=null")
    settings, rules = loaded(docs, tmp_path)
    assert {r.id for r in rules.enabled()} == {"stuck-rollouts", "lab-gadgets"}
    assert grants(docs) == wanted(rules)
    assert "builtin-rules.yaml" not in str(settings["rules"])


@pytest.mark.parametrize(
    ("sets", "error"),
    [
        ([ON, "objectMonitor.replicas=2"], "at '/objectMonitor/replicas'"),
        ([ON, "objectMonitor.evaluateInterval=soon"], "at '/objectMonitor/evaluateInterval'"),
        ([ON, "objectMonitor.overrides.node-not-ready.enabled=maybe"], "at '/objectMonitor/overrides/node-not-ready/enabled'"),
        ([ON, "objectMonitor.overrides.node-not-ready.severity=high"], "additional properties 'severity' not allowed"),
        ([ON, "objectMonitor.rules[0].id=x"], "at '/objectMonitor/rules/0'"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_by_name(sets: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        render(*sets)


def test_the_monitor_runs_as_its_chart_identity(
    cluster: LocalCluster, api: Any, mongo_db: Any, tmp_path: Path
) -> None:
    docs = render(ON, EXTERNAL)
    with contextlib.suppress(ConflictError), kube.client.translated("create", f"Namespace {NS}"):
        kube.core(api).create_namespace({"metadata": {"name": NS}})
    _apply_identities(api, docs)
    as_monitor = kube.api_client(cluster.service_account_kubeconfig(NS, "fl-object-monitor"))
    try:
        _, rules = loaded(docs, tmp_path)
        st = store.Store(mongo_db)
        st.ensure_indexes()
        monitor = object_monitor.ObjectMonitor(st, as_monitor, object_monitor.Settings(rules=rules))
        monitor.start()
        try:
            procs.wait_for(
                "every watch listed", lambda: all(i.synced.is_set() for i in monitor.informers.values()), 30
            )
            assert [i.stats.errors for i in monitor.informers.values()] == [0, 0, 0]
        finally:
            assert monitor.halt(10.0)
        with pytest.raises(ForbiddenError):  # read-only, and only what the rules name
            kube.client.read_json("list", "Secrets", kube.core(as_monitor).list_secret_for_all_namespaces)
        with pytest.raises(ForbiddenError):
            kube.nodes.patch(as_monitor, cluster.node_names[0], {"metadata": {"labels": {"x": "y"}}})
    finally:
        as_monitor.close()
