"""gRPC HealthIngest against a running agent: a Unix socket only its owner may use, events that become
faults and resolve, malformed batches refused with INVALID_ARGUMENT naming the field and nothing
stored, and the same service over TCP with mutual TLS."""

from __future__ import annotations

import datetime as dt
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from devtools import procs
from devtools.certs import LocalPKI
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline.api import health_pb2, health_pb2_grpc
from faultline.models import fault_id
from tests.integration.test_agent import poll, running_agent

pytestmark = pytest.mark.integration


def event(node: str, **overrides: Any) -> health_pb2.HealthEvent:
    fields: dict[str, Any] = {
        "node": node, "agent": "burn-in", "check": "memtest", "component": "GPU",
        "code": "GPU-MEMTEST-FAILED", "fatal": True, "action": "COMPONENT_RESET", "message": "12 bad pages",
        "entities": [health_pb2.Entity(type="GPU", id="0000:9a:00")],
    }  # fmt: skip
    fields.update(overrides)
    e = health_pb2.HealthEvent(**fields)
    e.generated_at.FromDatetime(dt.datetime.now(dt.UTC))
    return e


@pytest.mark.redteam
def test_ingest_over_a_unix_socket_and_mutual_tls(
    cluster: LocalCluster, mongo: LocalMongo, tmp_path: Path
) -> None:
    node = cluster.node_names[2]
    pki = LocalPKI(tmp_path / "pki")
    sock = tmp_path / "run" / "ingest.sock"
    port = procs.free_port()
    extra = ("--ingest-socket", str(sock), "--ingest-tcp", f"127.0.0.1:{port}",
             "--ingest-tls-cert", str(pki.apiserver.cert), "--ingest-tls-key", str(pki.apiserver.key),
             "--ingest-tls-client-ca", str(pki.ca))  # fmt: skip
    fid = fault_id(node, "GPU", "0000:9a:00", "GPU-MEMTEST-FAILED")
    with running_agent(cluster, mongo, node, tmp_path, *extra) as faults:
        procs.wait_for("the ingest socket", sock.exists, 10)
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        events = faults.database["health_events"]
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = health_pb2_grpc.HealthIngestStub(channel)

            bad = [event(node), event(node, entities=[health_pb2.Entity(type="GPU", id="")])]
            with pytest.raises(grpc.RpcError) as info:
                stub.Report(health_pb2.HealthEventBatch(events=bad), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details().startswith("events[1].entities[0].id: ")
            with pytest.raises(grpc.RpcError) as info:
                stub.Report(health_pb2.HealthEventBatch(events=[event("another-node")]), timeout=10)
            assert (info.value.code(), info.value.details().split(":")[0]) == (
                grpc.StatusCode.INVALID_ARGUMENT, "events[0].node"
            )  # fmt: skip

            reply = stub.Report(health_pb2.HealthEventBatch(events=[event(node)]), timeout=10)
            assert reply.accepted == 1
            poll("the reported fault", lambda: faults.find_one({"_id": fid}), 10)
            doc = faults.find_one({"_id": fid})
            assert (doc["fatal"], doc["action"], doc["component"], doc["count"]) == (
                True, "COMPONENT_RESET", "GPU", 1
            )  # fmt: skip
            # the refused batches left nothing behind (the GPU monitor's start is the agent's own event)
            assert events.count_documents({"component": {"$ne": "MONITOR"}}) == 1

            healthy = event(node, healthy=True, fatal=False, action="NONE", message="")
            stub.Report(health_pb2.HealthEventBatch(events=[healthy]), timeout=10)
            poll("resolved", lambda: faults.find_one({"_id": fid})["state"] == "resolved", 10)

        credentials = grpc.ssl_channel_credentials(
            root_certificates=pki.ca.read_bytes(),
            private_key=pki.admin.key.read_bytes(),
            certificate_chain=pki.admin.cert.read_bytes(),
        )
        with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            stub = health_pb2_grpc.HealthIngestStub(channel)
            nic = event(node, component="NIC", code="NIC-PEER-UNREACHABLE", fatal=False, action="NONE",
                        entities=[health_pb2.Entity(type="NIC", id="mlx5_3")])  # fmt: skip
            assert stub.Report(health_pb2.HealthEventBatch(events=[nic]), timeout=10).accepted == 1
        poll("the TLS-reported fault", lambda: faults.find_one({"code": "NIC-PEER-UNREACHABLE"}), 10)

        anonymous = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", anonymous) as channel:
            with pytest.raises(grpc.RpcError) as info:
                health_pb2_grpc.HealthIngestStub(channel).Report(
                    health_pb2.HealthEventBatch(events=[event(node)]), timeout=5
                )
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # no client certificate: no handshake


@pytest.mark.redteam
def test_the_agent_refuses_tcp_ingest_without_a_client_ca(tmp_path: Path) -> None:
    """TLS alone would let whoever reaches the port report faults for the node: the agent does not start."""
    pki = LocalPKI(tmp_path / "pki")
    done = subprocess.run(
        [sys.executable, "-m", "faultline", "agent", "--node", "n", "--mongodb-uri", "mongodb://127.0.0.1:1",
         "--state-dir", str(tmp_path / "state"), "--ingest-tcp", f"127.0.0.1:{procs.free_port()}",
         "--ingest-tls-cert", str(pki.apiserver.cert), "--ingest-tls-key", str(pki.apiserver.key)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "ingest_tcp needs ingest_tls_cert, ingest_tls_key and ingest_tls_client_ca" in done.stderr
    assert "Traceback" not in done.stderr
