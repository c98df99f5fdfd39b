"""The metrics page lists every metric a component exports (read from the components' registries), and
the catalogue reads PromQL the way the alert and dashboard tests need."""

from __future__ import annotations

import re

from devtools import metric_catalogue, tools

PAGE = (tools.REPO / "docs" / "operations" / "metrics.md").read_text()


def documented(name: str) -> bool:
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    forms = {name, base}
    for worker in metric_catalogue.WORKERS:
        forms |= {n.replace(f"faultline_{worker}_", "faultline_<worker>_") for n in (name, base)}
    return any(f"`{form}`" in PAGE for form in forms)


def test_every_exported_metric_is_on_the_metrics_page() -> None:
    catalogue = metric_catalogue.catalogue()
    assert {"agent", "quarantine", "janitor", "analyzer", "webhook"} <= set(catalogue)
    missing = sorted({n for names in catalogue.values() for n in names if not documented(n)})
    assert missing == [], f"docs/operations/metrics.md does not list {missing}"


def test_every_component_says_its_build() -> None:
    for component, names in metric_catalogue.catalogue().items():
        assert "faultline_build_info" in names, component


def test_state_metrics_are_where_their_worker_is() -> None:
    catalogue = metric_catalogue.catalogue()
    assert {
        "faultline_breaker_open",
        "faultline_nodes_held",
        "faultline_node_hold_seconds_bucket",
    } <= catalogue["quarantine"]
    assert {"faultline_repairs_in_flight", "faultline_repair_rounds_total"} <= catalogue["janitor"]
    assert "faultline_breaker_open" not in catalogue["drain"]
    for worker in metric_catalogue.WORKERS:
        assert {f"faultline_{worker}_parked_items", "faultline_store_reachable"} <= catalogue[worker]


def test_promql_reading() -> None:
    expr = (
        'sum by (stage) (label_replace({__name__=~"faultline_.+_parked_items", a=~"$r"}, "stage", "$1", '
        '"__name__", "x")) > 0 or histogram_quantile(0.9, sum by (le) (rate(faultline_node_hold_seconds_bucket'
        '{a="b"}[5m]))) or (up{c="agent"} == 0)'
    )
    assert metric_catalogue.metric_names(expr) == {"faultline_node_hold_seconds_bucket"}
    assert metric_catalogue.name_regexes(expr) == ["faultline_.+_parked_items"]
    assert metric_catalogue.unexported(expr, {"faultline_drain_parked_items"}) == [
        "faultline_node_hold_seconds_bucket"
    ]


def test_a_new_registry_says_its_build_even_where_an_old_one_was() -> None:
    """A registry made after another was collected may have its address (its id()): it gets the metric
    all the same (the catalogue's registries of one test are collected before the next test's)."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from faultline import metrics  # noqa: PLC0415

    for _ in range(20):
        registry = CollectorRegistry()
        metrics.build_info(registry)
        metrics.build_info(registry)  # once only: a second would be refused as a duplicate
        assert "faultline_build_info" in metric_catalogue.series_names(registry)
        del registry
