"""Every metric each component exports, read from the components' own registries (not from the docs): what the
alerts and the dashboard may name (tests/integration/test_alerts.py, test_dashboard.py) and what the metrics
page lists.

    python -m devtools.metric_catalogue        # component<TAB>series name, one per line
"""

from __future__ import annotations

import re
import sys
from typing import Any

from prometheus_client import CollectorRegistry

from dataflows import analyzer_metrics as analyzer
from faultline import metrics
from workers import (
    attribution,
    common,
    export,
    fleet_state,
    maintenance,
    object_monitor,
    preflight_findings,
    webhook,
)

WORKERS = ("quarantine", "drain", "remediation", "janitor")
# the series Prometheus makes of each family type (prometheus_client drops `_total` from a counter's name)
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count", ""),
    "gauge": ("",),
    "info": ("_info",),
}


def registries() -> dict[str, CollectorRegistry]:
    """A fresh registry per component, as its process fills it."""
    out: dict[str, CollectorRegistry] = {"agent": metrics.REGISTRY}
    for worker in WORKERS:
        m = common.WorkerMetrics(worker)
        if worker in ("quarantine", "remediation"):
            attribution.Attribution(_NoVerifier(), m)  # type: ignore[arg-type]
        if worker == "quarantine":
            fleet_state.QuarantineState(None, m.registry)  # type: ignore[arg-type]
        if worker == "janitor":
            fleet_state.JanitorState(None, m.registry)  # type: ignore[arg-type]
        out[worker] = m.registry
    monitor = object_monitor.Metrics()
    preflight_findings.Metrics(monitor.registry)
    out["object-monitor"] = monitor.registry
    out["maintenance"] = maintenance.Metrics().registry
    out["analyzer"] = analyzer.Metrics().registry
    out["webhook"] = webhook.REGISTRY
    out["export"] = export.Metrics().registry
    for registry in out.values():
        metrics.build_info(registry)
    return out


def series_names(registry: CollectorRegistry) -> set[str]:
    """The names of the series a scrape of `registry` can hold."""
    out: set[str] = set()
    for family in registry.collect():
        out.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return out


def catalogue() -> dict[str, set[str]]:
    """Series names by component."""
    return {component: series_names(r) for component, r in registries().items()}


# PromQL's own words and functions, which are not metric names
PROMQL_WORDS = frozenset({
    "max", "min", "sum", "avg", "count", "topk", "bottomk", "by", "without", "on", "ignoring", "group_left",
    "group_right", "bool", "and", "or", "unless", "offset", "increase", "rate", "irate", "delta", "time",
    "vector", "scalar", "label_replace", "histogram_quantile", "clamp_min", "clamp_max", "changes",
    "avg_over_time", "max_over_time", "min_over_time", "absent", "up",
})  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (`up` aside: Prometheus makes it), by a reading good for
    the expressions faultline ships: label matchers, ranges, grouping lists and strings are not names."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^]]*\]|\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    return set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*", expr)) - PROMQL_WORDS


def name_regexes(expr: str) -> list[str]:
    """The `__name__=~"..."` selectors of an expression (each must match some exported name)."""
    return re.findall(r'__name__\s*=~\s*"([^"]*)"', expr)


def unexported(expr: str, exported: set[str]) -> list[str]:
    """What `expr` reads that no component exports: names, and name regexes that match none."""
    missing = sorted(metric_names(expr) - exported)
    missing += [
        f"__name__=~{r!r}" for r in name_regexes(expr) if not any(re.fullmatch(r, n) for n in exported)
    ]
    return missing


class _NoVerifier:
    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


def main() -> None:
    for component, names in catalogue().items():
        for name in sorted(names):
            sys.stdout.write(f"{component}\t{name}\n")


if __name__ == "__main__":
    main()
