"""Repairs recognised as on real hardware (issue 14 item 6), on the real control plane and FerretDB with
the node agent on the simulated GPU backend: no log line says a reset worked. The janitor records that
the reset Job succeeded; the agent re-reads the round's GPUs and reports those that read healthy.

- a reset after which the GPU reads healthy: validated, the node released;
- a reset after which the GPU still reads unhealthy (a row remapping still pending): not validated, the
  next round escalates to a reboot;
- a user-space "was successfully reset" line in the node's syslog: clears nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import fakelet
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.models import fault_id
from tests.integration.test_agent import poll, running_agent, sim, start_agent, stop_agent
from tests.integration.test_workers_e2e import forget_repairs, system_namespace
from workers import breaker, drainer, janitor, quarantine, remediation

pytestmark = pytest.mark.integration
GPU = ("2", "0000:3a:00")  # the simulator's GPU 2
REPAIRED = re.compile("reads healthy after")


@contextlib.contextmanager
def pipeline(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, mongo_db: Any, node: str, tmp_path: Path,
    validate: float, **janitor_settings: Any,
) -> Iterator[store.Store]:  # fmt: skip
    """Every worker (one replica each) and the node's agent, which reads verified repairs every 0.3 s (every
    second while none is open);
    all stopped, and the node uncordoned, however the test ends."""
    system_namespace(api)
    st = store.Store(mongo_db)
    st.ensure_indexes()
    fast = {"lease": dt.timedelta(seconds=5), "threads": 2}
    workers: list[Any] = [
        quarantine.QuarantineWorker(st, api, quarantine.Settings(
            hold_down=dt.timedelta(seconds=1), resync_interval=0.3,
            breaker=breaker.BreakerConfig(max_share=None, max_count=None), **fast), "q"),
        drainer.Drainer(st, api, drainer.Settings(poll=0.3, resync_interval=0.3, backoff_max=1.0, **fast), "d"),
        remediation.Remediation(st, api, remediation.Settings(resync_interval=0.3, **fast), "r"),
        janitor.Janitor(st, api, janitor.Settings(poll=0.3, validate_timeout=dt.timedelta(seconds=validate),
                                                  **janitor_settings, **fast), "j"),
    ]  # fmt: skip
    agent = start_agent(cluster, mongo, node, mongo_db.name, tmp_path, "--repair-poll-interval", "0.3",
                        "--repair-idle-poll-interval", "1")  # fmt: skip
    try:
        for w in workers:
            w.start()
        yield st
    finally:
        for w in workers:
            w.halt()
        stop_agent(agent)
        kube.core(api).patch_node(node, {"spec": {"unschedulable": None}, "metadata": {"labels": {
            "nvidia.com/gpu.deploy.device-plugin": None, "nvidia.com/gpu.deploy.dcgm": None,
            "faultline.io/gpu-clients": None}}})  # fmt: skip
        forget_repairs(api, node)  # the node is shared with other tests of the session


def _reset_jobs(api: Any, node: str, since: dt.datetime) -> list[dict[str, Any]]:
    jobs = kube.jobs.list_all(api, "faultline-system", label_selector=f"faultline.io/node={node}")
    return [
        j for j in jobs
        if j["metadata"]["labels"].get("faultline.io/repair") == "gpu-reset"
        and j["metadata"]["creationTimestamp"] >= f"{since:%Y-%m-%dT%H:%M:%SZ}"
    ]  # fmt: skip


def _messages(mongo_db: Any, node: str) -> list[str]:
    return [str(e["message"]) for e in mongo_db["health_events"].find({"node": node})]


def test_a_reset_the_gpu_confirms_releases_the_node(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, mongo_db: Any, tmp_path: Path
) -> None:
    node = cluster.node_names[2]
    began = dt.datetime.now(dt.UTC).replace(microsecond=0)
    xid = fault_id(node, "GPU", GPU[1], "XID-95")
    # the GPU Operator's operands on the node: its device plugin on, DCGM switched off by its admin
    plugin, dcgm = "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.dcgm"
    kube.nodes.patch(api, node, {"metadata": {"labels": {plugin: "true", dcgm: "false"}}})

    def labels() -> dict[str, str]:
        return dict(kube.nodes.read(api, node)["metadata"].get("labels") or {})

    with pipeline(cluster, mongo, api, mongo_db, node, tmp_path, validate=30) as st:
        sim(tmp_path, node, "--gpu", GPU[0], "--field", "ecc_dbe_volatile=1")
        sim(tmp_path, node, "--gpu", GPU[0], "--xid", "95")  # uncontained ECC error: a GPU reset repairs it
        poll("cordoned", lambda: bool(kube.core(api).read_node(node).spec.unschedulable), 20)
        poll("the reset Job", lambda: _reset_jobs(api, node, began), 30)
        # its GPU clients paused for the reset: the device plugin's and faultline's agent's pods leave
        assert (labels()[plugin], labels()[dcgm], labels()["faultline.io/gpu-clients"]) == (
            "paused-for-gpu-reset",
            "false",
            "paused",
        )
        sim(tmp_path, node, "--gpu", GPU[0], "--reset")  # what the Job's nvidia-smi --gpu-reset does
        poll("XID 95 resolved", lambda: (mongo_db["faults"].find_one({"_id": xid}) or {}).get("state")
             == "resolved", 30)  # fmt: skip
        poll("released", lambda: not kube.core(api).read_node(node).spec.unschedulable, 30)
        assert (labels()[plugin], labels()[dcgm]) == (
            "true",
            "false",
        ) and "faultline.io/gpu-clients" not in labels()
        (repair,) = st.repairs_of(node)
        assert [(r.step, r.outcome) for r in repair.rounds] == [("GPU_RESET", "Succeeded")]
        assert repair.rounds[0].verified_at is not None
        assert "exited 0" in (repair.rounds[0].evidence or "")
        messages = _messages(mongo_db, node)
        assert f"GPU {GPU[1]} reads healthy after a GPU reset (GPU backend)" in messages
        assert not any("successfully reset" in m for m in messages)  # no log line involved
        assert all(d["state"] == "resolved" for d in mongo_db["faults"].find({"node": node}))


def test_a_reset_after_which_the_gpu_reads_unhealthy_escalates(
    cluster: LocalCluster, mongo: LocalMongo, api: Any, mongo_db: Any, tmp_path: Path
) -> None:
    node = cluster.node_names[1]
    xid = fault_id(node, "GPU", GPU[1], "XID-95")
    no_reboot = {fakelet.SIM_ACTION: "none"}  # the escalation's reboot Job runs; the node does not reboot
    with pipeline(cluster, mongo, api, mongo_db, node, tmp_path, validate=3,
                  reboot_timeout=dt.timedelta(seconds=2), job_annotations=no_reboot) as st:  # fmt: skip
        sim(
            tmp_path, node, "--gpu", GPU[0], "--field", "remapped_rows_pending=1"
        )  # the reset does not apply it
        sim(tmp_path, node, "--gpu", GPU[0], "--xid", "95")

        def escalated() -> bool:
            repairs = st.repairs_of(node)
            return bool(repairs) and len(repairs[0].rounds) >= 2

        poll("the next round", escalated, 60)
        first, second = st.repairs_of(node)[0].rounds[:2]
        assert (first.step, first.outcome) == ("GPU_RESET", "NotCleared")
        assert first.verified_at is not None  # the Job did succeed: the GPU's read is what failed
        assert second.step == "REBOOT"
        assert mongo_db["faults"].find_one({"_id": xid})["state"] == "open"
        assert not any(REPAIRED.search(m) for m in _messages(mongo_db, node))


def test_a_user_space_reset_line_clears_nothing(
    cluster: LocalCluster, mongo: LocalMongo, tmp_path: Path
) -> None:
    node = cluster.node_names[0]
    syslog = tmp_path / "syslog"
    kernel = f"Dec  1 10:00:01 {node} kernel: NVRM: Xid (PCI:0000:3b:00): 95, pid=1, name=x, Uncontained\n"
    syslog.write_text(kernel)
    # the file's `kernel` tags believed (--syslog-trusted): what else a line says still makes it user space's
    trusted = ("--syslog-file", str(syslog), "--syslog-trusted")
    with running_agent(cluster, mongo, node, tmp_path, *trusted) as faults:
        spoofed = fault_id(node, "GPU", "0000:3b:00", "XID-95")
        poll("the kernel's XID", lambda: faults.find_one({"_id": spoofed}), 20)
        with syslog.open("a") as fh:
            fh.write(
                f"Dec  1 10:00:02 {node} nvidia-reset[77]: GPU 00000000:3B:00.0 was successfully reset.\n"
            )
            fh.write(f"Dec  1 10:00:02 {node} root: GPU 00000000:3B:00.0 was successfully reset.\n")
            # a later kernel line: once it is a fault, the lines before it were read
            fh.write(f"Dec  1 10:00:03 {node} kernel: NVRM: Xid (PCI:0000:5d:00): 95, pid=1, name=x, U\n")
        poll(
            "the later XID",
            lambda: faults.find_one({"_id": fault_id(node, "GPU", "0000:5d:00", "XID-95")}),
            20,
        )
        assert faults.find_one({"_id": spoofed})["state"] == "open"
