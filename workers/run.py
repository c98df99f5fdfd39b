"""Composition roots of the workers: typed config in, a running worker out (until SIGTERM/SIGINT)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry

from faultline import bounds, evidence, kube, liveness, store
from faultline.config import (
    DrainConfig,
    JanitorConfig,
    MaintenanceConfig,
    ObjectMonitorConfig,
    QuarantineConfig,
    RemediationConfig,
)
from faultline.config.base import EvidenceFields, MetricsFields, VerifyFields, part
from faultline.config.export import ExportConfig
from faultline.errors import ConfigError, ForbiddenError, TransientError
from faultline.metrics import serve
from workers import (
    attribution,
    cloud,
    common,
    drainer,
    janitor,
    maintenance,
    object_monitor,
    preflight_findings,
    quarantine,
    remediation,
)

log = logging.getLogger(__name__)
HALT_S = 20.0  # a stopping part finishes the work in hand within this, inside the 30 s grace period


def _connect(
    uri: str, database: str, *, sleep: Callable[[float], None] = time.sleep, timeout: float = 10.0
) -> store.Store:
    """The store, once it answers: a worker that starts before its store (the chart's embedded store
    starting beside it, a MongoDB failover) waits with back-off (1 s doubling to 30 s) instead of
    exiting into a crash loop. SIGTERM ends the wait (nothing is claimed yet)."""
    st = store.connect(uri, database, timeout=timeout)
    delay = 1.0
    try:
        for attempt in itertools.count(1):
            try:
                with store.unreachable_is_transient("creating indexes"):
                    st.ensure_indexes()
                    st.ensure_fleet_indexes()
                return st
            except TransientError as exc:
                error = bounds.clip(str(exc), bounds.ERROR_TEXT)
                log.warning("the store is not reachable yet; waiting for it",
                            extra={"attempt": attempt, "delay": delay, "error": error})  # fmt: skip
                sleep(delay)
                delay = min(delay * 2, 30.0)
    except BaseException:
        st.close()
        raise
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def cluster_key(config: EvidenceFields, component: str = "") -> evidence.ClusterKey | None:
    """The cluster components' evidence key, signing as `component` ("": verifying only); None: unset."""
    if config.evidence_key is None:
        return None
    return evidence.ClusterKey.from_file(config.evidence_key, component)


def verifier(config: VerifyFields, api: kube.ApiClient) -> evidence.Verifier | None:
    """What proves a fault's writer, where `require_evidence` is on (None: off)."""
    if not config.require_evidence:
        return None
    return evidence.Verifier(attribution.node_key_reader(api), cluster_key(config))


def signed(st: store.Store, config: EvidenceFields, component: str) -> store.Store:
    """`st`, signing the faults it writes as `component` where the evidence key is mounted."""
    st.signer = cluster_key(config, component)
    return st


def quarantine_worker(config: QuarantineConfig) -> quarantine.QuarantineWorker:
    settings = quarantine.Settings.from_config(config)  # rules are checked before anything connects
    cluster_key(config)  # a bad key file stops it before anything connects
    st = _connect(config.mongodb_uri.get_secret_value(), config.database)
    api = kube.api_client(config.kubeconfig, concurrency=config.threads)
    owner = config.owner or common.default_owner("quarantine")
    return quarantine.QuarantineWorker(st, api, settings, owner, stall=config.stall_timeout.total_seconds(),
                                       verifier=verifier(config, api))  # fmt: skip


def quarantine_main(config: QuarantineConfig) -> None:
    _serve_until_signalled(quarantine_worker(config), config)


def drain_worker(config: DrainConfig) -> drainer.Drainer:
    settings = drainer.Settings.from_config(config)
    st = _connect(config.mongodb_uri.get_secret_value(), config.database)
    api = kube.api_client(config.kubeconfig, concurrency=config.threads)
    owner = config.owner or common.default_owner("drain")
    return drainer.Drainer(st, api, settings, owner, stall=config.stall_timeout.total_seconds())


