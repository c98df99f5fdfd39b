"""`faultline analyzer` (the cluster analyzer: a Deployment, one replica active) and
`faultline analyzer replay` (its cluster patterns over a history, for what-if checks)."""

from __future__ import annotations

import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from prometheus_client import CollectorRegistry, Counter, Gauge
from rich.console import Console
from rich.table import Table

from cli import options, settings
from faultline import config
from faultline.errors import ConfigError, FaultlineError

if TYPE_CHECKING:
    from dataflows.cluster import Leadership
    from faultline.store import Store
    from patterns.cluster import ClusterPacks

app = typer.Typer(
    help="The cluster analyzer: cluster-scope pattern packs over every node's events (`faultline analyzer "
    "[OPTIONS]` runs it; `replay` runs its patterns over a history).",
    invoke_without_command=True,
    no_args_is_help=False,
)
out = Console(highlight=False, soft_wrap=True, emoji=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)
PRUNE_EVERY_S = 60.0  # between deletions of feed documents the analyzer has read
PROCESS_ENV = "FAULTLINE_ANALYZER_PROCESS"  # "<id> <pid of process 0> <host:port,...>": a helper process
CHUNKS_PER_WORKER = 4  # chunks a feed read is cut into, per worker (they go to workers at random)


def _callback(ctx: typer.Context, **values: Any) -> None:
    if ctx.invoked_subcommand is not None:
        return
    config_file = values.pop("config", None)
    flags = options.flags_given(config.AnalyzerConfig, values)
    resolved = settings.resolve(config.AnalyzerConfig, config_file=config_file, flags=flags)
    run(resolved.config)  # type: ignore[arg-type]  # resolve returns the model it was given


_callback.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
    *options.parameters(config.AnalyzerConfig),
])  # fmt: skip
_callback.__doc__ = config.AnalyzerConfig.__doc__
app.callback()(_callback)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.active = Gauge("faultline_analyzer_active", "1 while this replica holds the analyzer's lease",
                            registry=self.registry)  # fmt: skip
        self.derived = Counter("faultline_analyzer_derived_faults", "Derived fault writes that applied",
                               ["pattern"], registry=self.registry)  # fmt: skip
        self.lost = Counter("faultline_analyzer_feed_lost", "Feed documents pruned before the analyzer read "
                            "them", registry=self.registry)  # fmt: skip


def run(cfg: config.AnalyzerConfig) -> None:
    """Take the analyzer's lease (waiting while another replica holds it), then run the dataflow until a
    signal, or until the lease is lost (exit 1: the replica starts again as a standby)."""
    from dataflows import cluster as cluster_flow  # noqa: PLC0415 - keep `--help` fast
    from faultline import metrics, store  # noqa: PLC0415
    from patterns import cluster  # noqa: PLC0415
    from workers import common  # noqa: PLC0415

    packs = cluster.load(cfg.packs, builtin=cfg.builtin)
    if not packs.patterns and not cfg.anomaly:
        raise ConfigError("no cluster patterns loaded (scope: cluster in the packs)")
    _scores(cfg)  # river missing: said before the lease is taken
    owner = cfg.owner or common.default_owner("analyzer")
    if os.environ.get(PROCESS_ENV):
        _helper(cfg, packs, owner, os.environ[PROCESS_ENV])
        return
    m = Metrics()
    if cfg.metrics_port:
        metrics.serve(cfg.metrics_port, host=cfg.metrics_address, registry=m.registry, health=lambda: True)
    stop = threading.Event()
    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    leader = cluster_flow.Leadership(st, owner, cfg.lease)
    helpers = Helpers(cfg.processes)

    def lost() -> None:
        stop.set()
        helpers.signal()  # their output is dropped from now on, as this process's is

    try:
        err.print(f"analyzer: {len(packs.patterns)} cluster patterns; waiting for the lease", markup=False)
        if not _acquire(leader, stop):
            return
        m.active.set(1)
        leader.keep(on_lost=lost)
        try:
            _active(cfg, packs, st, leader, stop, m, helpers)
        except BaseException:  # Bytewax panics (a BaseException) when a process of its cluster is gone
            failed = helpers.failed()
            if failed is None:
                raise
            err.print(f"analyzer: {failed}: stopping", markup=False)
            raise typer.Exit(1) from None
    finally:
        m.active.set(0)
        helpers.stop()
        leader.release()
        st.close()
    if leader.lost.is_set():
        err.print("analyzer: lease lost to another replica: stopped", markup=False)
        raise typer.Exit(1)
    err.print("analyzer: stopped", markup=False)


