"""Object rules: loading and validation (errors name the file, the rule and the field), CEL, overrides, the
built-in rules' examples and `faultline patterns test` on them."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from faultline.errors import PackError
from faultline.models import Action, Entity
from patterns import cel, object_examples, object_rules

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RULE = """\
pack: mine
rules:
  - id: big-pods
    description: a pod asks for many GPUs
    watch: {api_version: v1, kind: Pod}
    params: {limit: 4}
    when: >-
      object.spec.containers.exists(c, has(c.resources) && has(c.resources.limits)
        && "nvidia.com/gpu" in c.resources.limits && int(c.resources.limits["nvidia.com/gpu"]) > params.limit)
    node: 'has(object.spec.nodeName) ? object.spec.nodeName : ""'
    entity: {type: POD, id: 'object.metadata.namespace + "/" + object.metadata.name'}
    fault: {code: BIG-POD, component: GPU}
    examples:
      match:
        - object: {kind: Pod, metadata: {name: p, namespace: n}, spec: {nodeName: gpu-1,
                   containers: [{name: c, resources: {limits: {nvidia.com/gpu: "8"}}}]}}
          expect: {node: gpu-1, entity: {type: POD, id: n/p}}
      no_match:
        - object: {kind: Pod, metadata: {name: p, namespace: n}, spec: {nodeName: gpu-1,
                   containers: [{name: c, resources: {limits: {nvidia.com/gpu: "2"}}}]}}