def drain_main(config: DrainConfig) -> None:
    _serve_until_signalled(drain_worker(config), config)


def remediation_main(config: RemediationConfig) -> None:
    settings = remediation.Settings.from_config(config)  # the template is checked before connecting
    st = _connect(config.mongodb_uri.get_secret_value(), config.database)
    api = kube.api_client(config.kubeconfig, concurrency=config.threads)
    with contextlib.suppress(ForbiddenError):  # a cluster where the chart installed the CRD
        kube.resources.ensure_crds(api)  # a local cluster
    owner = config.owner or common.default_owner("remediation")
    worker = remediation.Remediation(st, api, settings, owner, stall=config.stall_timeout.total_seconds(),
                                     verifier=verifier(config, api))  # fmt: skip
    _serve_until_signalled(worker, config)


def janitor_main(config: JanitorConfig) -> None:
    settings = janitor.Settings.from_config(config, cloud_provider(config))
    st = signed(_connect(config.mongodb_uri.get_secret_value(), config.database), config, "janitor")
    api = kube.api_client(config.kubeconfig, concurrency=config.threads)
    owner = config.owner or common.default_owner("janitor")
    worker = janitor.Janitor(st, api, settings, owner, stall=config.stall_timeout.total_seconds())
    _serve_until_signalled(worker, config)


def cloud_provider(config: JanitorConfig) -> cloud.Provider | None:
    """The configured provider (its credentials are looked up at the first call, except OCI's key file,
    read here so a bad one stops the janitor at start)."""
    endpoint = config.cloud_endpoint or ""
    if config.cloud == "aws":
        from workers.cloud import aws  # noqa: PLC0415

        return aws.AWS(aws.Settings(region=config.aws_region or "", endpoint=endpoint))
    if config.cloud == "gcp":
        from workers.cloud import gcp  # noqa: PLC0415

        return gcp.GCP(gcp.Settings(endpoint=endpoint or gcp.API))
    if config.cloud == "azure":
        from workers.cloud import azure  # noqa: PLC0415

        return azure.Azure(azure.Settings(endpoint=endpoint or azure.Settings.endpoint))
    if config.cloud == "oci":
        from workers.cloud import oci  # noqa: PLC0415

        return oci.OCI(
            oci.Settings(config_file=config.oci_config, profile=config.oci_profile, endpoint=endpoint)
        )
    return None


def maintenance_readers(config: MaintenanceConfig) -> dict[str, maintenance.Reader]:
    """The readers of the providers' announcements, with the janitor's provider classes (credentials are
    looked up at the first read; OCI's key file is read then too)."""
    from workers.cloud import aws, gcp, oci  # noqa: PLC0415

    def make_aws() -> aws.AWS:
        return aws.AWS(aws.Settings(region=config.aws_region or "", endpoint=config.aws_endpoint or ""))

    def make_gcp() -> gcp.GCP:
        return gcp.GCP(gcp.Settings(endpoint=config.gcp_endpoint or gcp.API))

    def make_oci() -> oci.OCI:
        settings = oci.Settings(config_file=config.oci_config, profile=config.oci_profile,
                                endpoint=config.oci_endpoint or "")  # fmt: skip
        return oci.OCI(settings)

    readers = {"aws": maintenance.aws_reader(maintenance.lazy(make_aws)),
               "gcp": maintenance.gcp_reader(maintenance.lazy(make_gcp)),
               "oci": maintenance.oci_reader(maintenance.lazy(make_oci))}  # fmt: skip
    return {name: read for name, read in readers.items() if name in config.clouds}


def maintenance_monitor(config: MaintenanceConfig) -> maintenance.MaintenanceMonitor:
    settings = part(config, maintenance.Settings, readers=maintenance_readers(config))
    st = signed(_connect(config.mongodb_uri.get_secret_value(), config.database), config, "maintenance")
    api = kube.api_client(config.kubeconfig)
    owner = config.owner or common.default_owner(maintenance.WORKER)
    stall = config.stall_timeout.total_seconds()
    return maintenance.MaintenanceMonitor(st, api, settings, owner, stall=stall)


