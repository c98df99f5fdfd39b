"""The chart's Grafana dashboard: the ConfigMap `helm template` renders holds a dashboard whose every query
parses (Prometheus's own parser, through `promtool check rules`), names only metrics the components export,
and shows what an operator looks for first."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import metric_catalogue, tools

CHART = tools.REPO / "charts" / "faultline"
# what Grafana puts in place of the dashboard's variables before it asks Prometheus
VARIABLES = {"$release": ".*", "$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    tools.ensure("helm", "prometheus")


def render(*sets: str) -> dict[str, Any]:
    argv = [str(tools.binary("helm")), "template", "fl", str(CHART), "--set", "dashboard.enabled=true",
            "--show-only", "templates/dashboard.yaml", *[a for s in sets for a in ("--set", s)]]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return dict(yaml.safe_load(done.stdout))


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) of every query of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def expand(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr.replace('"$1"', ""), f"a variable the test does not know: {expr}"
    return expr


def test_every_query_parses_and_names_exported_metrics(tmp_path: Path) -> None:
    cm = render()
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["faultline.json"])
    found = queries(dashboard)
    assert len(found) >= 20
    rules = [{"record": f"dashboard:query_{i}", "expr": expand(expr)} for i, (_, expr) in enumerate(found)]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    done = subprocess.run([str(tools.binary("promtool")), "check", "rules", "queries.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    exported = set().union(*metric_catalogue.catalogue().values())
    for title, expr in found:
        assert metric_catalogue.metric_names(expr) or metric_catalogue.name_regexes(expr), f"{title}: {expr}"
        missing = metric_catalogue.unexported(expr, exported)
        assert not missing, f"{title}: {missing} are not exported by any component"


def test_a_broken_query_is_caught(tmp_path: Path) -> None:
    """The parse above can fail: a query with a typo does."""
    rules = [{"record": "dashboard:bad", "expr": expand("sum by (code (faultline_events_total)")}]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([str(tools.binary("promtool")), "check", "rules", "bad.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    assert done.returncode != 0
    exported = set().union(*metric_catalogue.catalogue().values())
    assert metric_catalogue.unexported("max(faultline_no_such_metric)", exported) == [
        "faultline_no_such_metric"
    ]
    assert metric_catalogue.unexported('sum({__name__=~"faultline_.+_nothing"})', exported) == [
        "__name__=~'faultline_.+_nothing'"
    ]


def test_the_panels_an_operator_looks_for_first() -> None:
    dashboard = json.loads(render()["data"]["faultline.json"])
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for want in ("in service", "held", "repairing", "by code", "time to quarantine", "time out of service",
                 "by outcome", "breaker"):  # fmt: skip
        assert want in titles, want
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    release = next(v for v in dashboard["templating"]["list"] if v["name"] == "release")
    assert "app_kubernetes_io_instance" in release["query"]["query"]
    for _, expr in queries(dashboard):  # every query keeps to the release(s) chosen
        assert re.search(r'app_kubernetes_io_instance=~"\$release"', expr), expr


def test_the_sidecar_labels_and_namespace_are_the_users() -> None:
    cm = render("dashboard.namespace=monitoring", "dashboard.labels.grafana_dashboard=null",
                "dashboard.labels.team=gpu", "dashboard.annotations.grafana_folder=GPU")  # fmt: skip
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["team"] == "gpu" and "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