def _active(
    cfg: config.AnalyzerConfig, packs: ClusterPacks, st: Store, leader: Leadership, stop: threading.Event,
    m: Metrics, helpers: Helpers,
) -> None:  # fmt: skip
    """What the replica holding the lease does: restore the checkpoints, run the flow (with its helper
    processes), prune the feed."""
    from dataflows import runner  # noqa: PLC0415

    uri, db = cfg.mongodb_uri.get_secret_value(), cfg.database
    flow, labels, after = _flow(cfg, packs, st, stop, reader=True, owner=leader.owner, guard=leader.holding,
                                on_fault=lambda d: m.derived.labels(pattern=d.pattern).inc(),
                                on_lost=m.lost.inc)  # fmt: skip
    pruner = threading.Thread(target=_prune, args=(uri, db, cfg, stop), name="feed-prune", daemon=True)
    pruner.start()
    err.print(f"analyzer: active as {leader.owner}, reading the feed after {sum(after.values())} documents "
              f"of {len(after)} writers", markup=False)  # fmt: skip
    try:
        helpers.start()
        runner.run(flow, workers=cfg.workers, on_stop=stop.set, process_id=0 if helpers.addresses else None,
                   addresses=helpers.addresses or None)  # fmt: skip
    finally:
        stop.set()
        pruner.join()
        if labels is not None:
            labels.close()


def _flow(
    cfg: config.AnalyzerConfig, packs: ClusterPacks, st: Store, stop: threading.Event, *, reader: bool,
    owner: str, guard: Callable[[], bool], on_fault: Callable[[Any], None] = lambda _d: None,
    on_lost: Callable[[int], None] = lambda _n: None,
) -> tuple[Any, Any, dict[str, int]]:  # fmt: skip
    """The flow every process of the active replica runs (the same in each: Bytewax's cluster mode),
    from the checkpoints in the store; `reader`: this process reads the feed. Returns the flow, the node
    labels' reader (None: off; close it after) and the feed position reading starts after."""
    from dataflows import cluster as cluster_flow  # noqa: PLC0415
    from faultline import store  # noqa: PLC0415
    from patterns import cluster  # noqa: PLC0415
    from sinks.analyzer import AnalyzerSink  # noqa: PLC0415
    from sources import node_labels  # noqa: PLC0415
    from sources.feed import FeedSource  # noqa: PLC0415

    uri, db = cfg.mongodb_uri.get_secret_value(), cfg.database
    with store.unreachable_is_transient("reading the analyzer's checkpoints"):
        if reader:
            st.ensure_indexes()
        checkpoints = st.analyzer_checkpoints()
        marks = st.analyzer_positions(cluster.PARTITIONS)
    labels = None
    if cfg.node_labels:
        kubeconfig = str(cfg.kubeconfig) if cfg.kubeconfig else None
        labels = node_labels.NodeLabels(node_labels.from_api(kubeconfig), cfg.labels_refresh.total_seconds())
        labels.start()
    # the feed's watermark where reading starts: that of the partitions furthest behind (every partition
    # gets every tick, so theirs is the source's at that position)
    behind = [
        s for p, s in checkpoints.items() if p < cluster.PARTITIONS and int(s.get("upto") or 0) == marks[0][0]
    ]
    watermark = max((float(s["watermark"]) for s in behind if s.get("watermark") is not None),
                    default=float("-inf"))  # fmt: skip
    workers = cfg.workers * cfg.processes
    source = FeedSource(
        lambda: store.connect(uri, db), marks, poll=cfg.poll, batch=cfg.batch, stop=stop, on_lost=on_lost,
        watermark=watermark, reader=reader, chunks=1 if workers == 1 else workers * CHUNKS_PER_WORKER,
    )  # fmt: skip
    sink = AnalyzerSink(lambda: store.connect(uri, db), owner, guard=guard, on_fault=on_fault)
    flow = cluster_flow.build(packs, source, sink, checkpoints=checkpoints,
                              checkpoint_interval=cfg.checkpoint_interval, scores=_scores(cfg),
                              labels=labels.get if labels else lambda _n: node_labels.NONE)  # fmt: skip
    return flow, labels, marks[0][1]


