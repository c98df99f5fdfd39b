"""`faultline analyzer` (the cluster analyzer: a Deployment, one replica active, or a StatefulSet whose
pods are one Bytewax cluster) and
`faultline analyzer replay` (its cluster patterns over a history, for what-if checks)."""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from cli import analyzer_processes, flags, options, settings
from dataflows import analyzer_metrics
from faultline import config, liveness
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
CHUNKS_PER_WORKER = 4  # chunks a feed read is cut into, per worker (they go to workers at random)
STANDBY_LOOP, LEASE_LOOP, FEED_LOOP = "standby", "analyzer-lease", "feed"  # the replica's loops (liveness)
LEADER_LOOP = "pod-0"  # a member pod's wait for pod 0 (liveness)
OTHER_SETTINGS_S = 600.0  # how long a member pod waits while pod 0 runs other settings, then starts again
STOP_GRACE_S = 20.0  # how long pod 0's flow may take to end after SIGTERM (the pod's grace period is 30 s)


def _callback(ctx: typer.Context, **values: Any) -> None:
    if ctx.invoked_subcommand is not None:
        return
    config_file = values.pop("config", None)
    given = flags.flags_given(config.AnalyzerConfig, values)
    resolved = settings.resolve(config.AnalyzerConfig, config_file=config_file, flags=given)
    run(resolved.config)  # type: ignore[arg-type]  # resolve returns the model it was given


_callback.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
    *options.parameters(config.AnalyzerConfig),
])  # fmt: skip
_callback.__doc__ = config.AnalyzerConfig.__doc__
app.callback()(_callback)


def run(cfg: config.AnalyzerConfig) -> None:
    """Take the analyzer's lease (waiting while another replica holds it), then run the dataflow until a
    signal, or until the lease is lost (exit 1: the replica starts again as a standby)."""
    from dataflows import cluster as cluster_flow  # noqa: PLC0415 - keep `--help` fast
    from patterns import cluster  # noqa: PLC0415
    from workers import common  # noqa: PLC0415

    packs = cluster.load(cfg.packs, builtin=cfg.builtin)
    if not packs.patterns and not cfg.anomaly:
        raise ConfigError("no cluster patterns loaded (scope: cluster in the packs)")
    _scores(cfg)  # river missing: said before the lease is taken
    where, owner, print_ = _identity(cfg, packs, common.default_owner("analyzer"))
    if where.place > 0:
        _member(cfg, packs, where, owner, print_)
        return
    m = analyzer_metrics.Metrics()
    # liveness: the standby's wait, then the lease's renewal and the feed's reads; one silent past its
    # limit (a flow whose epochs stopped) fails /healthz
    alive = liveness.Liveness()
    stall = cfg.stall_timeout.total_seconds()
    stop = threading.Event()
    with contextlib.ExitStack() as parts:  # closed in reverse: processes, lease, store, then the server
        st = _serve_and_connect(cfg, parts, m, alive)
        leader = cluster_flow.Leadership(st, owner, cfg.lease, beat=lambda: alive.beat(LEASE_LOOP))
        parts.callback(leader.release)
        group = analyzer_processes.ProcessGroup(cfg, owner, on_failure=stop.set, where=where)
        parts.callback(group.stop)
        parts.callback(m.active.set, 0)

        def lost() -> None:
            stop.set()
            group.signal()  # their output is dropped from now on, as this process's is

        err.print(f"analyzer: {len(packs.patterns)} cluster patterns; waiting for the lease", markup=False)
        # each loop's limit: `stall` beyond its own wait (the standby's poll, the renewal's period, the
        # feed's poll)
        if not _acquire(leader, stop, alive.loop(STANDBY_LOOP, stall + cluster_flow.ACQUIRE_POLL_S)):
            return
        alive.forget(STANDBY_LOOP)
        alive.loop(LEASE_LOOP, stall + cfg.lease.total_seconds() / 3)
        m.active.set(1)
        m.watch_lag(st, stop)
        leader.keep(on_lost=lost)
        try:
            _active(cfg, packs, st, leader, stop, m, group, alive.loop(FEED_LOOP, stall + cfg.poll))
        except BaseException as exc:  # noqa: BLE001 - Bytewax panics (a BaseException) when a process is gone
            _cluster_failed(cfg, group, exc)
        failed = group.failed(wait=0)
        if failed is not None:
            err.print(f"analyzer: {failed}: stopping", markup=False)
            raise typer.Exit(1)
    if leader.lost.is_set():
        err.print("analyzer: lease lost to another replica: stopped", markup=False)
        raise typer.Exit(1)
    err.print("analyzer: stopped", markup=False)


