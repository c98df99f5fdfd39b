"""`faultline agent`: the node agent's composition root, and its start without the CLI framework.

`cli.main` runs `faultline agent ...` through `main` here: flags read by `cli.flags` from the settings model
(the same flags as the full command line's), logging configured from `FAULTLINE_LOG_FORMAT` and
`FAULTLINE_LOG_LEVEL`, and no typer, click, rich or `cryptography` loaded (the agent signs through the
interpreter's libcrypto: `faultline.ed25519`). `faultline agent --help`, and global options before the
command (`faultline --log-level debug agent`), go through the full command line (`cli.app`), which ends
here too.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from cli import flags
from faultline import config, logs
from faultline.errors import ConfigError

if TYPE_CHECKING:
    from bytewax.recovery import RecoveryConfig

    from faultline.store import Store
    from patterns.compiler import CompiledPacks
    from sources import scheduled_events
    from sources.gpu import GpuBackend
    from sources.ingest import IngestSpool
    from sources.inputs import LogInput

GRPC_GRACE_S = 2.0  # a stopping agent lets the gRPC calls in progress finish this long
log = logging.getLogger("faultline.agent")


def main(args: Sequence[str]) -> None:
    """`faultline agent ARGS`: the environment's log options, the flags, then the agent."""
    fmt, level = (
        os.environ.get("FAULTLINE_LOG_FORMAT") or None,
        os.environ.get("FAULTLINE_LOG_LEVEL") or "info",
    )
    if fmt is not None and fmt not in get_args(logs.Format):
        raise ConfigError(f"FAULTLINE_LOG_FORMAT: {fmt!r} is not one of {', '.join(get_args(logs.Format))}")
    if level not in get_args(logs.Level):
        raise ConfigError(f"FAULTLINE_LOG_LEVEL: {level!r} is not one of {', '.join(get_args(logs.Level))}")
    logs.configure(fmt, level)  # type: ignore[arg-type]  # checked just above
    resolved = flags.resolve(config.AgentConfig, "agent", args)
    log.debug("settings", extra={"component": "agent", **flags.summary(resolved)})
    run(resolved.config)  # type: ignore[arg-type]  # resolve returns the model it was given


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def run(config: config.AgentConfig) -> None:
    """The agent's composition root: every part it opens is entered on one stack, closed in reverse
    order when the flow ends (however it ends); one store client for the whole process."""
    from dataflows import node as node_flow  # noqa: PLC0415
    from dataflows import runner  # noqa: PLC0415
    from faultline import evidence  # noqa: PLC0415
    from patterns import compiler, loader  # noqa: PLC0415
    from sinks.kube import KubeSink  # noqa: PLC0415
    from sinks.mongo import MongoSink, agent_store  # noqa: PLC0415
    from sources import ingest  # noqa: PLC0415
    from sources.gpu_source import GpuPolling  # noqa: PLC0415
    from sources.inputs import LogInput  # noqa: PLC0415
    from sources.repairs import from_store as repair_notices  # noqa: PLC0415

    compiled = compiler.compile_packs(loader.load(list(config.packs), builtin=True), check_examples=True)
    backend = _gpu_backend(config)
    gpu_names = {d.pci: f"GPU {d.index} {d.uuid}" for d in backend.devices()}
    key = evidence.NodeKey.load_or_create(config.state_dir, config.node)  # signs its faults
    with contextlib.ExitStack() as parts:
        st = agent_store(config.mongodb_uri.get_secret_value(), config.database)  # the process's one client
        st.signer = key
        parts.callback(st.close)
        sinks = {
            node_flow.STEP_MONGO: MongoSink(
                config.mongodb_uri.get_secret_value(),
                config.database,
                spool=config.state_dir / "mongo-spool",  # takes in an older agent's mongo-spool.jsonl
                spool_max_bytes=config.spool_max_bytes,
                feed=config.analyzer_feed,
                shared=st,
            ),
            node_flow.STEP_KUBE: KubeSink(
                config.kubeconfig, gpu_names, annotations={evidence.KEY_ANNOTATION: key.public}
            ),
        }
        polling = GpuPolling(config.gpu_poll_interval, config.gpu_hung_after, config.gpu_unresponsive_after,
                             config.repair_poll_interval, config.health_samples,
                             repair_idle_interval=config.repair_idle_poll_interval)  # fmt: skip
        logs = _log_inputs(config, compiled)
        spool = None
        if config.ingest_socket or config.ingest_tcp or config.nvsentinel_socket:
            spool = ingest.IngestSpool(config.state_dir / "ingest")
            logs.append(LogInput("grpc", "grpc", ingest.IngestSource(spool)))
        stop = threading.Event()  # set by SIGTERM: the flow ends in order (see dataflows.runner)
        gpu_source = "dcgm" if config.gpu_backend == "dcgm" else "nvml"
        flow = node_flow.build(
            config.node, backend, compiled, sinks, logs=logs, polling=polling, gpu_source=gpu_source,
            stop=stop, repairs=repair_notices(st, config.node),
        )  # fmt: skip
        if config.metrics_port:
            from faultline import metrics  # noqa: PLC0415

            silence = config.stall_timeout.total_seconds()  # the dataflow's heartbeat (sources wake it)
            server = metrics.serve(config.metrics_port, host=config.metrics_address,
                                   health=lambda: metrics.healthy(silence))  # fmt: skip
            parts.callback(server.close)
        recovery = _recovery(config.state_dir / "recovery")
        if spool is not None:
            _ingest_servers(config, spool, parts)
        _node_links(config, backend, st, parts)
        _say(f"agent: watching {len(gpu_names)} GPUs on {config.node}")
        epoch = dt.timedelta(seconds=config.snapshot_interval)
        if runner.run(flow, epoch_interval=epoch, recovery=recovery, on_stop=lambda: _stop_inputs(stop)):
            _say("agent: stopped by signal")


