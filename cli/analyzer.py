"""`faultline analyzer` (the cluster analyzer: a Deployment, one replica active) and
`faultline analyzer replay` (its cluster patterns over a history, for what-if checks)."""

from __future__ import annotations

import inspect
import json
import sys
import threading
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
    m = Metrics()
    if cfg.metrics_port:
        metrics.serve(cfg.metrics_port, host=cfg.metrics_address, registry=m.registry, health=lambda: True)
    stop = threading.Event()
    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    leader = cluster_flow.Leadership(st, owner, cfg.lease)
    try:
        err.print(f"analyzer: {len(packs.patterns)} cluster patterns; waiting for the lease", markup=False)
        if not _acquire(leader, stop):
            return
        m.active.set(1)
        leader.keep(on_lost=stop.set)
        _active(cfg, packs, st, leader, stop, m)
    finally:
        m.active.set(0)
        leader.release()
        st.close()
    if leader.lost.is_set():
        err.print("analyzer: lease lost to another replica: stopped", markup=False)
        raise typer.Exit(1)
    err.print("analyzer: stopped", markup=False)


def _active(
    cfg: config.AnalyzerConfig, packs: ClusterPacks, st: Store, leader: Leadership, stop: threading.Event,
    m: Metrics,
) -> None:  # fmt: skip
    """What the replica holding the lease does: restore the checkpoints, run the flow, prune the feed."""
    from dataflows import cluster as cluster_flow  # noqa: PLC0415
    from dataflows import runner  # noqa: PLC0415
    from faultline import store  # noqa: PLC0415
    from patterns import cluster  # noqa: PLC0415
    from sinks.analyzer import AnalyzerSink  # noqa: PLC0415
    from sources import node_labels  # noqa: PLC0415
    from sources.feed import FeedSource  # noqa: PLC0415

    uri, db = cfg.mongodb_uri.get_secret_value(), cfg.database
    with store.unreachable_is_transient("reading the analyzer's checkpoints"):
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
    source = FeedSource(
        lambda: store.connect(uri, db), marks, labels=labels.get if labels else lambda _n: node_labels.NONE,
        poll=cfg.poll, batch=cfg.batch, stop=stop, on_lost=m.lost.inc, watermark=watermark,
    )  # fmt: skip
    sink = AnalyzerSink(lambda: store.connect(uri, db), leader.owner, guard=leader.holding,
                        on_fault=lambda d: m.derived.labels(pattern=d.pattern).inc())  # fmt: skip
    flow = cluster_flow.build(packs, source, sink, checkpoints=checkpoints,
                              checkpoint_interval=cfg.checkpoint_interval, scores=_scores(cfg))  # fmt: skip
    pruner = threading.Thread(target=_prune, args=(uri, db, cfg, stop), name="feed-prune", daemon=True)
    pruner.start()
    after = sum(marks[0][1].values())
    err.print(f"analyzer: active as {leader.owner}, reading the feed after {after} documents of "
              f"{len(marks[0][1])} writers", markup=False)  # fmt: skip
    try:
        runner.run(flow, workers=cfg.workers, on_stop=stop.set)
    finally:
        stop.set()
        pruner.join()
        if labels is not None:
            labels.close()


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