def _serve_and_connect(
    cfg: config.AnalyzerConfig, parts: contextlib.ExitStack, m: analyzer_metrics.Metrics,
    alive: liveness.Liveness,
) -> Store:  # fmt: skip
    """The pod's metrics and /healthz server (unless `metrics_port` is 0), then its store client; both
    closed with `parts`."""
    from faultline import metrics, store  # noqa: PLC0415

    if cfg.metrics_port:
        server = metrics.serve(cfg.metrics_port, host=cfg.metrics_address, registry=m.registry, health=alive)
        parts.callback(server.close)
    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    parts.callback(st.close)
    return st


def _cluster_failed(
    cfg: config.AnalyzerConfig, group: analyzer_processes.ProcessGroup, exc: BaseException
) -> None:
    """Process 0's flow raised: one of this pod's processes failed (said after), a pod of the cluster is
    gone (exit 1, said), or anything else (raised on)."""
    if group.failed() is not None:
        return
    if not cfg.peers or isinstance(exc, KeyboardInterrupt | SystemExit):
        raise exc
    err.print(f"analyzer: the cluster's flow failed (a pod of it gone?): {exc}", markup=False)
    raise typer.Exit(1) from None


def _acquire(leader: Leadership, stop: threading.Event, beat: Callable[[], None]) -> bool:
    """Wait for the lease; SIGTERM or SIGINT while waiting ends the wait."""
    return _until_signal(stop, lambda: bool(leader.acquire(stop, beat=beat)))


def _active(
    cfg: config.AnalyzerConfig, packs: ClusterPacks, st: Store, leader: Leadership, stop: threading.Event,
    m: analyzer_metrics.Metrics, group: analyzer_processes.ProcessGroup, beat: Callable[[], None],
) -> None:  # fmt: skip
    """What the replica holding the lease does: restore the checkpoints, run the flow (with its other
    processes), prune the feed. `beat`: at every read of the feed (the flow's liveness)."""
    from dataflows import runner  # noqa: PLC0415

    flowing, formed, ended = threading.Event(), threading.Event(), threading.Event()

    def on_signal() -> None:
        """A stop asked for: the flow ends in order, unless it has not within STOP_GRACE_S (Bytewax does
        not see signals while its cluster forms): then at once, the lease given back when nothing ran."""
        stop.set()
        if not flowing.is_set() or ended.wait(STOP_GRACE_S):
            return
        if not formed.is_set():  # no batch read: nothing was written under this lease
            leader.release()
            _exit_now(0, "analyzer: stopped before its cluster formed (the lease given back)")
        _exit_now(0, f"analyzer: its flow had not ended {STOP_GRACE_S:.0f} s after the signal: stopped (the "
                     "lease runs out by itself)")  # fmt: skip

    def read() -> None:  # each read of the feed
        formed.set()
        beat()

    _Signals(on_signal)
    uri, db = cfg.mongodb_uri.get_secret_value(), cfg.database
    flow, labels, after = _flow(cfg, packs, st, stop, reader=True, owner=leader.owner, guard=leader.holding,
                                on_fault=lambda d: m.derived.labels(pattern=d.pattern).inc(),
                                on_lost=m.lost.inc, beat=read)  # fmt: skip
    pruner = threading.Thread(target=_prune, args=(uri, db, cfg, stop), name="feed-prune", daemon=True)
    pruner.start()
    err.print(f"analyzer: active as {leader.owner}, reading the feed after {sum(after.values())} documents "
              f"of {len(after)} writers", markup=False)  # fmt: skip
    try:
        group.start()
        if group.addresses:
            err.print(f"analyzer: process 0 of {len(group.addresses)} (pod 0 of "
                      f"{len(cfg.peers) or 1}) listening on {group.addresses[0]}", markup=False)  # fmt: skip
        flowing.set()
        runner.run(flow, workers=cfg.workers, on_stop=stop.set, process_id=0 if group.addresses else None,
                   addresses=group.addresses or None)  # fmt: skip
    finally:
        ended.set()
        stop.set()
        pruner.join()
        if labels is not None:
            labels.close()