def _gpu_backend(config: config.AgentConfig) -> GpuBackend:
    if config.gpu_backend == "nvml":
        from sources.nvml import NvmlBackend  # noqa: PLC0415

        return NvmlBackend()
    if config.gpu_backend == "dcgm":
        from sources.dcgm import DcgmBackend  # noqa: PLC0415

        return DcgmBackend(config.dcgm_host)
    from sources import simulator  # noqa: PLC0415

    scenario = simulator.load_scenario(config.sim_scenario) if config.sim_scenario else None
    return simulator.SimulatorBackend(
        config.node, directory=config.sim_dir, gpus=config.gpus, scenario=scenario
    )


def _ingest_servers(config: config.AgentConfig, spool: IngestSpool, parts: contextlib.ExitStack) -> None:
    """The gRPC servers that are switched on (faultline's ingest API; NVSentinel's), stopped on `parts`."""
    if config.ingest_socket or config.ingest_tcp:
        from sources import ingest_server  # noqa: PLC0415 - grpc only when ingest is on

        tls = None
        if config.ingest_tls_cert and config.ingest_tls_key and config.ingest_tls_client_ca:
            tls = ingest_server.TlsFiles(
                config.ingest_tls_cert, config.ingest_tls_key, config.ingest_tls_client_ca
            )
        server = ingest_server.serve(
            config.node, spool, socket=config.ingest_socket, tcp=config.ingest_tcp, tls=tls
        )
        parts.callback(lambda: server.stop(grace=GRPC_GRACE_S).wait())
    if config.nvsentinel_socket is not None:
        from sources import nvsentinel_server  # noqa: PLC0415 - grpc only when it is on

        nvsentinel = nvsentinel_server.serve(config.node, spool, config.nvsentinel_socket)
        parts.callback(lambda: nvsentinel.stop(grace=GRPC_GRACE_S).wait())


def _node_links(
    config: config.AgentConfig, backend: GpuBackend, st: Store, parts: contextlib.ExitStack
) -> None:
    """The pollers that are switched on (GPU pods for partial drains; Azure's Scheduled Events, which
    only the node can read), started now and closed on `parts`."""
    if config.pod_resources_socket is not None:
        from sources import pod_resources  # noqa: PLC0415 - grpc only when it is on

        socket = config.pod_resources_socket
        gpu_pods = pod_resources.GpuPodsWatch(
            config.node, backend.devices(), lambda: pod_resources.list_devices(socket),
            pod_resources.store_link(st, config.node), interval=config.pod_resources_interval,
        )  # fmt: skip
        gpu_pods.start()
        parts.callback(gpu_pods.close)
    if config.scheduled_events:
        relay = _scheduled_events(config, st)
        relay.start()
        parts.callback(relay.close)
    stop = threading.Event()
    thread = threading.Thread(target=_record_gpus, args=(config.node, backend, st, stop), name="gpu-identity",
                              daemon=True)  # fmt: skip
    thread.start()
    parts.callback(stop.set)
    from sources import bug_reports  # noqa: PLC0415

    uploader = bug_reports.Uploader(st, config.node, config.state_dir / "bug-reports")
    uploader.start()
    parts.callback(uploader.close)