"""


def write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_every_builtin_rule_example_passes() -> None:
    rules = object_rules.load(check_examples=False)
    assert object_examples.run(rules) == []
    assert set(rules.rules) == {"gpus-not-advertised", "node-not-ready", "gpu-pod-unschedulable",
                                "gpu-pod-admission-error"}  # fmt: skip
    assert object_examples.count(rules) >= 20


def test_patterns_test_runs_the_object_rules_examples_too(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "faultline", "patterns", "test"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: 25 examples of 4 object rules in 1 files" in done.stdout.splitlines()
    broken = write(tmp_path, RULE.replace("expect: {node: gpu-1,", "expect: {node: gpu-2,"))
    done = subprocess.run([sys.executable, "-m", "faultline", "patterns", "test", "--objects", str(broken)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 1
    assert (f"FAIL {broken}: rule 'big-pods': match example 1 (Pod n/p): expected node='gpu-2', got 'gpu-1'"
            in done.stdout.splitlines())  # fmt: skip
    assert done.stdout.splitlines()[-1] == "1 object rule example failure(s)"


def test_a_user_rule_loads_and_reads_its_object(tmp_path: Path) -> None:
    rules = object_rules.load([write(tmp_path, RULE)])
    rule = rules.rules["big-pods"]
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "n"},
           "spec": {"nodeName": "gpu-3", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "6"}}}]}}  # fmt: skip
    verdict = rule.evaluate(cel.value(pod), T0)
    assert (verdict.holds, verdict.node, verdict.entity) == (True, "gpu-3", Entity(type="POD", id="n/p"))
    assert verdict.message == "a pod asks for many GPUs: Pod n/p"
    unbound = {**pod, "spec": {**pod["spec"], "nodeName": None}}
    del unbound["spec"]["nodeName"]
    assert not rule.evaluate(cel.value(unbound), T0).holds  # no node: no fault
    assert not rule.uses_now
    assert rule.watch.plural == "pods"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            ("    when: >-\n", "    when: 'object.metadata.name == '\n    y: >-\n"),
            "rule 'big-pods': y: unknown field",
        ),
        (
            ("node: 'has(object.spec.nodeName)", "node: 'has(object.spec.nodeName) &&"),
            "rule 'big-pods': node: does not parse at line 1, column",
        ),
        (
            ("node: 'has(object.spec.nodeName)", "node: 'has(objekt.spec.nodeName)"),
            "rule 'big-pods': node: unknown name 'objekt' (an expression reads object, params and now)",
        ),
        (
            ("fault: {code: BIG-POD,", "fault: {code: big pod,"),
            "rule 'big-pods': fault.code: String should match pattern",
        ),
        (
            ("fault: {code: BIG-POD,", "fault: {code: BIG-POD-" + "X" * 60 + ","),
            "rule 'big-pods': fault.code: Value error, code 'BIG-POD-XXX",
        ),
        (("kind: Pod}", "kind: pod}"), "rule 'big-pods': watch.kind: String should match pattern"),
        (
            ("component: GPU}", "component: GPU, actoin: NONE}"),
            "rule 'big-pods': fault.actoin: unknown field",
        ),
        (
            ("expect: {node: gpu-1,", "expect: {nodes: gpu-1,"),
            "rule 'big-pods': examples.match.0.expect: Value error, unknown field 'nodes'",
        ),
    ],
)
def test_a_bad_rule_fails_at_load_naming_file_rule_and_field(
    tmp_path: Path, change: tuple[str, str], reason: str
) -> None:
    path = write(tmp_path, RULE.replace(*change, 1))
    with pytest.raises(PackError) as caught:
        object_rules.load([path])
    assert str(caught.value).startswith(f"{path}: {reason}"), str(caught.value)


def test_cel_that_does_not_parse_names_where() -> None:
    text = RULE.replace('int(c.resources.limits["nvidia.com/gpu"]) > params.limit)', "> params.limit)")
    rule = object_rules.parse(text, "f.yaml").rules[0]  # the schema takes any string
    with pytest.raises(PackError) as caught:
        object_rules.CompiledRule(rule, "f.yaml")
    assert str(caught.value).startswith("f.yaml: rule 'big-pods': when: does not parse at line 2, column"), (
        caught
    )


def test_an_example_that_fails_stops_the_load(tmp_path: Path) -> None:
    path = write(tmp_path, RULE.replace('nvidia.com/gpu: "2"', 'nvidia.com/gpu: "5"'))
    with pytest.raises(PackError, match=r"rule 'big-pods': no_match example 1 \(Pod n/p\): the rule raises"):
        object_rules.load([path])


def test_an_expression_error_on_an_example_fails_it(tmp_path: Path) -> None:
    # no has() guard: the examples' pods have no labels, so the predicate errs on them
    text = RULE.replace("when: >-\n", 'when: >-\n      object.metadata.labels.x == "y" ||\n', 1)
    rules = object_rules.load([write(tmp_path, text)], check_examples=False)
    failures = [str(f) for f in object_examples.check_rule(rules.rules["big-pods"])]
    assert any("match example 1 (Pod n/p): when: no such member in mapping: 'labels'" in f for f in failures)


def test_a_rule_reading_the_time_needs_each_examples_now(tmp_path: Path) -> None:
    text = RULE.replace("int(c.resources.limits[\"nvidia.com/gpu\"]) > params.limit)",
                        "int(c.resources.limits[\"nvidia.com/gpu\"]) > params.limit) && now > timestamp(\"2020-01-01T00:00:00Z\")")  # fmt: skip
    rules = object_rules.load([write(tmp_path, text)], check_examples=False)
    assert rules.rules["big-pods"].uses_now
    failures = [f.reason for f in object_examples.check_rule(rules.rules["big-pods"])]
    assert failures == ["match example 1 (Pod n/p): give its `now` (the rule reads the time)",
                        "no_match example 1 (Pod n/p): give its `now` (the rule reads the time)"]  # fmt: skip


def test_overrides_change_params_for_fault_and_switch_rules_off(tmp_path: Path) -> None:
    user = write(tmp_path, """\
        pack: site
        overrides:
          gpus-not-advertised: {params: {count_label: example.com/gpus}, for: 5m}
          node-not-ready: {fault: {fatal: false, action: CONTACT_SUPPORT}}
          gpu-pod-unschedulable: {enabled: false}
        """)  # fmt: skip
    rules = object_rules.load([user])
    gpus = rules.rules["gpus-not-advertised"]
    assert gpus.params["count_label"] == "example.com/gpus"
    assert gpus.for_s == 300.0
    assert gpus.overridden_by == [str(user)]
    ready = rules.rules["node-not-ready"]
    assert (ready.fault.fatal, ready.fault.action, ready.fault.code) == (False, Action.CONTACT_SUPPORT,
                                                                         "KUBE-NODE-NOT-READY")  # fmt: skip
    assert "gpu-pod-unschedulable" not in {r.id for r in rules.enabled()}
    node = {"kind": "Node", "metadata": {"name": "n1", "labels": {"example.com/gpus": "8"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    assert gpus.evaluate(cel.value(node), T0).holds  # the new label is read
    assert object_examples.run(rules) == []  # examples test the rules as written (`patterns test`)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ("nope: {for: 1m}", "overrides: no rule 'nope' is loaded before these overrides"),
        ("node-not-ready: {params: {x: 1}}", "overrides: rule 'node-not-ready': params: unknown param 'x' (the rule has control_plane_label, gpu_label, resource)"),
        ("node-not-ready: {for: soon}", "overrides.node-not-ready.for: Value error, not a duration: 'soon'"),
    ],
)  # fmt: skip
def test_a_bad_override_names_file_and_rule(tmp_path: Path, overrides: str, reason: str) -> None:
    path = write(tmp_path, f"pack: site\noverrides:\n  {overrides}\n")
    with pytest.raises(PackError) as caught:
        object_rules.load([path])
    assert str(caught.value).startswith(f"{path}: {reason}"), str(caught.value)


def test_a_user_rule_replaces_the_builtin_of_its_id(tmp_path: Path) -> None:
    path = write(tmp_path, RULE.replace("id: big-pods", "id: node-not-ready"))
    rules = object_rules.load([path])
    assert rules.rules["node-not-ready"].fault.code == "BIG-POD"
    assert rules.rules["node-not-ready"].file == str(path)


def test_duplicate_ids_and_empty_files_are_refused(tmp_path: Path) -> None:
    twice = RULE + RULE.split("rules:\n", 1)[1]
    with pytest.raises(PackError, match="rule 'big-pods': duplicate rule id in one file"):
        object_rules.load([write(tmp_path, twice)], builtin=False)
    with pytest.raises(PackError, match="a rule file needs `rules` or `overrides`"):
        object_rules.load([write(tmp_path, "pack: empty\n", "e.yaml")], builtin=False)
    with pytest.raises(PackError, match="does not exist"):
        object_rules.load([tmp_path / "missing"])


@pytest.mark.parametrize(
    ("kind", "plural"),
    [("Node", "nodes"), ("Pod", "pods"), ("Ingress", "ingresses"), ("NetworkPolicy", "networkpolicies"),
     ("RemediationRequest", "remediationrequests"), ("Endpoints", "endpointses")],
)  # fmt: skip
def test_the_plural_is_guessed_as_the_api_servers_rest_mapper_does(kind: str, plural: str) -> None:
    assert object_rules.guess_resource(kind) == plural


def test_a_predicate_that_errs_is_not_true_and_says_why() -> None:
    rule = object_rules.load().rules["node-not-ready"]
    verdict = rule.evaluate(
        cel.value(
            {
                "kind": "Node",
                "metadata": {"name": "n", "labels": {"nvidia.com/gpu.present": "true"}},
                "status": {"conditions": "x"},
            }
        ),
        T0,
    )
    assert not verdict.holds
    assert verdict.error is not None and verdict.error.startswith("when: ")


@pytest.mark.redteam
def test_an_expression_whose_cost_is_unbounded_is_refused_at_load() -> None:
    """A rule that would cost a list's length cubed, or one too large, never loads; chained macros and the
    built-in rules' nesting of two do."""
    with pytest.raises(cel.CelError, match="nests 3 macros in one another; the limit is 2"):
        cel.Expression("object.a.all(x, object.a.all(y, object.a.exists(z, z == x + y)))")
    with pytest.raises(cel.CelError, match="parts; the limit is 2000"):
        cel.Expression("+".join(["1"] * 1000) + " == object.a")  # 2,011 characters, 7,013 parts
    with pytest.raises(cel.CelError, match="characters long; the limit is 4000"):
        cel.Expression("'" + "x" * 4000 + "' == object.a")
    cel.Expression("object.a.filter(c, c > 1).map(c, c * 2).exists(c, c > 2)")  # a chain adds: allowed
    cel.Expression("object.a.all(x, object.b.exists(y, y == x))")