class Helpers:
    """The active replica's other processes (setting `processes`): each runs `faultline analyzer` again
    (the same command line) as process i of a Bytewax cluster on this machine, with `PROCESS_ENV` set.
    They hold no lease: process 0 does, reads the feed, and signals them when it loses the lease (their
    output is dropped from then on); if it dies they stop, and if one of them fails process 0 stops
    (exit 1) rather than wait for it: the replica starts again from the checkpoints."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self.addresses: list[str] = []
        self.popen: list[subprocess.Popen[bytes]] = []
        self._done = threading.Event()

    def start(self) -> None:
        if self.processes < 2:
            return
        self.addresses = [f"127.0.0.1:{_free_port()}" for _ in range(self.processes)]
        command = [sys.executable, *sys.orig_argv[1:]]  # as this process was started
        for i in range(1, self.processes):
            env = {**os.environ, PROCESS_ENV: f"{i} {os.getpid()} {','.join(self.addresses)}"}
            self.popen.append(subprocess.Popen(command, env=env))  # noqa: S603 - this program, again
        threading.Thread(target=self._watch, name="analyzer-helpers", daemon=True).start()

    def _watch(self) -> None:
        while not self._done.wait(0.5):
            failed = self.failed(wait=0)
            if failed is not None and not self._done.is_set():
                err.print(f"analyzer: {failed}: stopping", markup=False)
                os._exit(1)  # the cluster cannot go on without it, nor end in order

    def failed(self, wait: float = 2.0) -> str | None:
        """Which process exited with an error (waiting up to `wait` s for one to be seen), or None."""
        deadline = time.monotonic() + wait
        while True:
            for i, p in enumerate(self.popen, start=1):
                if p.poll() not in (None, 0):
                    return f"process {i} of {self.processes} exited with {p.returncode}"
            if not self.popen or time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def signal(self) -> None:
        for p in self.popen:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        """After the flow ended (they end with it): wait for them, then kill what is left."""
        self._done.set()
        for p in self.popen:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _helper(cfg: config.AnalyzerConfig, packs: ClusterPacks, owner: str, spec: str) -> None:
    """Process i (> 0) of the active replica: the same flow without the reader, until it ends (process
    0 ends it) or process 0 is gone; its output is dropped once it is signalled (the lease lost)."""
    from dataflows import runner  # noqa: PLC0415
    from faultline import store  # noqa: PLC0415

    index, parent, addresses = spec.split(" ")
    stop = threading.Event()

    def orphaned() -> None:
        while not stop.wait(1.0):
            if os.getppid() != int(parent):
                err.print(f"analyzer: process {index}: process 0 is gone: stopping", markup=False)
                os._exit(1)

    threading.Thread(target=orphaned, name="analyzer-parent", daemon=True).start()
    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    try:
        flow, labels, _after = _flow(cfg, packs, st, stop, reader=False, owner=owner,
                                     guard=lambda: not stop.is_set())  # fmt: skip
        err.print(f"analyzer: process {index} of {len(addresses.split(','))} of {owner} joining",
                  markup=False)  # fmt: skip
        try:
            runner.run(flow, workers=cfg.workers, on_stop=stop.set, process_id=int(index),
                       addresses=addresses.split(","))  # fmt: skip
        finally:
            stop.set()
            if labels is not None:
                labels.close()
    finally:
        st.close()


def _scores(cfg: config.AnalyzerConfig) -> Any:
    """The anomaly scores' settings (None: off); river is imported here, so its absence is named at once."""
    if not cfg.anomaly:
        return None
    from patterns import anomaly  # noqa: PLC0415

    anomaly.river_stats()
    return anomaly.Settings(cfg.anomaly_fields, cfg.anomaly_warmup, cfg.anomaly_expire.total_seconds())