def _member(
    cfg: config.AnalyzerConfig, packs: ClusterPacks, where: analyzer_processes.Layout, owner: str, print_: str
) -> None:
    """Pod `where.place` (> 0) of an analyzer spread over pods: it waits for pod 0 to hold the lease
    running the same settings, then its processes join pod 0's cluster (no lease: its output is written
    while that start of pod 0 holds it) until the flow ends (pod 0 stopped: exit 0, the StatefulSet starts
    it again to join the next), a peer is gone (Bytewax fails the cluster: exit 1), or, at once, the lease
    is seen elsewhere (exit 1) or a signal comes (exit 0): either fails the cluster's flow in the other
    pods."""

    m = analyzer_metrics.Metrics()
    alive = liveness.Liveness()
    stop = threading.Event()
    joining = threading.Lock()
    joined: list[str] = []  # pod 0's owner, once this pod joins its cluster

    def on_signal() -> None:
        """Before joining, the wait ends; after, the pod stops at once (its state is in the checkpoints)."""
        with joining:
            if joined:
                _exit_now(0, "analyzer: stopped")
            stop.set()

    _Signals(on_signal)
    with contextlib.ExitStack() as parts:
        st = _serve_and_connect(cfg, parts, m, alive)
        leader = _await_pod_0(cfg, st, where, print_, stop, alive)
        if leader is None:
            err.print("analyzer: stopped", markup=False)
            return
        # the lease seen held otherwise: this pod stops at once (which fails the cluster's flow everywhere)
        # and nothing more is written; looked at before each batch and every few seconds
        guard = _lease_guard(st, leader, lambda: _exit_now(1))
        group = analyzer_processes.ProcessGroup(cfg, owner, on_failure=stop.set, where=where, joined=leader)
        parts.callback(group.stop)
        flow, labels, _after = _flow(
            cfg, packs, st, stop, reader=False, owner=owner, guard=lambda: not stop.is_set() and guard(),
            on_fault=lambda d: m.derived.labels(pattern=d.pattern).inc(),
        )  # fmt: skip
        if labels is not None:
            parts.callback(labels.close)
        with joining:
            if stop.is_set():
                err.print("analyzer: stopped", markup=False)
                return
            joined.append(leader)
        group.start()
        threading.Thread(target=_watch_lease, args=(guard, stop), name="lease-watch", daemon=True).start()
        _join(cfg, where, flow, group, stop)


def _join(
    cfg: config.AnalyzerConfig, where: analyzer_processes.Layout, flow: Any,
    group: analyzer_processes.ProcessGroup, stop: threading.Event,
) -> None:  # fmt: skip
    """A member pod's part of the cluster's flow, until it ends (said, as the exit status)."""
    from dataflows import runner  # noqa: PLC0415

    addresses = where.addresses(where.first)
    err.print(f"analyzer: pod {where.place} of {len(cfg.peers)} (processes {where.first} to "
              f"{where.first + where.processes - 1} of {len(addresses)}) joining pod 0 ({where.leader}), "
              f"listening on {addresses[where.first]}", markup=False)  # fmt: skip
    try:
        runner.run(flow, workers=cfg.workers, process_id=where.first, addresses=addresses,
                   handle_signals=False)  # fmt: skip
    except BaseException as exc:  # noqa: BLE001 - Bytewax panics (a BaseException) when a process is gone
        stop.set()
        failed = group.failed()
        if failed is not None:
            err.print(f"analyzer: {failed}: stopping", markup=False)
        else:
            err.print(f"analyzer: the cluster's flow failed (a pod of it gone?): {exc}", markup=False)
        raise typer.Exit(1) from None
    finally:
        stop.set()
    failed = group.failed(wait=0)
    if failed is not None:
        err.print(f"analyzer: {failed}: stopping", markup=False)
        raise typer.Exit(1)
    err.print("analyzer: the cluster's flow ended: stopped", markup=False)


