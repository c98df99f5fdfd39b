"""The chart's alerts: the PrometheusRule `helm template` renders passes `promtool check rules` (every
expression and annotation template parses), fires and stays quiet as `tests/alerts/alerts.test.yaml` says
(`promtool test rules`), names only metrics the components export, and links each alert to its runbook
section."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import metric_catalogue, tools

CHART = tools.REPO / "charts" / "faultline"
ALERT_TESTS = tools.REPO / "tests" / "alerts" / "alerts.test.yaml"
RUNBOOK = tools.REPO / "docs" / "operations" / "runbook.md"


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    tools.ensure("helm", "prometheus")


def render_rules(*sets: str) -> dict[str, Any]:
    argv = [str(tools.binary("helm")), "template", "fl", str(CHART), "--set", "alerts.enabled=true",
            "--set", "podMonitor.enabled=true", "--show-only", "templates/prometheusrule.yaml"]  # fmt: skip
    for s in sets:
        argv += ["--set", s]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    rule = yaml.safe_load(done.stdout)
    assert rule["kind"] == "PrometheusRule"
    return dict(rule["spec"])


def alerts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in spec["groups"] for r in g["rules"] if "alert" in r]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools.binary("promtool")), *args], capture_output=True, text=True, cwd=cwd,
                          check=False, timeout=120)  # fmt: skip


def test_the_rules_parse_and_fire_as_their_tests_say(tmp_path: Path) -> None:
    spec = render_rules()
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(spec))
    checked = promtool("check", "rules", "full.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for rule in alerts(spec):  # the firing tests compare labels; the annotations are checked below
        rule.pop("annotations")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    shutil.copy(ALERT_TESTS, tmp_path / "alerts.test.yaml")
    tested = promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    named = {t["alertname"] for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
             for t in case["alert_rule_test"]}  # fmt: skip
    assert named == {r["alert"] for r in alerts(spec)}, "every alert has firing tests"


def test_a_changed_threshold_changes_when_it_fires(tmp_path: Path) -> None:
    """The tests above can fail: the same tests on rules rendered with other values do."""
    spec = render_rules("alerts.nodeHeldHours=48", "alerts.repairFailures=5")
    for rule in alerts(spec):
        rule.pop("annotations")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    shutil.copy(ALERT_TESTS, tmp_path / "alerts.test.yaml")
    tested = promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert tested.returncode != 0
    assert "FaultlineNodeHeldTooLong" in tested.stdout + tested.stderr
    assert "FaultlineRepairsFailing" in tested.stdout + tested.stderr


def test_each_alert_links_its_runbook_section_and_names_exported_metrics() -> None:
    spec = render_rules("alerts.runbookUrl=https://example.com/runbook")
    headings = {m.group(1) for m in re.finditer(r"^#{2,3} (Faultline\w+)\s*$", RUNBOOK.read_text(), re.M)}
    exported = set().union(*metric_catalogue.catalogue().values())
    for rule in alerts(spec):
        name = rule["alert"]
        assert rule["annotations"]["runbook_url"] == f"https://example.com/runbook#{name.lower()}"
        assert name in headings, f"docs/operations/runbook.md has no section `### {name}`"
        assert rule["labels"]["severity"] in ("critical", "warning")
        missing = metric_catalogue.unexported(rule["expr"], exported)
        assert not missing, f"{name}: {missing} are not exported by any component"
