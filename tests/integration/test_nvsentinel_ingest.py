"""NVSentinel's monitors reporting to a running agent: a client generated from NVSentinel's proto
(faultline/api/nvsentinel.proto keeps its wire contract) calls `HealthEventOccurredV1` on the agent's
socket; a bad batch is refused whole with INVALID_ARGUMENT naming the field and leaves nothing; an
accepted one is in the agent's spool when the call returns and becomes faultline faults in FerretDB
through the agent's flow; NVSentinel's check-level "healthy" resolves them. And the chart's
`agent.nvsentinelSocket`."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from pathlib import Path
from typing import Any

import grpc
import pytest

from devtools import procs, tools
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline.api import nvsentinel_pb2 as pb
from faultline.api import nvsentinel_pb2_grpc as pb_grpc
from faultline.models import fault_id
from tests.integration.test_agent import poll, running_agent
from tests.integration.test_chart import render, settings_files, workloads

pytestmark = pytest.mark.integration
UUID = "GPU-5c2b1a7e-0d1f-4c3e-9a77-1b2c3d4e5f60"


def xid(node: str, **overrides: Any) -> pb.HealthEvent:
    """An XID 79 as NVSentinel's syslog monitor sends it."""
    fields: dict[str, Any] = {
        "version": 1, "agent": "syslog-health-monitor", "componentClass": "GPU", "checkName": "SysLogsXIDError",
        "isFatal": True, "message": "GPU has fallen off the bus", "recommendedAction": pb.RESTART_BM,
        "errorCode": ["79"], "nodeName": node,
        "entitiesImpacted": [pb.Entity(entityType="PCI", entityValue="0000:9a:00"),
                             pb.Entity(entityType="GPU", entityValue=UUID)],
        "metadata": {"JOURNAL_MESSAGE": "NVRM: Xid (PCI:0000:9a:00): 79, pid=0"},
    }  # fmt: skip
    fields.update(overrides)
    e = pb.HealthEvent(**fields)
    e.generatedTimestamp.FromDatetime(dt.datetime.now(dt.UTC))
    return e


def dcgm(node: str, **overrides: Any) -> pb.HealthEvent:
    """A DCGM memory watch failure as NVSentinel's GPU monitor sends it (index, PCI address, UUID)."""
    fields: dict[str, Any] = {
        "agent": "gpu-health-monitor", "checkName": "GpuMemWatch", "errorCode": ["DCGM_FR_VOLATILE_DBE_DETECTED"],
        "recommendedAction": pb.COMPONENT_RESET, "processingStrategy": pb.EXECUTE_REMEDIATION,
        "message": "Volatile DBEs detected", "metadata": {"chassis_serial": "1652922000123"},
        "entitiesImpacted": [pb.Entity(entityType="GPU", entityValue="1"),
                             pb.Entity(entityType="PCI", entityValue="00000000:9B:00.0"),
                             pb.Entity(entityType="GPU_UUID", entityValue=UUID)],
    }  # fmt: skip
    fields.update(overrides)
    return xid(node, **fields)


def spooled(state: Path) -> list[dict[str, Any]]:
    """What the agent has on disk in its ingest spool."""
    return [json.loads(line) for path in sorted((state / "ingest").glob("ingest-*.jsonl"))
            for line in path.read_text().splitlines()]  # fmt: skip


