"""The maintenance monitor's reads, without the control plane: the providers' calls against the local
fakes (EC2 in batches of 100, a terminated instance left out; a GCE zone; an OCI instance), its record
of a fault kept in the fault's metadata and read back unchanged, a Node's state, and the agent's relay of
Azure's events as the store keeps them."""

from __future__ import annotations

import datetime as dt
import http.server
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from faultline.errors import FaultlineError, TransientError
from faultline.models import PROVIDER_REPAIR
from sources import scheduled_events
from tests.fakes import cloud as fakes
from workers import cloud, maintenance
from workers import maintenance_plan as mp
from workers.cloud import aws, gcp, oci

KEYS = {"AWS_ACCESS_KEY_ID": fakes.AWS_KEY, "AWS_SECRET_ACCESS_KEY": fakes.AWS_SECRET}


def ec2(fake: fakes.FakeCloud) -> aws.AWS:
    return aws.AWS(aws.Settings(endpoint=f"{fake.url}/aws/ec2/", env=KEYS))


def test_ec2_events_of_many_instances_in_batches_of_100() -> None:
    instances = [cloud.instance(f"aws:///us-east-1a/i-{n:017x}") for n in range(1, 151)]
    with fakes.FakeCloud() as fake:
        fake.ec2_events[instances[120].id] = [{"instanceEventId": "instance-event-1", "code": "system-reboot",
                                               "description": "scheduled reboot",
                                               "notBefore": "2026-12-05T00:00:00.000Z"}]  # fmt: skip
        got = ec2(fake).instance_events(instances)
    assert len(fake.actions("aws")) == 2  # 100, then 50
    assert set(got) == {i.id for i in instances}
    assert got[instances[120].id] == [{"instanceEventId": "instance-event-1", "code": "system-reboot",
                                       "description": "scheduled reboot", "notBefore": "2026-12-05T00:00:00.000Z"}]  # fmt: skip
    assert got[instances[0].id] == []


def test_ec2_leaves_out_an_instance_it_no_longer_knows() -> None:
    known, gone = cloud.instance("aws:///us-east-1a/i-0aaa"), cloud.instance("aws:///us-east-1a/i-0bbb")
    with fakes.FakeCloud() as fake:
        fake.ec2_gone.add(gone.id)
        fake.ec2_events[known.id] = [{"code": "instance-stop", "notBefore": "2026-12-05T00:00:00.000Z"}]
        got = ec2(fake).instance_events([known, gone])
    assert got == {
        known.id: [{"code": "instance-stop", "notBefore": "2026-12-05T00:00:00.000Z"}],
        gone.id: [],
    }
    assert fake.actions("aws") == [("DescribeInstanceStatus", known.id)]  # the refused call is not counted


def test_ec2_refusing_for_another_reason_is_an_error() -> None:
    with fakes.FakeCloud() as fake:
        fake.fail["aws"] = [(403, "<Response><Errors><Error><Code>UnauthorizedOperation</Code></Error></Errors>"
                                  "</Response>")]  # fmt: skip
        with pytest.raises(cloud.CloudError, match="UnauthorizedOperation"):
            ec2(fake).instance_events([cloud.instance("aws:///us-east-1a/i-0aaa")])


def test_gce_zone_instances_and_oci_instance(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    upcoming = {"type": "SCHEDULED", "windowStartTime": "2026-12-05T10:00:00Z"}
    with fakes.FakeCloud(oci_public_key=key.public_key()) as fake:
        fake.gce_instances[("p", "us-central1-a")] = {"vm-1": {"upcomingMaintenance": upcoming}, "vm-2": {}}
        fake.oci_instances["ocid1.instance.oc1.iad.x"] = {"timeMaintenanceRebootDue": "2026-12-20T08:00:00Z"}
        google = gcp.GCP(gcp.Settings(endpoint=f"{fake.url}/compute/v1",
                                      env={"GCE_METADATA_HOST": fake.url.removeprefix("http://")}))  # fmt: skip
        listed = google.zone_instances("p", "us-central1-a")
        oracle = oci.OCI(oci.Settings(config_file=fakes.oci_config(tmp_path, key), endpoint=fake.url))
        got = oracle.instance(cloud.instance("oci://ocid1.instance.oc1.iad.x"))
        with pytest.raises(FaultlineError, match="404"):  # gone, or not allowed: OCI does not say which
            oracle.instance(cloud.instance("oci://ocid1.instance.oc1.iad.gone"))
    assert listed == {"vm-1": {"name": "vm-1", "upcomingMaintenance": upcoming}, "vm-2": {"name": "vm-2"}}
    assert got["timeMaintenanceRebootDue"] == "2026-12-20T08:00:00Z"


def test_a_faults_record_survives_its_metadata() -> None:
    t = dt.datetime(2026, 12, 5, 10, 0, tzinfo=dt.UTC)
    rec = mp.Raised("azure", ("ev-1", "ev-2"), t, t + dt.timedelta(hours=1), "boot-1", "Azure Reboot (Platform)",
                    t + dt.timedelta(minutes=5), t - dt.timedelta(minutes=1), True)  # fmt: skip
    meta = maintenance.encode("REBOOT", rec)
    assert all(isinstance(v, str) for v in meta.values())
    assert (meta["kind"], meta["repair"]) == ("REBOOT", PROVIDER_REPAIR)
    assert maintenance.decode(meta) == rec
    bare = mp.Raised("oci", ("oci:x:due",), None)
    assert maintenance.decode(maintenance.encode("REBOOT", bare)) == bare


def test_a_nodes_state() -> None:
    node = {"status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": "True"}], "nodeInfo": {"bootID": "b-1"}}}  # fmt: skip
    assert maintenance.node_state(node) == mp.NodeState(True, True, "b-1")
    assert maintenance.node_state({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}) == (
        mp.NodeState(True, False, ""))  # fmt: skip
    assert maintenance.node_state(None) == mp.NodeState(exists=False)


def test_the_relayed_events_as_the_store_keeps_them() -> None:
    got = scheduled_events.records([
        {"EventId": "e-1", "EventType": "Reboot", "Resources": ["vm_1", "vm_2"], "EventStatus": "Scheduled",
         "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description": "maintenance", "EventSource": "Platform",
         "DurationInSeconds": 7},
        {"EventId": "e-2", "EventType": "Preempt", "Resources": "vm_1", "DurationInSeconds": "soon"},
    ])  # fmt: skip
    assert [(r.event_id, r.event_type, r.status, r.resources, r.not_before, r.duration_s) for r in got] == [
        ("e-1", "Reboot", "Scheduled", "vm_1,vm_2", "Mon, 19 Sep 2016 18:29:47 GMT", 7),
        ("e-2", "Preempt", "Scheduled", "vm_1", "", -1),
    ]


@pytest.mark.parametrize(
    ("size", "error"), [(64, None), (scheduled_events.MAX_ANSWER + 10, "over 1048576 bytes")]
)
@pytest.mark.redteam
def test_a_metadata_answer_is_read_up_to_its_bound(size: int, error: str | None) -> None:
    """Whatever answers at the metadata address, the agent holds at most MAX_ANSWER bytes of it."""
    body = b'{"DocumentIncarnation": 1, "Events": []}'.ljust(size)

    class Answer(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        imds = scheduled_events.Imds(f"http://127.0.0.1:{server.server_address[1]}")
        if error is None:
            assert imds.document() == (1, [])
        else:
            with pytest.raises(TransientError, match=error):
                imds.document()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
