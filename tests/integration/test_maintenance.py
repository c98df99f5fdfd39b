"""The cloud maintenance monitor on the real control plane and FerretDB, against the local fakes of the
providers' APIs (tests/fakes/cloud.py), with the janitor's credentials: AWS through IRSA (STS), GCP with
the metadata server's token, OCI with an API key. Simulated nodes of its own carry the providerIDs (a
Node takes one only once). Each look is called directly: the test decides when time has passed."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from devtools import procs
from devtools.cluster import LocalCluster
from faultline import kube, store
from faultline.models import PROVIDER_REPAIR, FaultState
from tests.fakes import cloud as fakes
from workers import maintenance
from workers.cloud import aws, gcp, oci

pytestmark = pytest.mark.integration
LABEL = "faultline.io/maintenance-test"
AWS_ID, GCE_NAME = "i-0a1b2c3d4e5f60001", "gke-a3-pool-maint-1"
OCI_ID = "ocid1.instance.oc1.iad.maintenance1"


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def ec2_time(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.000Z")


@pytest.fixture
def nodes(cluster: LocalCluster, api: Any) -> Iterator[dict[str, str]]:
    """Three simulated nodes of this test (named by its process), as an EC2, GCE and OCI instance."""
    tag = f"{os.getpid()}-{now():%H%M%S%f}"
    ids = {"aws": f"aws:///us-east-1a/{AWS_ID}", "gcp": f"gce://proj-m/us-central1-a/{GCE_NAME}",
           "oci": f"oci://{OCI_ID}"}  # fmt: skip
    made = {}
    try:
        for provider, provider_id in ids.items():
            name = f"maint-{provider}-{tag}"
            cluster.fakelet.add(name, provider_id=provider_id)
            kube.nodes.patch(api, name, {"metadata": {"labels": {LABEL: tag}}})
            made[provider] = name
        made["tag"] = tag
        yield made
    finally:
        for provider in ("aws", "gcp", "oci"):
            if provider in made:
                cluster.fakelet.remove(made[provider])


def monitor(st: store.Store, api: Any, fake: fakes.FakeCloud, tmp_path: Path, tag: str,
            **changes: Any) -> maintenance.MaintenanceMonitor:  # fmt: skip
    token = tmp_path / "web-identity-token"
    token.write_text(fakes.WEB_IDENTITY_TOKEN)
    irsa = {"AWS_ROLE_ARN": "arn:aws:iam::111122223333:role/faultline-maintenance",
            "AWS_WEB_IDENTITY_TOKEN_FILE": str(token)}  # fmt: skip
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    fake.oci_public_key = key.public_key()
    providers = {
        "aws": aws.AWS(aws.Settings(endpoint=f"{fake.url}/aws/ec2/", sts_endpoint=f"{fake.url}/aws/sts/", env=irsa)),
        "gcp": gcp.GCP(gcp.Settings(endpoint=f"{fake.url}/compute/v1",
                                    env={"GCE_METADATA_HOST": fake.url.removeprefix("http://")})),
        "oci": oci.OCI(oci.Settings(config_file=fakes.oci_config(tmp_path, key), endpoint=fake.url)),
    }  # fmt: skip
    readers = {"aws": maintenance.aws_reader(lambda: providers["aws"]),
               "gcp": maintenance.gcp_reader(lambda: providers["gcp"]),
               "oci": maintenance.oci_reader(lambda: providers["oci"])}  # fmt: skip
    settings = maintenance.Settings(readers=readers, node_selector=f"{LABEL}={tag}", **changes)
    return maintenance.MaintenanceMonitor(st, api, settings, "maintenance-test")


def faults(st: store.Store, node: str) -> dict[str, store.FaultRecord]:
    return {d["code"]: store.FaultRecord.from_doc(d) for d in st.faults.find({"node": node})}


def reasons(api: Any, node: str) -> list[str]:
    events = (
        kube.core(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    )
    return sorted(str(e.reason) for e in events if (e.reason or "").startswith("FaultlineMaintenance"))


def test_each_providers_announcements_become_faults_ahead_of_their_window_and_resolve(
    cluster: LocalCluster, api: Any, mongo_db: Any, nodes: dict[str, str], tmp_path: Path
) -> None:
    st = store.Store(mongo_db)
    st.ensure_indexes()
    soon, later = now() + dt.timedelta(minutes=30), now() + dt.timedelta(hours=3)
    with fakes.FakeCloud() as fake:
        fake.ec2_events[AWS_ID] = [{"instanceEventId": "instance-event-0abc", "code": "system-reboot",
                                    "description": "scheduled reboot", "notBefore": ec2_time(soon),
                                    "notAfter": ec2_time(soon + dt.timedelta(hours=2))}]  # fmt: skip
        fake.gce_instances[("proj-m", "us-central1-a")] = {GCE_NAME: {
            "scheduling": {"onHostMaintenance": "TERMINATE", "automaticRestart": True},
            "upcomingMaintenance": {"type": "SCHEDULED", "windowStartTime": later.isoformat(),
                                    "windowEndTime": (later + dt.timedelta(hours=1)).isoformat(),
                                    "maintenanceStatus": "PENDING"}}}  # fmt: skip
        overdue = now() - dt.timedelta(minutes=5)  # Oracle reboots it within 24 hours of the due time
        fake.oci_instances[OCI_ID] = {
            "lifecycleState": "RUNNING",
            "timeMaintenanceRebootDue": overdue.isoformat(),
        }
        settle = dt.timedelta(seconds=2)
        mon = monitor(st, api, fake, tmp_path, nodes["tag"], settle=settle, analyzer_feed=True)
        mon.look()
        got = {p: faults(st, nodes[p]) for p in ("aws", "gcp", "oci")}
        assert set(got["aws"]) == {"CSP-MAINTENANCE-REBOOT"}
        assert set(got["oci"]) == {"CSP-MAINTENANCE-REBOOT"}
        assert got["gcp"] == {}  # three hours away: outside the hour's lead time
        reboot = got["aws"]["CSP-MAINTENANCE-REBOOT"]
        assert (reboot.state, reboot.fatal, reboot.action, reboot.component) == (
            "open",
            True,
            "RESTART_VM",
            "NODE",
        )
        assert (reboot.entity.type, reboot.entity.id, reboot.pattern) == (
            "NODE",
            "",
            store.MAINTENANCE_PATTERN,
        )
        assert reboot.metadata["repair"] == PROVIDER_REPAIR
        assert reboot.metadata["events"] == "instance-event-0abc"
        assert reboot.metadata["boot_id"] == cluster.fakelet.nodes[nodes["aws"]].boot_id
        assert "EC2 system-reboot: scheduled reboot" in reboot.message
        assert mongo_db["queue"].count_documents({"node": nodes["aws"]}) == 1  # quarantine's work item
        assert reasons(api, nodes["aws"]) == ["FaultlineMaintenanceAnnounced"]

        # a longer lead time reaches the GCE window; nothing else changes (no second write, no Event)
        revisions = {p: faults(st, nodes[p])["CSP-MAINTENANCE-REBOOT"].revision for p in ("aws", "oci")}
        mon = monitor(st, api, fake, tmp_path, nodes["tag"], settle=settle, lead_time=dt.timedelta(hours=4),
                      analyzer_feed=True)  # fmt: skip
        mon.look()
        assert set(faults(st, nodes["gcp"])) == {"CSP-MAINTENANCE-REBOOT"}
        assert {
            p: faults(st, nodes[p])["CSP-MAINTENANCE-REBOOT"].revision for p in ("aws", "oci")
        } == revisions
        assert reasons(api, nodes["aws"]) == ["FaultlineMaintenanceAnnounced"]

        # GCE withdraws its maintenance before the window; EC2 reboots the instance and marks its event
        # completed; OCI stops its own, which clears the due time
        fake.gce_instances[("proj-m", "us-central1-a")][GCE_NAME].pop("upcomingMaintenance")
        fake.ec2_events[AWS_ID][0]["description"] = "[Completed] scheduled reboot"
        fake.oci_instances[OCI_ID]["timeMaintenanceRebootDue"] = None
        mon.look()
        for p in ("aws", "gcp", "oci"):  # Ready, but their old boot ids: the instances may be stopping now
            assert faults(st, nodes[p])["CSP-MAINTENANCE-REBOOT"].state == FaultState.OPEN
            assert faults(st, nodes[p])["CSP-MAINTENANCE-REBOOT"].metadata["over_since"]
        for p in ("aws", "oci"):
            cluster.fakelet.reboot(nodes[p], down_seconds=1.0)

        def resolved() -> bool:
            mon.look()
            return all(faults(st, nodes[p])["CSP-MAINTENANCE-REBOOT"].state == FaultState.RESOLVED
                       for p in ("aws", "gcp", "oci"))  # fmt: skip

        procs.wait_for("back with a new boot id, or Ready for the settle time, and resolved", resolved, 30,
                       interval=0.5)  # fmt: skip
        assert reasons(api, nodes["aws"]) == ["FaultlineMaintenanceAnnounced", "FaultlineMaintenanceOver"]
        assert reasons(api, nodes["oci"]) == ["FaultlineMaintenanceAnnounced", "FaultlineMaintenanceOver"]
        assert reasons(api, nodes["gcp"]) == [
            "FaultlineMaintenanceAnnounced",
            "FaultlineMaintenanceCancelled",
        ]
        assert mongo_db["queue"].count_documents({"node": nodes["aws"]}) == 0
        history = [(e["code"], e["healthy"]) for e in mongo_db["health_events"].find({"node": nodes["aws"]})
                   .sort("generated_at", 1)]  # fmt: skip
        assert history == [("CSP-MAINTENANCE-REBOOT", False), ("CSP-MAINTENANCE-REBOOT", True)]
        # with analyzer_feed, the cluster analyzer's feed has the same history and the fault's writes
        fed = st.feed_after({}).batches
        assert {b.writer for b in fed} == {maintenance.FEED_WRITER}
        assert [
            (e["code"], e["healthy"]) for b in fed for e in b.events if e["node"] == nodes["aws"]
        ] == history
        states = [f["state"] for b in fed for f in b.faults if f["node"] == nodes["aws"]]
        assert (states[0], states[-1], set(states)) == ("open", "resolved", {"open", "resolved"})
        # a completed event still listed is not raised again
        mon.look()
        assert faults(st, nodes["aws"])["CSP-MAINTENANCE-REBOOT"].state == FaultState.RESOLVED
    assert {a for a, _ in fake.actions("aws")} == {"DescribeInstanceStatus"}  # nothing but reads
    assert {a for a, _ in fake.actions("gcp")} == {"list"} and {a for a, _ in fake.actions("oci")} == {"GET"}


def test_a_provider_that_cannot_be_read_changes_nothing(
    cluster: LocalCluster, api: Any, mongo_db: Any, nodes: dict[str, str], tmp_path: Path
) -> None:
    """EC2 refusing (throttled) leaves the fault as it is; an instance EC2 no longer knows is left out of
    the call and the others are still read; a Node that is gone resolves its faults."""
    st = store.Store(mongo_db)
    st.ensure_indexes()
    with fakes.FakeCloud() as fake:
        fake.ec2_events[AWS_ID] = [{"instanceEventId": "instance-event-1", "code": "instance-retirement",
                                    "description": "degraded hardware", "notBefore": ec2_time(now())}]  # fmt: skip
        mon = monitor(st, api, fake, tmp_path, nodes["tag"])
        mon.look()
        retire = faults(st, nodes["aws"])["CSP-MAINTENANCE-TERMINATE"]
        assert (retire.state, retire.action) == ("open", "REPLACE_VM")
        fake.ec2_events.clear()  # the event is gone, but EC2 cannot be read this time
        fake.fail["aws"] = [
            (503, "<Response><Errors><Error><Code>Unavailable</Code></Error></Errors></Response>")
        ]
        mon.look()
        assert faults(st, nodes["aws"])["CSP-MAINTENANCE-TERMINATE"].revision == retire.revision
        assert mon.errors.labels(provider="aws")._value.get() == 1

        # another node of the same region whose instance was terminated: DescribeInstanceStatus refuses
        # the whole call for it, so it is left out and the rest read
        gone_id = "i-0a1b2c3d4e5f6dead"
        other = f"maint-aws-gone-{nodes['tag']}"
        cluster.fakelet.add(other, provider_id=f"aws:///us-east-1a/{gone_id}")
        try:
            kube.nodes.patch(api, other, {"metadata": {"labels": {LABEL: nodes["tag"]}}})
            fake.ec2_gone.add(gone_id)
            fake.ec2_events[AWS_ID] = [{"instanceEventId": "instance-event-1", "code": "instance-retirement",
                                        "description": "degraded hardware", "notBefore": ec2_time(now())}]  # fmt: skip
            mon.look()
            assert mon.errors.labels(provider="aws")._value.get() == 1  # no new failure
            assert faults(st, nodes["aws"])["CSP-MAINTENANCE-TERMINATE"].state == "open"
        finally:
            cluster.fakelet.remove(other)
        # the instance is retired and its Node removed: the fault resolves
        cluster.fakelet.remove(nodes["aws"])
        mon.look()
        assert faults(st, nodes["aws"])["CSP-MAINTENANCE-TERMINATE"].state == FaultState.RESOLVED
    calls = [i for a, i in fake.actions("aws") if a == "DescribeInstanceStatus"]
    # the first look; the second refused; the third without the gone instance; the last had no EC2 node
    assert calls == [AWS_ID, AWS_ID]


AZ_VMSS = ("/subscriptions/0000-1111/resourceGroups/mc_rg/providers/Microsoft.Compute/"
           "virtualMachineScaleSets/aks-gpu-12345678-vmss/virtualMachines/3")  # fmt: skip


def azure_event(event_id: str, vm: str, *, minutes: int = 15, event_type: str = "Reboot") -> dict[str, Any]:
    not_before = (now() + dt.timedelta(minutes=minutes)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    return {"EventId": event_id, "EventType": event_type, "ResourceType": "VirtualMachine", "Resources": [vm],
            "EventStatus": "Scheduled", "NotBefore": not_before, "Description": "Host server is undergoing "
            "maintenance.", "EventSource": "Platform", "DurationInSeconds": 7}  # fmt: skip


def test_the_agents_relay_of_azure_scheduled_events_and_its_early_start(
    mongo: Any, mongo_db: Any, tmp_path: Path
) -> None:
    """The relay records the node's Scheduled Events, posts StartRequests only for the events asked for
    (once each, only while Scheduled), and does nothing at all on a node that is not Azure's."""
    from sources import scheduled_events  # noqa: PLC0415

    st = store.Store(mongo_db)
    node = "aks-gpu-12345678-vmss000003"
    with fakes.FakeCloud() as fake:
        fake.azure_vm = "aks-gpu-12345678-vmss_3"
        fake.azure_events = [
            azure_event("ev-1", fake.azure_vm),
            azure_event("ev-other", "aks-gpu-12345678-vmss_4"),
        ]
        link = scheduled_events.store_link(st, node)
        relay = scheduled_events.Relay(node, scheduled_events.Imds(fake.url), link, lambda: f"azure://{AZ_VMSS}",
                                       interval=0.2)  # fmt: skip
        relay.start()
        try:
            procs.wait_for("relayed", lambda: st.scheduled_events([node]).get(node) is not None, 10)
            doc = st.scheduled_events([node])[node]
            assert (doc.vm_name, doc.incarnation) == ("aks-gpu-12345678-vmss_3", 2)
            assert [(e.event_id, e.event_type, e.status, e.resources) for e in doc.events] == [
                ("ev-1", "Reboot", "Scheduled", "aks-gpu-12345678-vmss_3"),
                ("ev-other", "Reboot", "Scheduled", "aks-gpu-12345678-vmss_4"),
            ]
            assert fake.azure_started == []  # nobody asked
            st.request_start(node, ["ev-1", "ev-unknown"])  # as the monitor does once the node is drained
            procs.wait_for("started", lambda: fake.azure_started == ["ev-1"], 10)
            procs.wait_for("recorded", lambda: st.scheduled_events([node])[node].started == ["ev-1"], 10)
            procs.wait_for("its status relayed", lambda: st.scheduled_events([node])[node].events[0].status
                           == "Started", 10)  # fmt: skip
            fake.azure_events = []  # the maintenance done: the event leaves the document
            procs.wait_for(
                "the empty document relayed", lambda: st.scheduled_events([node])[node].events == [], 10
            )
        finally:
            relay.close()
        assert fake.azure_started == ["ev-1"]  # once

        elsewhere = scheduled_events.Relay("gce-node", scheduled_events.Imds(fake.url),
                                           scheduled_events.store_link(st, "gce-node"),
                                           lambda: "gce://p/z/n", interval=0.2)  # fmt: skip
        assert elsewhere.step() is False
        elsewhere.close()
        assert st.scheduled_events(["gce-node"]) == {}
