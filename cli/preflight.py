"""`faultline webhook` and `faultline preflight`: the composition roots of preflight (registered in
`cli.app`). The webhook serves `workers.webhook`; the init container wires the checks
(`sources.preflight`, on the GPU backend and the kernel log), the gang (`workers.gang`) and the report
(`sources.ingest_client`) into `workers.preflight.run`, writes the reason to the termination log and
exits 0 (passed) or 1 (failed)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from faultline import config

if TYPE_CHECKING:
    from faultline.preflight import Finding
    from sources.gpu import GpuBackend

log = logging.getLogger(__name__)
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)
AGENT = "faultline-preflight"  # the monitor's name in the health events it reports


def webhook(cfg: config.WebhookConfig) -> None:
    """Serve the preflight admission webhook (HTTPS, AdmissionReview v1): pods requesting nvidia.com/gpu in
    namespaces labelled faultline.io/preflight=enabled get the `faultline preflight` init container."""
    from faultline.kube import lite  # noqa: PLC0415
    from workers import preflight_inject, webhook_certs  # noqa: PLC0415
    from workers import webhook as server  # noqa: PLC0415

    client = lite.Client.connect(cfg.kubeconfig)
    settings = preflight_inject.InjectSettings(
        image=cfg.image,
        pull_policy=cfg.image_pull_policy,
        checks=cfg.checks,
        gang_keys=cfg.gang_keys,
        gang_size_keys=cfg.gang_size_keys,
        gang_round_keys=cfg.gang_round_keys,
        ingest_socket=cfg.ingest_socket,
        journal_dirs=cfg.journal_dirs,
        sim_dir=cfg.sim_dir,
        env=cfg.preflight_settings,
        resources=cfg.init_resources,
        image_pull_secrets=cfg.image_pull_secrets,
    )
    if cfg.tls_source == "files":
        assert cfg.tls_cert is not None  # the model insists on both
        assert cfg.tls_key is not None
        certificates = server.Certificates(files=(cfg.tls_cert, cfg.tls_key))
    else:
        validity = webhook_certs.Validity(cfg.ca_validity, cfg.cert_validity, cfg.rotate_before)
        keeper = webhook_certs.Keeper(
            client,
            namespace=cfg.namespace,
            secret=cfg.tls_secret,
            webhook_config=cfg.webhook_config or None,
            hosts=webhook_certs.service_hosts(cfg.service, cfg.namespace, cfg.hosts),
            validity=validity,
        )
        certificates = server.Certificates(keeper=keeper)
    stop = threading.Event()
    labels = server.NamespaceLabels(client, cfg.namespace_ttl)
    stall = cfg.stall_timeout.total_seconds()
    running = server.serve(
        (cfg.address, cfg.port),
        settings,
        labels,
        certificates,
        check_interval=cfg.check_interval,
        stall=stall,
        max_concurrent=cfg.max_concurrent,
    )
    metrics_server = None
    if cfg.metrics_port:
        from faultline import metrics  # noqa: PLC0415

        metrics_server = metrics.serve(
            cfg.metrics_port, host=cfg.metrics_address, health=running.alive, registry=server.REGISTRY
        )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    err.print(f"webhook: serving https://{cfg.address}:{running.server_address[1]}/mutate", markup=False)
    stop.wait()
    running.close()
    if metrics_server is not None:
        metrics_server.close()
    err.print("webhook: stopped", markup=False)


def preflight(cfg: config.PreflightConfig) -> None:
    """Check this pod's GPUs before its containers start (the init container the webhook injects): exit 0
    when they pass (and the pod's gang all passed), 1 with the reason in the termination log otherwise."""
    from workers import gang as gangs  # noqa: PLC0415
    from workers import gang_lease  # noqa: PLC0415
    from workers import preflight as run  # noqa: PLC0415

    backends: list[GpuBackend] = []

    def gpus() -> GpuBackend:
        if not backends:
            backends.append(_backend(cfg))
        return backends[0]

    def checks() -> list[Finding]:
        # all made on the checks' thread: a GPU library or pack that fails to load is a checker error (a
        # warning, or a failure with fail_on_error), one that hangs is PREFLIGHT-HUNG; never a traceback
        return _checks(cfg, gpus)()

    link = None
    if cfg.gang:
        from faultline import bounds  # noqa: PLC0415
        from faultline.errors import ConfigError  # noqa: PLC0415
        from faultline.kube import lite  # noqa: PLC0415

        try:
            client = lite.Client.connect(cfg.kubeconfig)
        except ConfigError as exc:  # no credentials to reach the gang's Lease: check alone, as without RBAC
            error = bounds.clip(str(exc), bounds.ERROR_TEXT)
            log.warning("preflight gang record unavailable; checking alone", extra={"error": error})
        else:
            link = gang_lease.GangLink(
                client,
                cfg.namespace,
                gangs.Gang(cfg.gang, cfg.gang_size),
                pod=cfg.pod,
                node=cfg.node,
                failure_hold=cfg.gang_failure_hold,
            )
    poll = max(cfg.gang_poll, (cfg.gang_size or 0) / 50)
    settings = run.Settings(
        check_timeout=cfg.check_timeout,
        gang_timeout=cfg.gang_timeout,
        gang_timeout_action=cfg.gang_timeout_action,
        gang_poll=poll,
        fail_on_error=cfg.fail_on_error,
    )
    outcome = run.run(checks, settings=settings, gang=link, report=_reporter(cfg))
    if outcome.code == 0:
        if outcome.warning:  # the checks could not run; the pod proceeds: say so where people look
            err.print(outcome.warning, markup=False)
            _terminate(cfg.termination_log, outcome.warning)
        else:
            err.print(f"preflight: passed ({', '.join(cfg.checks)})", markup=False)
        with contextlib.suppress(Exception):
            for backend in backends:
                backend.close()
        raise typer.Exit(0)
    err.print(outcome.reason, markup=False)
    _terminate(cfg.termination_log, outcome.reason)
    sys.stderr.flush()
    os._exit(1)  # a check may still hang in a driver call on its thread: leave without waiting for it


def _backend(cfg: config.PreflightConfig) -> GpuBackend:
    if cfg.gpu_backend == "sim":
        from sources import simulator  # noqa: PLC0415

        return simulator.SimulatorBackend(cfg.node, directory=cfg.sim_dir, gpus=cfg.gpus)
    from sources.nvml import NvmlBackend  # noqa: PLC0415

    return NvmlBackend()


def _checks(cfg: config.PreflightConfig, gpus: Callable[[], GpuBackend]) -> Callable[[], list[Finding]]:
    from sources import preflight as checks  # noqa: PLC0415

    expect = checks.Expect(
        cfg.checks,
        gpus=cfg.expected_gpus,
        model=cfg.expected_model,
        pcie_generation=cfg.pcie_generation,
        nvlink_min_active=cfg.nvlink_min_active,
        xid_min_action=cfg.xid_min_action,
    )
    kernel = None
    compiled = None
    if "xid" in cfg.checks:
        from patterns import compiler, loader  # noqa: PLC0415
        from sources import gpu, simulator  # noqa: PLC0415

        compiled = compiler.compile_packs(loader.load([]), check_examples=False)

        def kernel() -> list[tuple[str, str, bool]]:
            lines: list[tuple[str, str, bool]] = []
            for directory in cfg.journal_dirs:
                if directory.is_dir() and any(directory.iterdir()):  # a host keeps one of the two
                    lines += checks.journal_lines(directory=directory)
            if cfg.kmsg is not None:
                lines += checks.kmsg_lines(cfg.kmsg)
            backend = gpus()
            if isinstance(backend, simulator.SimulatorBackend):  # the simulated boot's kernel log
                devices = {d.index: d for d in backend.devices()}
                rendered = (gpu.message(e, devices.get(e.gpu)) for e in backend.history())
                lines += [("nvml", text, True) for text in rendered if text is not None]
            return lines

    diagnose = None
    if "dcgm" in cfg.checks and cfg.dcgm_diag_level and cfg.dcgm_host:
        from sources import dcgm  # noqa: PLC0415

        def diagnose(uuids: list[str]) -> dcgm.Diagnosis:
            found = dcgm.diagnose(cfg.dcgm_host, cfg.dcgm_diag_level, uuids)
            if found.note:
                log.warning("preflight dcgm diagnostics concluded nothing", extra={"reason": found.note})
            return found

    def run_checks() -> list[Finding]:
        return checks.evaluate(
            checks.read(gpus(), expect, kernel_lines=kernel, compiled=compiled, diagnose=diagnose), expect
        )

    return run_checks


def _reporter(cfg: config.PreflightConfig) -> Callable[[list[Finding]], int] | None:
    socket = cfg.ingest_socket
    if socket is None:
        return None

    def report(findings: list[Finding]) -> int:
        from sources import ingest_client  # noqa: PLC0415

        events = [
            ingest_client.Event(
                code=f.code,
                message=f.message,
                component="GPU" if f.gpu else "NODE",
                entity=("GPU", f.gpu) if f.gpu else None,
                fatal=True,
                action=f.action.value,
                metadata={"check": f.check, "pod": cfg.pod, "namespace": cfg.namespace},
            )
            for f in findings
        ]
        return ingest_client.report(socket, cfg.node, events, agent=AGENT, check="preflight")

    return report


def _terminate(path: Path, text: str) -> None:
    """The reason where the kubelet reads it for the pod's status (lastState.terminated.message)."""
    try:
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        err.print(f"preflight: cannot write the termination log {path}: {exc}", markup=False)