def _acquire(leader: Leadership, stop: threading.Event) -> bool:
    """Wait for the lease; SIGTERM or SIGINT while waiting ends the wait."""
    import signal  # noqa: PLC0415

    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return bool(leader.acquire(stop))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _prune(uri: str, db: str, cfg: config.AnalyzerConfig, stop: threading.Event) -> None:
    """Delete feed documents the analyzer has read once older than `feed_keep`, every PRUNE_EVERY_S."""
    from faultline import store  # noqa: PLC0415
    from patterns import cluster  # noqa: PLC0415

    st = store.connect(uri, db)
    try:
        while not stop.wait(PRUNE_EVERY_S):
            try:
                with store.unreachable_is_transient("pruning the feed"):
                    st.prune_feed(cfg.feed_keep, read_up_to=st.analyzer_position(cluster.PARTITIONS))
            except FaultlineError as exc:
                err.print(f"analyzer: feed not pruned: {exc}", markup=False)
    finally:
        st.close()


@app.command("replay")
def replay(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Event histories: JSON lines (or a JSON array) of "
            "health events as stored, e.g. mongoexport's."
        ),
    ],
    pack: Annotated[
        list[Path] | None, typer.Option("--pack", help="Extra pack directory or file (repeatable).")
    ] = None,
    builtin: Annotated[bool, typer.Option(help="Run the built-in cluster patterns too.")] = True,
    labels: Annotated[
        Path | None,
        typer.Option(
            help="Node labels: a JSON object {node: {label: value}} (kubectl get nodes -o json also works)."
        ),
    ] = None,
    output: Annotated[str, typer.Option(help="table for people, jsonl for machines.")] = "table",
) -> None:
    """Run the cluster patterns over an exported history of health events and print the faults they would
    derive (nothing is written)."""
    from patterns import cluster  # noqa: PLC0415
    from sources import history  # noqa: PLC0415

    if output not in ("table", "jsonl"):
        raise typer.BadParameter("table or jsonl", param_hint="--output")
    packs = cluster.load(pack or [], builtin=builtin)
    node_labels = history.read_labels(labels) if labels else {}
    records = history.read_events(paths, node_labels)
    derived = cluster.replay(packs, records)
    latest: dict[str, Any] = {}
    for d in derived:  # the store would keep each fault's newest write
        latest[d.fault().id] = d
    if output == "jsonl":
        for d in latest.values():
            f = d.fault()
            sys.stdout.write(json.dumps({
                "node": f.node, "entity": {"type": f.entity.type, "id": f.entity.id}, "code": f.code,
                "fatal": f.fatal, "action": f.action.value, "count": f.count,
                "first_seen": f.first_seen.isoformat(), "last_seen": f.last_seen.isoformat(),
                "pattern": d.pattern, "records": list(d.records),
            }) + "\n")  # fmt: skip
        err.print(f"{len(records)} records, {len(latest)} derived faults", markup=False)
        return
    table = Table("node", "entity", "code", "fatal", "action", "count", "last seen", "pattern")
    for d in latest.values():
        f = d.fault()
        table.add_row(f.node, f"{f.entity.type} {f.entity.id}", f.code, str(f.fatal), f.action.value,
                      str(f.count), f"{f.last_seen:%Y-%m-%d %H:%M:%S}Z", d.pattern)  # fmt: skip
    out.print(table)
    out.print(f"{len(records)} records, {len(latest)} derived faults", markup=False)