def _watch_lease(guard: Callable[[], bool], stop: threading.Event) -> None:
    """A member pod's look at the lease every few seconds, also while it writes nothing."""
    while not stop.wait(analyzer_processes.LEASE_CHECK_S):
        guard()


def _await_pod_0(
    cfg: config.AnalyzerConfig, st: Store, where: analyzer_processes.Layout, print_: str,
    stop: threading.Event, alive: liveness.Liveness,
) -> str | None:  # fmt: skip
    """A member pod's wait for pod 0 to hold the lease running these settings: its owner (None: a signal
    came first). Pod 0 running other settings for OTHER_SETTINGS_S: exit 1, to read them again."""
    pod = f"pod {where.place} of {len(cfg.peers)}"
    beat = alive.loop(LEADER_LOOP, cfg.stall_timeout.total_seconds() + analyzer_processes.LEADER_POLL_S)
    try:
        found = analyzer_processes.wait_for_leader(
            _holder(st), where.leader or "", print_, stop, beat=beat, other_for=OTHER_SETTINGS_S,
            say=lambda why: err.print(f"analyzer: {pod}: {why}", markup=False),
        )  # fmt: skip
    except analyzer_processes.OtherSettingsError as exc:
        err.print(f"analyzer: {pod}: {exc}: starting again (its settings and packs read again)", markup=False)
        raise typer.Exit(1) from None
    alive.forget(LEADER_LOOP)
    return found


class _Signals:
    """SIGTERM and SIGINT seen even while Bytewax holds the main thread (where Python runs its handlers:
    not while a cluster forms): the interpreter's C handler writes each signal to a pipe
    (`signal.set_wakeup_fd`), and a thread calls `on_signal` for each. Python's own handlers (this one's
    do nothing; `runner.run` installs its own for a while) still run when they can."""

    def __init__(self, on_signal: Callable[[], None]) -> None:
        import os  # noqa: PLC0415
        import signal  # noqa: PLC0415

        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)

        def watch() -> None:
            while os.read(read, 1):
                on_signal()

        threading.Thread(target=watch, name="signals", daemon=True).start()


def _exit_now(status: int, said: str = "") -> NoReturn:
    """A member pod's end without waiting for its flow, which holds no state outside the checkpoints (its
    processes end with it: the kernel kills them)."""
    import os  # noqa: PLC0415

    if said:
        err.print(said, markup=False)
    sys.stderr.flush()
    os._exit(status)


def _until_signal(stop: threading.Event, wait: Callable[[], bool]) -> bool:
    """`wait()` (which ends on `stop`), with SIGTERM and SIGINT setting `stop` meanwhile."""
    import signal  # noqa: PLC0415

    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _identity(
    cfg: config.AnalyzerConfig, packs: ClusterPacks, default: str
) -> tuple[analyzer_processes.Layout, str, str]:
    """This pod's place in the analyzer's cluster, its name in the lease and its settings' fingerprint."""
    where = analyzer_processes.layout(cfg)
    patterns = {i: lp.pattern.model_dump(mode="json") for i, lp in packs.packs.cluster.items()}
    code = analyzer_processes.code_identity() if cfg.peers else ""
    print_ = analyzer_processes.fingerprint(cfg, patterns, code)
    return where, cfg.owner or analyzer_processes.owner(where, default, print_), print_


