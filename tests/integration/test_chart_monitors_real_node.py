"""The object monitor, the cloud maintenance monitor and the cluster analyzer as real pods (issues 17
and 16): `helm install oci://<loopback registry>/faultline` with `objectMonitor.enabled`,
`maintenance.enabled` and `analyzer.enabled` (the agent off: none needs it) into the local cluster with
a real kubelet node, the three Deployments placed on that node, the session's FerretDB as the store.

(a) the pods run the project's image (by digest) on the real node, become Ready and are never restarted;
    each runs as the ServiceAccount the chart made, and what its identity was refused would show: no
    Forbidden in any log, every watch of the object monitor listed with no error (its metrics), the
    analyzer's node labels read, and /healthz (the probes' endpoint) answers from each pod's address;
(b) the object monitor, watching the real API server from inside its pod, raises KUBE-GPUS-NOT-ADVERTISED
    on the real node when the node says it has 8 GPUs (nvidia.com/gpu.count) and advertises 7 (the
    node's status, as a device plugin would set it; the rule's `for` shortened by objectMonitor.overrides),
    with an Event on the Node, and resolves it when 8 are advertised again;
(c) the maintenance monitor reads OCI's Core API, the local fake of it (tests/fakes/cloud.py) reached from
    the pod at the bridge address the cluster exposes it on, signing with the API key of the Secret named
    by maintenance.ociConfigSecret: a maintenance reboot due in 30 minutes on an OCI instance (a simulated
    node of the test's with that providerID, picked by maintenance.watchSelector) becomes
    CSP-MAINTENANCE-REBOOT on the node, with an Event; once the due time is cleared and the node is back
    with a new boot id the fault resolves as over;
(d) the analyzer, with a pack of the test's from analyzer.packs (mounted from the chart's ConfigMap), holds
    the analyzer's lease in the store, and derives the pack's CHART-GPU-REPEAT from feed records the
    test writes through the store as an agent with analyzer_feed does (`Store.record_batch`): one GPU
    (by UUID) failing on two nodes;
(f) the exporter, with no Kubernetes identity at all, POSTs the maintenance fault's opening and resolution
    as CloudEvents, signed with the HMAC secret of the Secret its sink names, to a receiver on the host
    (reached at the bridge address), and nothing else (its sink's filter);
(g) store retention: a Job made from its CronJob runs `faultline store retention` on the real node with
    the store's URI and no API token, and completes;
(e) `helm uninstall` leaves no object of the release (workloads, ConfigMaps, ServiceAccounts, roles and
    bindings, Helm's own record) and, with the test's label and GPUs taken back, the real node is as it
    was before the test.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from devtools import procs
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo
from faultline import kube, store
from faultline.errors import TransientError
from faultline.kube import lite
from faultline.models import PROVIDER_REPAIR, Action, Component, Entity, FaultState, HealthEvent, event_id
from patterns import cluster
from tests.fakes import cloud as fakes
from tests.integration import chartutil
from tests.integration.chartutil import NODE
from tests.integration.test_chart import ANALYZER_PACK
from tests.integration.test_export import Receiver

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),  # the first real-node test starts the cluster: tools built, image pushed
    pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)"),
]
RELEASE = "flm"
MONITORS = ("object-monitor", "maintenance")
COMPONENTS = (*MONITORS, "analyzer", "export")
COUNT_LABEL = "nvidia.com/gpu.count"  # what the built-in gpus-not-advertised rule compares with
GPUS, REBOOT = "KUBE-GPUS-NOT-ADVERTISED", "CSP-MAINTENANCE-REBOOT"
REPEAT = "CHART-GPU-REPEAT"  # ANALYZER_PACK's code
WATCH_LABEL = "faultline.io/maintenance-test"
METRICS_PORT = 9400  # the chart's metrics.port
# what `helm uninstall` must take away: the kinds the chart makes, by the release's label
RELEASE_KINDS = (
    "api/v1/namespaces/{ns}/pods", "api/v1/namespaces/{ns}/configmaps", "api/v1/namespaces/{ns}/secrets",
    "api/v1/namespaces/{ns}/serviceaccounts", "api/v1/namespaces/{ns}/services",
    "apis/apps/v1/namespaces/{ns}/deployments", "apis/apps/v1/namespaces/{ns}/replicasets",
    "apis/batch/v1/namespaces/{ns}/jobs",
    "apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",
    "apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
    "apis/rbac.authorization.k8s.io/v1/clusterroles", "apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
)  # fmt: skip


def _values(
    cluster: LocalCluster,
    uri: str,
    database: str,
    state: Path,
    *,
    oci: str,
    oci_secret: str,
    watch: str,
    sink: str,
    sink_secret: str,
) -> dict[str, Any]:
    """The store and image as the real-node chart test gives them, the agent off, and both monitors and the
    analyzer on the real node: the object monitor with the built-in rules (gpus-not-advertised after 1 s),
    the maintenance monitor looking at OCI's nodes of `watch` every second, the analyzer with the test's
    pack besides the built-in ones, reading the feed every 100 ms."""
    values = chartutil.chart_values(cluster, uri, database, state)
    values["agent"]["enabled"] = False
    place = {"nodeSelector": {"kubernetes.io/hostname": NODE}}
    values["objectMonitor"] = {"enabled": True, "overrides": {"gpus-not-advertised": {"for": "1s"}}, **place}
    values["maintenance"] = {"enabled": True, "clouds": ["oci"], "interval": "1s", "watchSelector": watch,
                             "endpoints": {"oci": oci}, "ociConfigSecret": oci_secret, **place}  # fmt: skip
    values["analyzer"] = {"enabled": True, "packs": {"chart-cluster.yaml": ANALYZER_PACK},
                          "config": {"poll": "100ms", "checkpoint_interval": "500ms"}, **place}  # fmt: skip
    values["export"] = {"enabled": True, "cluster": "real-lab", "poll": "1s", **place, "sinks": [
        {"name": "events", "url": sink, "filter": {"codes": [REBOOT]},
         "hmacSecret": {"name": sink_secret, "key": "hmac"}},
    ]}  # fmt: skip
    return values


def _xid(node: str, gpu_uuid: str, code: str, at: dt.datetime) -> HealthEvent:
    """A GPU's XID event as an agent writes it, with the GPU's UUID (the analyzer's `gpu` key)."""
    return HealthEvent(
        id=event_id(node, "kmsg", "GPU", "0000:3b:00", code, at), node=node, component=Component.GPU,
        check="xid", code=code, entities=(Entity(type="GPU", id="0000:3b:00"),), healthy=False, fatal=True,
        action=Action.RESTART_BM, metadata={"gpu_uuid": gpu_uuid}, generated_at=at, observed_at=at,
    )  # fmt: skip


def _faults(db: Any, node: str, code: str) -> list[store.FaultRecord]:
    return [store.FaultRecord.from_doc(d) for d in db["faults"].find({"node": node, "code": code})]


def _state(db: Any, node: str, code: str) -> str | None:
    found = _faults(db, node, code)
    return found[0].state if found else None


def _history(db: Any, node: str, code: str) -> list[bool]:
    """The health events of `code` on `node`, oldest first: False raised, True resolved."""
    return [
        e["healthy"] for e in db["health_events"].find({"node": node, "code": code}).sort("generated_at", 1)
    ]


def _reasons(api: Any, node: str, prefix: str) -> list[str]:
    events = (
        kube.core(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    )
    return sorted(str(e.reason) for e in events if (e.reason or "").startswith(prefix))


def _http(pod: dict[str, Any], path: str) -> tuple[int, str]:
    """GET `path` of the pod's metrics server at its own address (where the kubelet's probes go)."""
    url = f"http://{pod['status']['podIP']}:{METRICS_PORT}{path}"
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.status, answer.read().decode()


def _samples(text: str, name: str) -> dict[str, float]:
    """One metric's samples from a Prometheus text page, by their labels (`name=value,...`, sorted)."""
    return {",".join(f"{k}={v}" for k, v in sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == name}  # fmt: skip


def _node_as_seen(api: Any, name: str) -> dict[str, Any]:
    """What the test may change on a node: its labels, taints, cordon, GPUs. Not the node lifecycle
    controller's taints (node.kubernetes.io/not-ready, unreachable): its view of the kubelet's heartbeat,
    which a loaded 2-core machine can delay, is not the test's or faultline's doing."""
    node = kube.nodes.read(api, name)
    status = node.get("status") or {}
    return {
        "labels": node["metadata"].get("labels") or {},
        "taints": [
            t for t in node["spec"].get("taints") or [] if not t["key"].startswith("node.kubernetes.io/")
        ],
        "unschedulable": bool(node["spec"].get("unschedulable")),
        "capacity": (status.get("capacity") or {}).get("nvidia.com/gpu"),
        "allocatable": (status.get("allocatable") or {}).get("nvidia.com/gpu"),
    }


def _release_objects(client: lite.Client, ns: str) -> list[str]:
    left = []
    for kind in RELEASE_KINDS:
        path = "/" + kind.format(ns=ns)
        for selector in (f"app.kubernetes.io/instance={RELEASE}", f"owner=helm,name={RELEASE}"):
            found = client.request("GET", f"{path}?labelSelector={selector}")
            left += [f"{kind.rsplit('/', 1)[1]}/{o['metadata']['name']}" for o in found["items"]]
    return left


@pytest.mark.usefixtures("sim_nodes_cordoned")
def test_the_monitors_and_the_cluster_analyzer_run_as_real_pods_and_raise_from_real_objects(
    real_cluster: LocalCluster, real_store: str, store_db: tuple[str, Any], helm_env: dict[str, str],
    mongo: LocalMongo, tmp_path: Path,
) -> None:  # fmt: skip
    real = real_cluster.real
    fakelet = real_cluster.fakelet
    assert real is not None and fakelet is not None
    started = time.monotonic()
    api = real_cluster.api()
    core = kube.core(api)
    client = lite.Client.connect(real_cluster.kubeconfig)
    database, db = store_db
    suffix = uuid.uuid4().hex[:6]
    ns, oci_secret = f"flm-{suffix}", "oci-api-key"
    ocid = f"ocid1.instance.oc1.iad.realnode{suffix}"
    oci_node = f"oci-{suffix}"
    uri = f"mongodb://{real_store}/?retryWrites=false&directConnection=true"
    before = _node_as_seen(api, NODE)
    seconds: dict[str, float] = {}
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def after() -> None:
        """The test's node removed, the real node's GPU count label taken back, the API client closed."""
        fakelet.remove(oci_node)
        kube.nodes.patch(api, NODE, {"metadata": {"labels": {COUNT_LABEL: None}}})
        client.close()

    receiver = Receiver()
    receiver.down = False
    with (
        fakes.FakeCloud(oci_public_key=key.public_key()) as fake,
        chartutil.Release(
            real_cluster, helm_env, RELEASE, ns, values=tmp_path / "values.yaml", db=db, after=after
        ) as release,
    ):
        # the test's OCI instance: a simulated node with its providerID, a reboot due in 30 minutes
        due = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=30)).replace(microsecond=0)
        fake.oci_instances[ocid] = {
            "lifecycleState": "RUNNING",
            "timeMaintenanceRebootDue": due.isoformat(),
        }
        fakelet.add(oci_node, provider_id=f"oci://{ocid}")
        kube.nodes.patch(api, oci_node, {"metadata": {"labels": {WATCH_LABEL: suffix}}})
        port = int(fake.url.rsplit(":", 1)[1])
        oci_endpoint = f"http://{real_cluster.expose(port)}"  # the fake, as pods reach it
        (tmp_path / "oci").mkdir()
        fakes.oci_config(tmp_path / "oci", key)
        sink = f"http://{real_cluster.expose(receiver.server.server_address[1])}/events"
        core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
        core.create_namespaced_secret(ns, {"metadata": {"name": "export-hmac"},  # type: ignore[arg-type]
                                           "stringData": {"hmac": f"key-{suffix}"}})  # fmt: skip
        core.create_namespaced_secret(ns, {  # type: ignore[arg-type]
            "metadata": {"name": oci_secret},
            "stringData": {name: (tmp_path / "oci" / name).read_text() for name in ("config", "key.pem")},
        })  # fmt: skip

        # -- (a) install: the monitors and the analyzer Ready on the real node, as their chart identities --
        installed = release.install(_values(
            real_cluster, uri, database, tmp_path / "node" / "state", oci=oci_endpoint,
            oci_secret=oci_secret, watch=f"{WATCH_LABEL}={suffix}", sink=sink, sink_secret="export-hmac",
        ), ready=COMPONENTS)  # fmt: skip
        seconds["install to Ready"] = time.monotonic() - installed
        assert sorted(p["metadata"]["labels"]["app.kubernetes.io/component"]
                      for p in release.pods()) == sorted(COMPONENTS)  # fmt: skip
        pods = {}
        for component in COMPONENTS:
            pod = release.pod(component)
            assert pod is not None and pod["spec"]["nodeName"] == NODE, component
            (status,) = pod["status"]["containerStatuses"]
            assert status["imageID"].endswith(real.image.split("@")[1]), status
            assert status["containerID"].startswith("containerd://")
            account = f"{RELEASE}-{component}"
            assert pod["spec"]["serviceAccountName"] == account
            if component == "export":  # it reads the store only: no binding, no token in the pod
                with pytest.raises(ApiException):
                    kube.rbac(api).read_cluster_role_binding(account)
                assert not any(m["mountPath"].startswith("/var/run/secrets/kubernetes.io")
                               for m in pod["spec"]["containers"][0]["volumeMounts"])  # fmt: skip
            else:
                binding = kube.rbac(api).read_cluster_role_binding(account)
                assert [(s.kind, s.name, s.namespace) for s in binding.subjects or []] == [
                    ("ServiceAccount", account, ns)
                ]
            assert _http(pod, "/healthz") == (200, "ok\n"), component
            pods[component] = pod

        # every watch of the rules listed, none refused (a Forbidden list counts as an error)
        def watches() -> tuple[dict[str, float], dict[str, float]]:
            page = _http(pods["object-monitor"], "/metrics")[1]
            return (_samples(page, "faultline_object_monitor_watch_lists"),
                    _samples(page, "faultline_object_monitor_watch_errors"))  # fmt: skip

        procs.wait_for("every watch listed",
                       lambda: len(watches()[0]) == 3 and all(v >= 1 for v in watches()[0].values()), 60,
                       interval=0.5)  # fmt: skip
        lists, errors = watches()
        assert set(errors) == set(lists) and not any(errors.values()), (lists, errors)

        # -- (c, raise) the maintenance monitor reads OCI through the fake and raises the reboot -----------
        try:
            procs.wait_for(f"{REBOOT} open on {oci_node}",
                           lambda: _state(db, oci_node, REBOOT) == FaultState.OPEN, 60, interval=0.5)  # fmt: skip
        except TransientError as exc:
            raise AssertionError(release.diagnosis()) from exc
        seconds["install to maintenance fault"] = time.monotonic() - installed
        (fault,) = _faults(db, oci_node, REBOOT)
        assert (fault.fatal, fault.action, fault.component, fault.entity.type) == (
            True, "RESTART_VM", "NODE", "NODE",
        )  # fmt: skip
        assert (fault.metadata["provider"], fault.metadata["repair"]) == ("oci", PROVIDER_REPAIR)
        assert fault.metadata["not_before"] == due.isoformat()
        assert fault.metadata["boot_id"] == fakelet.nodes[oci_node].boot_id
        assert ("oci", "GET", ocid) in fake.calls  # signed with the Secret's key: the fake verified it
        announced = ["FaultlineMaintenanceAnnounced"]
        procs.wait_for("the Event of the announcement on the node",
                       lambda: _reasons(api, oci_node, "FaultlineMaintenance") == announced, 30, interval=0.5)  # fmt: skip
        page = _http(pods["maintenance"], "/metrics")[1]
        assert _samples(page, "faultline_maintenance_announced") == {"kind=REBOOT,provider=oci": 1.0}, page
        assert _samples(page, "faultline_maintenance_read_errors_total") == {}, page

        # -- (b) the object monitor: 8 GPUs said, 7 advertised, on the real node ---------------------------
        chartutil.advertise_gpus(api, 8)
        kube.nodes.patch(api, NODE, {"metadata": {"labels": {COUNT_LABEL: "8"}}})
        changed = time.monotonic()
        chartutil.advertise_gpus(api, 7)  # one fell off the bus: the device plugin advertises 7
        try:
            procs.wait_for(f"{GPUS} open on the real node",
                           lambda: _state(db, NODE, GPUS) == FaultState.OPEN, 60, interval=0.5)  # fmt: skip
        except TransientError as exc:
            raise AssertionError(release.diagnosis()) from exc
        seconds["7 advertised to fault open"] = time.monotonic() - changed
        (fault,) = _faults(db, NODE, GPUS)
        assert fault.message == f"allocatable nvidia.com/gpu is 7, the node has 8 ({COUNT_LABEL})"
        assert fault.metadata == {
            "source": "kube",
            "rule": "gpus-not-advertised",
            "object": f"Node {NODE}",
        }
        assert (fault.fatal, fault.action) == (True, "RESTART_VM")
        changed = time.monotonic()
        chartutil.advertise_gpus(api, 8)  # back
        procs.wait_for(f"{GPUS} resolved on the real node",
                       lambda: _state(db, NODE, GPUS) == FaultState.RESOLVED, 60, interval=0.5)  # fmt: skip
        seconds["8 advertised to resolved"] = time.monotonic() - changed
        assert _history(db, NODE, GPUS) == [False, True]  # opened once, resolved once
        both = [GPUS, f"{GPUS}Resolved"]
        procs.wait_for("the Events of the opening and the resolution on the node",
                       lambda: _reasons(api, NODE, GPUS) == both, 30, interval=0.5)  # fmt: skip
        # the monitor's faults are this one only (nothing else of the cluster's objects matched)
        kube_faults = {(d["node"], d["code"]) for d in db["faults"].find({"metadata.source": "kube"})}
        assert kube_faults == {(NODE, GPUS)}, kube_faults

        # -- (c, resolve) OCI clears the due time as the instance reboots: back with a new boot id --------
        fake.oci_instances[ocid]["timeMaintenanceRebootDue"] = None
        changed = time.monotonic()
        fakelet.reboot(oci_node, down_seconds=1.0)
        procs.wait_for(f"{REBOOT} resolved on {oci_node}",
                       lambda: _state(db, oci_node, REBOOT) == FaultState.RESOLVED, 60, interval=0.5)  # fmt: skip
        seconds["rebooted to maintenance resolved"] = time.monotonic() - changed
        assert _history(db, oci_node, REBOOT) == [False, True]
        over = [*announced, "FaultlineMaintenanceOver"]
        procs.wait_for("the Event of the maintenance over on the node",
                       lambda: _reasons(api, oci_node, "FaultlineMaintenance") == over, 30, interval=0.5)  # fmt: skip
        assert {a for a, _ in fake.actions("oci")} == {"GET"}  # nothing but reads

        # -- (f) the exporter: the maintenance fault's opening and resolution, signed, and nothing else ----
        (reboot,) = _faults(db, oci_node, REBOOT)
        last = f"{reboot.id}@{reboot.revision}"  # the resolution
        procs.wait_for("the resolution exported", lambda: last in receiver.ids("/events"), 30, interval=0.5)
        events = [doc for doc, _ in receiver.got["/events"]]
        ids = [e["id"] for e in events]
        assert len(ids) == len(set(ids)) and ids[-1] == last, ids
        # the opening may be coalesced with the monitor's next write before the exporter's look
        assert events[0]["type"] in ("io.faultline.fault.opened", "io.faultline.fault.updated")
        assert events[-1]["type"] == "io.faultline.fault.resolved"
        for doc, head in receiver.got["/events"]:
            raw = bytes.fromhex(head["raw"])
            signature = "sha256=" + hmac.new(f"key-{suffix}".encode(), raw, hashlib.sha256).hexdigest()
            assert head["X-Faultline-Signature"] == signature
            assert (doc["source"], doc["subject"], doc["data"]["code"]) == (
                "faultline/real-lab",
                oci_node,
                REBOOT,
            )

        for component in COMPONENTS:  # never restarted, nothing refused
            pod = release.pod(component)
            assert pod is not None and chartutil.ready(pod), component
            restarts = [s["restartCount"] for s in pod["status"]["containerStatuses"]]
            assert restarts == [0], (component, pod["status"])
            log = core.read_namespaced_pod_log(pod["metadata"]["name"], ns)
            assert "forbidden" not in log.lower(), log
        maintenance_log = core.read_namespaced_pod_log(pods["maintenance"]["metadata"]["name"], ns)
        assert "could not be read" not in maintenance_log, maintenance_log

        # -- (d) the analyzer: it holds the lease, and derives its pack's fault from the feed ------------
        st = store.connect(mongo.uri, database)
        try:
            owner = f"analyzer/{pods['analyzer']['metadata']['name']}/"  # its host name is its pod's

            def holder() -> str:
                status = st.analyzer_status(cluster.PARTITIONS)
                return (status.owner if status else None) or ""

            procs.wait_for("the analyzer's lease held by its pod", lambda: holder().startswith(owner), 60,
                           interval=0.5)  # fmt: skip
            now = dt.datetime.now(dt.UTC).replace(microsecond=0)
            gpu, first_node, second_node = f"GPU-{suffix}", f"gpu-a-{suffix}", f"gpu-b-{suffix}"
            first = _xid(first_node, gpu, "XID-79", now - dt.timedelta(minutes=10))
            other = _xid(first_node, f"GPU-other-{suffix}", "XID-79", now - dt.timedelta(minutes=5))
            again = _xid(second_node, gpu, "XID-95", now)  # the same GPU, moved to another node
            written = time.monotonic()
            assert st.record_batch([first, other], []) == 2  # as an agent with analyzer_feed writes
            assert st.record_batch([again], []) == 1
            try:
                procs.wait_for(f"{REPEAT} derived by the analyzer",
                               lambda: _state(db, second_node, REPEAT) == FaultState.OPEN, 60, interval=0.5)  # fmt: skip
            except TransientError as exc:
                raise AssertionError(release.diagnosis()) from exc
            seconds["feed records to derived fault"] = time.monotonic() - written
            (fault,) = _faults(db, second_node, REPEAT)
            assert (fault.entity.type, fault.entity.id, fault.pattern) == (
                "GPU-UUID",
                gpu,
                "chart-gpu-repeat",
            )
            assert (fault.fatal, fault.action, fault.count) == (True, "CONTACT_SUPPORT", 2)
            assert fault.metadata["records"].split(",") == [first.id, again.id]  # not the other GPU's
            ours = (first_node, second_node)  # the built-in patterns derived nothing from these
            derived = [(d["node"], d["code"]) for d in db["faults"].find({}) if d["node"] in ours]
            assert derived == [(second_node, REPEAT)], derived
            page = _http(pods["analyzer"], "/metrics")[1]
            assert _samples(page, "faultline_analyzer_active") == {"": 1.0}, page
            assert _samples(page, "faultline_analyzer_derived_faults_total") == {
                "pattern=chart-gpu-repeat": 1.0
            }
            assert holder().startswith(owner)  # the same replica throughout
        finally:
            st.close()
        analyzer_log = core.read_namespaced_pod_log(pods["analyzer"]["metadata"]["name"], ns)
        for refused in ("node labels not read", "pods not read"):  # its lists of nodes and pods allowed
            assert refused not in analyzer_log, analyzer_log

        # -- (g) store retention: a run of its CronJob (as `kubectl create job --from=cronjob/...`) -----------
        cron = kube.batch(api).read_namespaced_cron_job(f"{RELEASE}-retention", ns)
        job_spec = api.sanitize_for_serialization(cron.spec.job_template.spec)
        assert cron.spec.schedule == "0 0 1 1 *"
        kube.batch(api).create_namespaced_job(ns, {  # type: ignore[arg-type]
            "metadata": {"name": f"{RELEASE}-retention-now", "labels": {"app.kubernetes.io/instance": RELEASE}},
            "spec": job_spec,
        })  # fmt: skip
        procs.wait_for("the retention run done", lambda: (kube.batch(api).read_namespaced_job_status(
            f"{RELEASE}-retention-now", ns).status.succeeded or 0) == 1, 120, interval=0.5)  # fmt: skip
        (run,) = core.list_namespaced_pod(ns, label_selector=f"job-name={RELEASE}-retention-now").items
        assert run.spec.node_name == NODE and run.spec.automount_service_account_token is False
        retention_log = core.read_namespaced_pod_log(run.metadata.name, ns)
        assert "deleted" in retention_log and "forbidden" not in retention_log.lower(), retention_log
        kube.batch(api).delete_namespaced_job(f"{RELEASE}-retention-now", ns, propagation_policy="Foreground")

        # -- (e) uninstall: nothing of the release left; the node as it was ------------------------------
        kube.nodes.patch(api, NODE, {"metadata": {"labels": {COUNT_LABEL: None}}})
        chartutil.advertise_gpus(api, None)
        release.uninstall()
        # the evidence key's Secret is the Secrets hook's, not the release's: it outlives the release
        hooks_own = [f"secrets/{RELEASE}-evidence"]
        procs.wait_for("nothing of the release left but the hook's Secret",
                       lambda: _release_objects(client, ns) == hooks_own, 90, interval=0.5)  # fmt: skip
        assert _node_as_seen(api, NODE) == before
        seconds["test"] = time.monotonic() - started
        print("\nmonitors on a real node: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    receiver.server.shutdown()
    receiver.server.server_close()