def maintenance_main(config: MaintenanceConfig) -> None:
    monitor = maintenance_monitor(config)
    _until_signalled(monitor, monitor.registry, config)


def object_monitor_main(config: ObjectMonitorConfig) -> None:
    settings = object_monitor.Settings.from_config(config)  # the rules are checked before connecting
    st = signed(_connect(config.mongodb_uri.get_secret_value(), config.database), config, "object-monitor")
    api = kube.api_client(config.kubeconfig)
    monitor = object_monitor.ObjectMonitor(st, api, settings, stall=config.stall_timeout.total_seconds(),
                                           preflight_digests=preflight_digests(config, api))  # fmt: skip
    _until_signalled(monitor, monitor.metrics.registry, config)


def export_main(config: ExportConfig) -> None:
    from workers import export  # noqa: PLC0415

    for sink in config.sinks:  # a secret file missing is said before the first event, naming it
        for path in (sink.bearer_token_file, sink.hmac_secret_file):
            if path is not None and not path.is_file():
                raise ConfigError(f"sinks: {sink.name}: {path} is not a readable file")
    st = _connect(config.mongodb_uri.get_secret_value(), config.database)
    exporter = export.Exporter(
        st, list(config.sinks), cluster=config.cluster, poll=config.poll.total_seconds(),
        stall=config.stall_timeout.total_seconds(),
    )  # fmt: skip
    _until_signalled(exporter, exporter.metrics.registry, config)


def preflight_digests(config: ObjectMonitorConfig, api: kube.ApiClient) -> frozenset[str]:
    """The image digests whose preflight findings the object monitor believes: those configured, or the
    one its own pod runs (faultline's image); empty when it reads no findings."""
    if not config.preflight_findings:
        return frozenset()
    if config.preflight_digests:
        return frozenset(config.preflight_digests)
    if not config.pod_name or not config.pod_namespace:
        raise ConfigError(
            "preflight_findings: set preflight_digests, or pod_name and pod_namespace (POD_NAME, "
            "POD_NAMESPACE) so that the monitor reads its own image's digest"
        )
    pod = kube.pods.read(api, config.pod_namespace, config.pod_name)
    found = {preflight_findings.digest_of(str(s.get("imageID") or ""))
             for s in (pod.get("status") or {}).get("containerStatuses") or []}  # fmt: skip
    found.discard("")
    if not found:
        raise TransientError(
            f"pod {config.pod_namespace}/{config.pod_name} shows no image digest yet", delay=5.0
        )
    return frozenset(found)


Worker = quarantine.QuarantineWorker | drainer.Drainer | remediation.Remediation | janitor.Janitor


class Running(Protocol):
    """A long-running part: threads started by `start`, ended (and joined) by `halt`, its loops' liveness."""

    alive: liveness.Liveness

    def start(self) -> list[threading.Thread]: ...

    def halt(self, timeout: float = ...) -> bool: ...


def _serve_until_signalled(worker: Worker, config: MetricsFields) -> None:
    _until_signalled(worker, worker.metrics.registry, config)


def _until_signalled(part: Running, registry: CollectorRegistry, config: MetricsFields) -> None:
    """Serve the metrics and `/healthz` (the part's liveness), run the part until SIGTERM or SIGINT, then
    stop it in order (inside Kubernetes' default 30 s grace period) and stop serving."""
    server = None
    if config.metrics_port:
        server = serve(config.metrics_port, host=config.metrics_address, registry=registry, health=part.alive)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    part.start()
    stop.wait()
    if not part.halt(HALT_S):
        log.warning("some work still in hand after %.0f s; its leases expire and others take it over", HALT_S)
    if server is not None:
        server.close()