def test_nvsentinel_monitors_report_to_the_agent(
    cluster: LocalCluster, mongo: LocalMongo, tmp_path: Path
) -> None:
    node = cluster.node_names[1]
    sock = tmp_path / "nvs" / "nvsentinel.sock"
    state = tmp_path / "state"
    xid_fault = fault_id(node, "GPU", "0000:9a:00", "XID-79")
    dcgm_fault = fault_id(node, "GPU", "0000:9b:00", "DCGM_FR_VOLATILE_DBE_DETECTED")
    store_only = fault_id(node, "NODE", "", "CSP-MAINTENANCE")
    extra = ("--nvsentinel-socket", str(sock), "--state-dir", str(state))
    with running_agent(cluster, mongo, node, tmp_path, *extra) as faults:
        procs.wait_for("the NVSentinel socket", sock.exists, 10)
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        events = faults.database["health_events"]
        with grpc.insecure_channel(f"unix://{sock}") as channel:  # as NVSentinel's monitors dial it
            stub = pb_grpc.PlatformConnectorStub(channel)

            for batch, field in (
                ([xid(node), dcgm(node, recommendedAction=7)], "events[1].recommendedAction"),
                ([xid(node), xid("another-node")], "events[1].nodeName"),
                ([dcgm(node, entitiesImpacted=[pb.Entity(entityType="PCI", entityValue="")])],
                 "events[0].entitiesImpacted[0].entityValue"),
            ):  # fmt: skip
                with pytest.raises(grpc.RpcError) as info:
                    stub.HealthEventOccurredV1(pb.HealthEvents(version=1, events=batch), timeout=10)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert info.value.details().startswith(f"{field}: "), info.value.details()
            assert spooled(state) == []  # the refused batches left nothing, not even their valid events

            cloud = xid(node, agent="csp-health-monitor", componentClass="NODE", checkName="CspMaintenance",
                        errorCode=["csp-maintenance"], entitiesImpacted=[], processingStrategy=pb.STORE_ONLY,
                        recommendedAction=pb.RESTART_VM)  # fmt: skip
            stub.HealthEventOccurredV1(
                pb.HealthEvents(version=1, events=[xid(node), dcgm(node), cloud]), timeout=10
            )
            kept = spooled(state)  # read as soon as the call returned: the events are already on disk
            assert [(r["code"], r["entities"], r["fatal"], r["action"]) for r in kept] == [
                ("XID-79", [{"type": "GPU", "id": "0000:9a:00"}], True, "RESTART_BM"),
                ("DCGM_FR_VOLATILE_DBE_DETECTED", [{"type": "GPU", "id": "0000:9b:00"}], True, "COMPONENT_RESET"),
                ("CSP-MAINTENANCE", [], False, "NONE"),
            ]  # fmt: skip

            for fid in (xid_fault, dcgm_fault, store_only):
                poll(f"the fault {fid}", lambda fid=fid: faults.find_one({"_id": fid}), 20)
            got = {d["code"]: (d["component"], d["fatal"], d["action"], d["state"], d["count"])
                   for d in faults.find({"_id": {"$in": [xid_fault, dcgm_fault, store_only]}})}  # fmt: skip
            assert got == {
                "XID-79": ("GPU", True, "RESTART_BM", "open", 1),
                "DCGM_FR_VOLATILE_DBE_DETECTED": ("GPU", True, "COMPONENT_RESET", "open", 1),
                "CSP-MAINTENANCE": ("NODE", False, "NONE", "open", 1),
            }
            assert (
                events.count_documents({"component": {"$ne": "MONITOR"}}) == 3
            )  # one per accepted code (and the agent's own start)

            # the GPU monitor's "watch reported no errors": no code, the same entities
            passing = dcgm(node, isHealthy=True, isFatal=False, errorCode=[], recommendedAction=pb.NONE,
                           message="GPU Mem watch reported no errors")  # fmt: skip
            stub.HealthEventOccurredV1(pb.HealthEvents(version=1, events=[passing]), timeout=10)
            poll(
                "the DCGM fault resolved",
                lambda: faults.find_one({"_id": dcgm_fault})["state"] == "resolved",
                20,
            )
            assert faults.find_one({"_id": xid_fault})["state"] == "open"  # another check's fault stays


def test_the_chart_serves_nvsentinels_socket_when_asked() -> None:
    tools.ensure("helm")
    default = render()
    assert "nvsentinel_socket" not in settings_files(default)["agent"]
    agent = workloads(default)["fl-agent"]
    assert "nvsentinel" not in {v["name"] for v in agent["volumes"]}

    docs = render("agent.nvsentinelSocket=/var/run/nvsentinel/nvsentinel.sock")
    assert settings_files(docs)["agent"]["nvsentinel_socket"] == "/var/run/nvsentinel/nvsentinel.sock"
    agent = workloads(docs)["fl-agent"]
    mounts = {m["mountPath"]: m for m in agent["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in agent["volumes"]}
    assert not mounts["/var/run/nvsentinel"].get("readOnly")
    assert volumes[mounts["/var/run/nvsentinel"]["name"]]["hostPath"] == {
        "path": "/var/run/nvsentinel", "type": "DirectoryOrCreate"
    }  # fmt: skip

    beside = workloads(render("agent.nvsentinelSocket=/run/faultline/nvsentinel.sock"))["fl-agent"]
    paths = [m["mountPath"] for m in beside["containers"][0]["volumeMounts"]]
    assert paths.count("/run/faultline") == 1  # the ingest socket's directory brings it

    with pytest.raises(ValueError, match=r"at '/agent/nvsentinelSocket'"):
        render("agent.nvsentinelSocket=nvsentinel.sock")
