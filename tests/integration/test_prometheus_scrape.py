"""A real Prometheus (built by tools/build.sh) scrapes the quarantine worker and the janitor running against
the local cluster and FerretDB, with the chart's alert rules loaded: the fleet's state shows in its queries,
and when a fault storm trips the breaker, `FaultlineBreakerTripped` fires; after `faultline breaker reset` it
resolves."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import procs, tools
from faultline import metrics, store
from tests.integration import test_quarantine as tq
from tests.integration.conftest import STARTED
from tests.integration.test_quarantine import nodes  # noqa: F401 - the fixture: fresh GPU Nodes
from workers import breaker, janitor

pytestmark = pytest.mark.integration
RELEASE = "fl"


class Prometheus:
    def __init__(self, proc: procs.Proc, url: str) -> None:
        self.proc = proc
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def value(self, expr: str) -> float | None:
        """The instant value of a query with one result (None: no result)."""
        result = self.get("/api/v1/query", query=expr)["result"]
        return float(result[0]["value"][1]) if result else None

    def alert(self, name: str) -> str | None:
        """The state of alert `name` (pending, firing; None: not active)."""
        states = [
            a["state"] for a in self.get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name
        ]
        return states[0] if states else None


def chart_rules() -> dict[str, Any]:
    argv = [str(tools.binary("helm")), "template", RELEASE, str(tools.REPO / "charts" / "faultline"),
            "--set", "alerts.enabled=true", "--set", "podMonitor.enabled=true",
            "--show-only", "templates/prometheusrule.yaml"]  # fmt: skip
    rule = yaml.safe_load(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    return dict(rule["spec"])


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """start(targets) -> a Prometheus scraping `{component: port}` every second with the chart's rules,
    each target labelled as the chart's PodMonitor labels a pod."""
    tools.ensure("helm", "prometheus")
    started: list[procs.Proc] = []

    def start(targets: dict[str, int]) -> Prometheus:
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(chart_rules()))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{
                "job_name": "faultline",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{port}"], "labels": {
                        "app_kubernetes_io_instance": RELEASE, "app_kubernetes_io_component": component,
                        "pod": f"{RELEASE}-{component}-0",
                    }}
                    for component, port in targets.items()
                ],
            }],
        }  # fmt: skip
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = procs.free_port()
        proc = procs.Proc("prometheus", [
            str(tools.binary("prometheus")), f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
        ], tmp_path / "prometheus.log")  # fmt: skip
        started.append(proc)
        STARTED.append(proc.pid)
        prom = Prometheus(proc, f"http://127.0.0.1:{port}")

        def ready() -> bool:
            assert proc.alive(), proc.tail()
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        procs.wait_for("prometheus ready", ready, 30)
        return prom

    yield start
    for proc in started:
        proc.stop()


def test_prometheus_scrapes_the_workers_and_fires_the_breaker_alert(
    prometheus: Any,
    nodes: Any,  # noqa: F811 - the fixture imported above
    mongo: Any,
    mongo_db: Any,
    api: Any,
) -> None:
    storm = nodes(4)
    cfg = breaker.BreakerConfig(window=dt.timedelta(minutes=10), max_share=None, max_count=2)
    q = tq.worker(mongo_db, api, breaker=cfg, threads=1)
    st = store.Store(mongo_db)
    j = janitor.Janitor(st, api, janitor.Settings(), f"test-{uuid.uuid4().hex[:4]}")
    servers = [
        metrics.serve(0, host="127.0.0.1", registry=w.metrics.registry, health=w.alive) for w in (q, j)
    ]
    q.start()
    j.start()
    try:
        prom = prometheus(
            {"quarantine": servers[0].server_address[1], "janitor": servers[1].server_address[1]}
        )
        sel = f'app_kubernetes_io_instance="{RELEASE}"'
        procs.wait_for("both scraped", lambda: prom.value(f"sum(up{{{sel}}})") == 2, 30)
        procs.wait_for(
            "the state read", lambda: prom.value(f"max(faultline_gpu_nodes{{{sel}}})") is not None, 30
        )
        assert prom.value(f"max(faultline_breaker_open{{{sel}}})") == 0
        assert prom.value(f"count(faultline_build_info{{{sel}}})") == 2
        assert prom.value(f"max(faultline_store_reachable{{{sel}}})") == 1
        assert prom.value(f'sum(faultline_repairs_in_flight{{{sel}, step="REBOOT"}})') == 0
        assert prom.alert("FaultlineBreakerTripped") is None

        for name in storm:  # 4 nodes at once, the breaker's count is 2
            q.store.write_fault(tq.fault(name), 1)
        procs.wait_for(
            "the breaker alert fires", lambda: prom.alert("FaultlineBreakerTripped") == "firing", 30
        )
        assert prom.value(f"max(faultline_breaker_open{{{sel}}})") == 1
        assert prom.value(f"sum(faultline_breaker_trips_total{{{sel}}})") == 1
        procs.wait_for("two nodes held", lambda: prom.value(f"max(faultline_nodes_held{{{sel}}})") == 2, 30)
        assert prom.value(f'max(faultline_nodes_held_by_code{{{sel}, code="XID-79"}})') == 2
        procs.wait_for("two quarantines blocked", lambda: (prom.value(
            f'sum(faultline_quarantine_actions_total{{{sel}, result="blocked"}})') or 0) >= 2, 30)  # fmt: skip

        tq.reset_breaker(mongo, mongo_db, "storm understood")
        procs.wait_for("the alert resolves", lambda: prom.alert("FaultlineBreakerTripped") is None, 30)
        procs.wait_for("all four held", lambda: prom.value(f"max(faultline_nodes_held{{{sel}}})") == 4, 30)
    finally:
        q.halt()
        j.halt()
        for server in servers:
            server.close()