GPU_IDENTITY_EVERY_S = 6 * 3600.0  # between the agent's records of its GPUs' identity (a driver upgrade)
GPU_IDENTITY_RETRY_S = 60.0  # after a record that failed (the store away, the driver busy)


def _record_gpus(node: str, backend: GpuBackend, st: Store, stop: threading.Event) -> None:
    """Record what each GPU is (UUID, serial, model, VBIOS, driver) in the store at start and every few
    hours, on a thread of its own (a driver call may hang): reports and RMA bundles name GPUs by it."""
    import logging  # noqa: PLC0415

    log = logging.getLogger("faultline.agent")
    while True:
        wait = GPU_IDENTITY_EVERY_S
        try:
            info = backend.inventory()
            gpus = [{"pci": d.pci, "index": d.index, "uuid": d.uuid, "serial": g.serial, "model": g.model,
                     "vbios": g.vbios, "driver": g.driver}
                    for d in backend.devices() if (g := info.get(d.index)) is not None]  # fmt: skip
            st.record_gpus(node, gpus, st.now())
        except Exception as exc:  # noqa: BLE001 - a record for reports, never a reason to stop the agent
            log.warning("recording the GPUs' identity failed: %s", exc, extra={"node": node})
            wait = GPU_IDENTITY_RETRY_S
        if stop.wait(wait):
            return


def _scheduled_events(config: config.AgentConfig, st: Store) -> scheduled_events.Relay:
    from faultline.kube import lite  # noqa: PLC0415
    from sources import scheduled_events  # noqa: PLC0415

    def provider_id() -> str:
        client = lite.Client.connect(config.kubeconfig)
        try:
            node = lite.read_node_status(client, config.node)  # the whole Node, spec included
        finally:
            client.close()
        return str((node.get("spec") or {}).get("providerID", ""))

    link = scheduled_events.store_link(st, config.node)
    return scheduled_events.Relay(config.node, scheduled_events.Imds(config.imds_endpoint), link, provider_id,
                                  interval=config.scheduled_events_interval)  # fmt: skip


def _stop_inputs(stop: threading.Event) -> None:
    from sources import wake  # noqa: PLC0415

    stop.set()
    wake.notify()  # the inputs' partition is asleep in wake.wait: let it see the stop now


def _recovery(directory: Path) -> RecoveryConfig:
    """The agent's Bytewax recovery store (one partition: the agent runs one worker), created on first
    start. A restarted agent resumes every source after its last snapshot with the detector's state."""
    from bytewax.recovery import RecoveryConfig, init_db_dir  # noqa: PLC0415

    if not any(directory.glob("part-*.sqlite3")):
        directory.mkdir(parents=True, exist_ok=True)
        init_db_dir(directory, 1)  # type: ignore[no-untyped-call]
    return RecoveryConfig(str(directory))  # type: ignore[no-untyped-call]


def _log_inputs(config: config.AgentConfig, compiled: CompiledPacks) -> list[LogInput]:
    from sources.follow import LogFollowSource  # noqa: PLC0415
    from sources.inputs import LogInput  # noqa: PLC0415
    from sources.journal import JournalSource  # noqa: PLC0415

    logs = []
    if config.journal_file or config.journal_dir:
        journal = JournalSource(file=config.journal_file, directory=config.journal_dir, prefilter=compiled)
        logs.append(LogInput("journal", "journal", journal))
    if config.syslog_file:
        follow = LogFollowSource("syslog", config.syslog_file, syslog_trusted=config.syslog_trusted)
        logs.append(LogInput("syslog", "syslog", follow))
    if config.kmsg:
        logs.append(LogInput("kmsg", "kmsg", LogFollowSource("kmsg", config.kmsg)))
    if config.sysfs_root:
        from sources.nic import NicSource  # noqa: PLC0415

        logs.append(LogInput("nic", "nic", NicSource(config.sysfs_root, interval=config.nic_interval)))
    return logs