def _holder(st: Store) -> Callable[[], str | None]:
    """Who holds the analyzer's lease (TransientError while the store is away)."""
    from faultline import store  # noqa: PLC0415

    def holder() -> str | None:
        with store.unreachable_is_transient("reading the analyzer's lease"):
            held = st.analyzer_lease()
        return held[0] if held else None

    return holder


def _lease_guard(st: Store, joined: str, on_lost: Callable[[], None]) -> analyzer_processes.LeaseGuard:
    """A member pod's output check: the analyzer's lease is held by the start of pod 0 it joined (`joined`:
    its owner); once it is not, `on_lost`."""

    def lost() -> None:
        err.print(f"analyzer: the lease is no longer held by the pod 0 this pod joined ({joined}): stopping",
                  markup=False)  # fmt: skip
        on_lost()

    return analyzer_processes.LeaseGuard(_holder(st), joined, on_lost=lost)


def _flow(
    cfg: config.AnalyzerConfig, packs: ClusterPacks, st: Store, stop: threading.Event, *, reader: bool,
    owner: str, guard: Callable[[], bool], on_fault: Callable[[Any], None] = lambda _d: None,
    on_lost: Callable[[int], None] = lambda _n: None, beat: Callable[[], None] = lambda: None,
) -> tuple[Any, Any, dict[str, int]]:  # fmt: skip
    """The flow every process of the active replica runs (the same in each: Bytewax's cluster mode),
    from the checkpoints in the store; `reader`: this process reads the feed. Returns the flow, the node
    labels' reader (None: off; close it after) and the feed position reading starts after."""
    from dataflows import cluster as cluster_flow  # noqa: PLC0415
    from faultline import evidence, store  # noqa: PLC0415
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
    workers = cfg.workers * cfg.processes * max(1, len(cfg.peers))  # the whole cluster's
    source = FeedSource(
        lambda: store.connect(uri, db), marks, poll=cfg.poll, batch=cfg.batch, stop=stop, on_lost=on_lost,
        watermark=watermark, reader=reader, chunks=1 if workers == 1 else workers * CHUNKS_PER_WORKER,
        beat=beat,
    )  # fmt: skip
    key = None if cfg.evidence_key is None else evidence.ClusterKey.from_file(cfg.evidence_key, "analyzer")
    sink = AnalyzerSink(lambda: store.connect(uri, db, signer=key), owner, guard=guard, on_fault=on_fault)
    flow = cluster_flow.build(packs, source, sink, checkpoints=checkpoints,
                              checkpoint_interval=cfg.checkpoint_interval, scores=_scores(cfg),
                              labels=labels.get if labels else lambda _n: node_labels.NONE)  # fmt: skip
    return flow, labels, marks[0][1]


@app.command("process", hidden=True)
def process() -> None:
    """Process i (> 0) of the active replica (started by `analyzer_processes.ProcessGroup`, its settings
    on standard input): the same flow without the reader, until process 0 ends it; the kernel kills it if
    process 0 dies; its output is dropped once it is signalled (the lease lost)."""
    from dataflows import runner  # noqa: PLC0415
    from faultline import store  # noqa: PLC0415
    from patterns import cluster  # noqa: PLC0415

    spec = analyzer_processes.read_spec(sys.stdin.buffer)
    analyzer_processes.die_with_parent(spec.parent)
    cfg = spec.settings
    packs = cluster.load(cfg.packs, builtin=cfg.builtin)
    stop = threading.Event()
    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    try:
        lease = None if spec.joined is None else _lease_guard(st, spec.joined, stop.set)
        flow, labels, _after = _flow(
            cfg, packs, st, stop, reader=False, owner=spec.owner,
            guard=lambda: not stop.is_set() and (lease is None or lease()),
        )  # fmt: skip
        err.print(f"analyzer: process {spec.index} of {len(spec.addresses)} of {spec.owner} joining",
                  markup=False)  # fmt: skip
        try:
            runner.run(flow, workers=cfg.workers, on_stop=stop.set, process_id=spec.index,
                       addresses=list(spec.addresses))  # fmt: skip
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
