"""Cloud maintenance end to end on the real control plane and FerretDB: Azure announces a reboot of a
node running pods. The node's agent (`faultline agent --scheduled-events`, reading the fake instance
metadata service) relays it; `faultline maintenance` raises CSP-MAINTENANCE-REBOOT; the quarantine
worker cordons and taints the node and the drainer evicts its pods, well before the event's window;
once drained, the monitor asks for the event to start now and the agent posts the StartRequests; Azure
reboots the VM; the node comes back Ready with a new boot id, the fault resolves and the quarantine
releases the node. Remediation runs too and asks for no repair: the provider does the maintenance."""

from __future__ import annotations

import datetime as dt
import email.utils
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.models import FaultState, fault_id
from tests.fakes import cloud as fakes
from tests.integration.test_agent import poll, start_agent, stop_agent
from tests.integration.test_drainer import pod, pods_on
from tests.integration.test_maintenance import AZ_VMSS, LABEL, azure_event
from tests.integration.test_workers_e2e import system_namespace
from workers import breaker, drainer, quarantine, remediation

pytestmark = pytest.mark.integration
VM = "aks-gpu-12345678-vmss_3"
CODE = "CSP-MAINTENANCE-REBOOT"


def test_an_announced_reboot_drains_the_node_before_its_window_and_returns_it_after(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, mongo_db: Any, namespace: str, tmp_path: Path
) -> None:
    core = kube.core(api)
    system_namespace(api)
    tag = f"{os.getpid()}-{dt.datetime.now(dt.UTC):%H%M%S%f}"
    node = f"aks-gpu-maint-{tag}"
    cluster.fakelet.add(node, provider_id=f"azure://{AZ_VMSS}")
    kube.nodes.patch(api, node, {"metadata": {"labels": {LABEL: tag}}})
    core.patch_namespace(namespace, {"metadata": {"labels": {drainer.MODE_LABEL: "Immediate"}}})
    for i in range(2):
        core.create_namespaced_pod(namespace, pod(f"train-{i}", node, labels={"app": "train"}))
    poll("pods running", lambda: all(p.status.phase == "Running"
                                     for p in core.list_namespaced_pod(namespace).items), 20)  # fmt: skip
    boot_before = cluster.fakelet.nodes[node].boot_id

    st = store.Store(mongo_db)
    st.ensure_indexes()
    fast = {"lease": dt.timedelta(seconds=5), "threads": 2}
    workers: list[Any] = [
        quarantine.QuarantineWorker(st, api, quarantine.Settings(
            hold_down=dt.timedelta(seconds=1), resync_interval=0.3,
            breaker=breaker.BreakerConfig(max_share=None, max_count=None), **fast), "q"),
        drainer.Drainer(st, api, drainer.Settings(poll=0.3, resync_interval=0.3, backoff_max=1.0, **fast), "d"),
        remediation.Remediation(st, api, remediation.Settings(resync_interval=0.3, **fast), "r"),
    ]  # fmt: skip
    with fakes.FakeCloud() as fake:
        fake.azure_vm = VM
        fake.azure_events = [azure_event("ev-reboot", VM, minutes=15)]
        window = email.utils.parsedate_to_datetime(fake.azure_events[0]["NotBefore"])

        def azure_starts(event_id: str) -> None:  # Azure reboots the VM; the event leaves the document
            fake.azure_events = []
            cluster.fakelet.reboot(node, down_seconds=2.0)

        fake.on_start = azure_starts
        agent = start_agent(cluster, mongo, node, mongo_db.name, tmp_path, "--scheduled-events", "--imds-endpoint",
                            fake.url, "--scheduled-events-interval", "1s")  # fmt: skip
        argv = [sys.executable, "-m", "faultline", "maintenance", "--mongodb-uri", mongo.uri, "--database",
                mongo_db.name, "--kubeconfig", str(cluster.kubeconfig), "--clouds", "azure", "--interval", "1s",
                "--node-selector", f"{LABEL}={tag}", "--settle", "5m"]  # fmt: skip
        monitor = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            for w in workers:
                w.start()
            fault = fault_id(node, "NODE", "", CODE)
            poll("the maintenance fault", lambda: (st.faults.find_one({"_id": fault}) or {}).get("state") == "open",
                 30)  # fmt: skip
            poll("cordoned", lambda: bool(core.read_node(node).spec.unschedulable), 20)
            taints = {(t.key, t.value) for t in core.read_node(node).spec.taints or []}
            assert ("faultline.io/fault", CODE) in taints
            poll("drained", lambda: pods_on(api, namespace, node) == [], 30)
            poll("the early start posted", lambda: fake.azure_started == ["ev-reboot"], 30)
            drain = st.drain(node)
            assert drain is not None and drain.result == store.DRAINED and drain.drained_at is not None
            poll("the start recorded", lambda: st.scheduled_events([node])[node].started == ["ev-reboot"], 10)
            relayed = st.scheduled_events([node])[node]
            assert relayed.started_at is not None
            assert drain.drained_at <= relayed.started_at < window  # drained, then started, before its window
            poll("a new boot id", lambda: cluster.fakelet.nodes[node].boot_id != boot_before, 10)
            poll("resolved", lambda: st.faults.find_one({"_id": fault})["state"] == FaultState.RESOLVED, 30)
            poll("uncordoned", lambda: not core.read_node(node).spec.unschedulable, 30)
            assert not any(t.key.startswith("faultline.io/") for t in core.read_node(node).spec.taints or [])
            assert kube.resources.list_requests(api, label_selector=f"faultline.io/node={node}") == []
            poll("remediation's verdict", lambda: (mongo_db["repairs"].find_one({"node": node}) or {})
                 .get("result") is not None, 20)  # fmt: skip
            assert (
                mongo_db["repairs"].find_one({"node": node})["result"]
                == "left to the cloud provider's maintenance"
            )
            events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
            reasons = [e.reason for e in events]
            for once in ("FaultlineMaintenanceAnnounced", "FaultlineMaintenanceStartRequested",
                         "FaultlineMaintenanceOver", "FaultlineQuarantined"):  # fmt: skip
                assert reasons.count(once) == 1, (once, reasons)
            assert monitor.poll() is None  # still running
        finally:
            for w in workers:
                w.halt()
            monitor.terminate()
            monitor.wait(30)
            assert monitor.stderr is not None
            assert monitor.stderr.readline().startswith("maintenance: started")
            monitor.stderr.close()
            stop_agent(agent)
            cluster.fakelet.remove(node)
