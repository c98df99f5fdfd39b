"""The janitor when the API server goes away mid-repair (a restart: connections refused), on the real
control plane and FerretDB, the janitor's API traffic through a proxy that refuses it for a while: the
wait for the rebooted node reads "not back yet" until the API server answers again, and the round ends
Succeeded, one round. Found by the chaos suite's apiserver-restart: a read that failed during the wait
made the round Failed, and remediation asked for a second repair of a node the first one had fixed."""

from __future__ import annotations

import datetime as dt
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from devtools import fakelet, procs
from devtools.cluster import LocalCluster
from devtools.netproxy import NetProxy
from faultline import kube, store
from faultline.models import FaultState
from tests.integration.test_janitor import _fault, _outcome, _repair, setup
from tests.integration.test_workers_e2e import forget_repairs
from workers import janitor, remedies

pytestmark = pytest.mark.integration
__all__ = ["setup"]  # a fixture


def _proxied_kubeconfig(cluster: LocalCluster, port: int, tmp_path: Path) -> Path:
    """The admin kubeconfig, its server at the proxy (the API server's certificate names 127.0.0.1)."""
    url = urllib.parse.urlsplit(cluster.server)
    text = cluster.kubeconfig.read_text().replace(cluster.server, f"{url.scheme}://127.0.0.1:{port}")
    path = tmp_path / "proxied.kubeconfig"
    path.write_text(text)
    return path


def test_an_api_server_away_during_the_wait_for_a_reboot_is_not_a_failed_repair(
    cluster: LocalCluster, api: Any, mongo_db: Any, setup: None, tmp_path: Path
) -> None:
    node = cluster.node_names[0]
    st = store.Store(mongo_db)
    st.ensure_indexes()
    fault = _fault(node)
    st.write_fault(fault, 1)
    forget_repairs(api, node)  # no Job of an earlier test for the node
    before = cluster.fakelet.nodes[node].boot_id
    with NetProxy(int(urllib.parse.urlsplit(cluster.server).port or 443)) as proxy:
        proxied = kube.api_client(_proxied_kubeconfig(cluster, proxy.port, tmp_path))
        settings = janitor.Settings(
            lease=dt.timedelta(seconds=5), threads=1, poll=dt.timedelta(seconds=0.2),
            reboot_timeout=dt.timedelta(seconds=60), validate_timeout=dt.timedelta(seconds=30),
            job_annotations={fakelet.SIM_ACTION: "none"},  # the node reboots when the test says
        )  # fmt: skip
        worker = janitor.Janitor(st, proxied, settings, "j-outage")
        key = _repair(st, node, remedies.REBOOT, fault, "outage-reboot-1")
        worker.start()
        try:
            # this round's own Job, and its boot id recorded (the cluster is shared: another test's Job
            # for the node must not start the outage before the janitor has read the boot before it)
            procs.wait_for("the reboot Job", lambda: any(
                j.metadata.name == "outage-reboot-1" for j in kube.batch(api).list_namespaced_job(
                    "faultline-system", label_selector=f"faultline.io/node={node}").items), 20)  # fmt: skip
            procs.wait_for("the boot before recorded",
                           lambda: st.repairs.find_one({"_id": key})["rounds"][0].get("boot_before"), 20)  # fmt: skip
            proxy.reject()  # the API server restarting, as the janitor sees it
            cluster.fakelet.reboot(node, down_seconds=1.0)  # meanwhile the node reboots
            procs.wait_for("the janitor's reads refused", lambda: proxy.rejected >= 8, 20)
            proxy.heal()
            procs.wait_for("the new boot seen and the step verified",
                           lambda: st.repairs.find_one({"_id": key})["rounds"][0].get("verified_at"), 20)  # fmt: skip
            st.write_fault(fault.model_copy(update={"state": FaultState.RESOLVED,
                                                    "resolved_at": dt.datetime.now(dt.UTC)}), 2)  # fmt: skip
            procs.wait_for("an outcome", lambda: _outcome(st, key) is not None, 30)
        finally:
            worker.halt()
            proxied.close()
            forget_repairs(api, node)
    rounds = st.repairs.find_one({"_id": key})["rounds"]
    assert [r["outcome"] for r in rounds] == ["Succeeded"], rounds[0].get("message")
    assert cluster.fakelet.nodes[node].boot_id != before
