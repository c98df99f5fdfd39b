"""The `faultline` command line: the composition root of every command (ARCHITECTURE §9)."""

from __future__ import annotations

import datetime as dt
import inspect
import sys
from datetime import UTC
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import analyzer, config_cmd, demo, flags, options, preflight, replay_cmd
from cli.consoles import err, out
from cli.log_options import log_options
from cli.replay_cmd import compile_packs as _compile
from cli.replay_cmd import error as _error
from faultline import config
from faultline.errors import FaultlineError, PackError

if TYPE_CHECKING:
    from faultline.store import documents as store_documents

app = typer.Typer(
    help="faultline: GPU fault detection, quarantine and remediation for Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
patterns_app = typer.Typer(help="Check pattern packs.", no_args_is_help=True)
app.add_typer(patterns_app, name="patterns")
dev_app = typer.Typer(help="Local infrastructure for development, tests and the demo.", no_args_is_help=True)
cluster_app = typer.Typer(help="A local Kubernetes control plane with simulated GPU nodes, and FerretDB.",
                          no_args_is_help=True)  # fmt: skip
dev_app.add_typer(cluster_app, name="cluster")
app.add_typer(dev_app, name="dev")
sim_app = typer.Typer(help="Drive simulated GPUs (the `sim` GPU backend).", no_args_is_help=True)
app.add_typer(sim_app, name="sim")
store_app = typer.Typer(help="Maintain the MongoDB event store.", no_args_is_help=True)
breaker_app = typer.Typer(help="The quarantine's circuit breaker: once tripped, it waits for a person.",
                          no_args_is_help=True)  # fmt: skip
app.add_typer(breaker_app, name="breaker")
app.add_typer(store_app, name="store")
worker_app = typer.Typer(help="faultline's workers, each run as a Deployment.", no_args_is_help=True)
app.add_typer(worker_app, name="worker")
app.add_typer(config_cmd.app, name="config")
app.add_typer(analyzer.app, name="analyzer")
app.command("demo")(demo.demo)
options.command(app, "webhook", config.WebhookConfig)(preflight.webhook)
options.command(app, "preflight", config.PreflightConfig)(preflight.preflight)
app.command("replay")(replay_cmd.replay)
app.callback()(log_options)  # --log-format, --log-level: logging is configured here, once


def _pack_command(dirs: list[Path], builtin: bool, *, run_examples: bool) -> None:
    from patterns import compiler, examples  # noqa: PLC0415

    try:
        compiled = _compile(dirs, builtin=builtin, check_examples=False)
        compiler.verify_builtin(compiled)
    except PackError as exc:
        err.print(f"FAIL {exc}", markup=False)
        raise typer.Exit(1) from exc
    if run_examples:
        from patterns import cluster  # noqa: PLC0415

        failures = examples.run(compiled) + cluster.check_examples(cluster.ClusterPacks(compiled.packs))
        for failure in failures:
            out.print(f"FAIL {failure}", markup=False, highlight=False)
        if failures:
            out.print(f"{len(failures)} example failure(s)")
            raise typer.Exit(1)
        total = sum(len(p.spec.examples.match) + len(p.spec.examples.no_match) for p in compiled.patterns)
        total += sum(len(c.pattern.examples.match) + len(c.pattern.examples.no_match)
                     for c in compiled.packs.cluster.values())  # fmt: skip
        count = len(compiled.patterns) + len(compiled.packs.cluster)
        out.print(f"ok: {total} examples of {count} patterns in {len(compiled.packs.files)} files")
        return
    for p in compiled.patterns:
        previous = compiled.packs.patterns[p.id].overrides
        if previous:
            out.print(f"note: {p.file}: pattern {p.id!r} overrides the one in {previous}", markup=False)
        changed = examples.reclassified_by(compiled, p)
        if changed:
            out.print(
                f"note: {p.file}: pattern {p.id!r} is re-classified by {', '.join(changed)}", markup=False
            )
    out.print(f"ok: {len(compiled.patterns)} patterns in {len(compiled.packs.files)} files")


def _object_rules_command(paths: list[Path], builtin: bool, *, run_examples: bool) -> bool:
    """The object rules (`patterns.object_rules`): built-in, then `paths`; whether all is well. Prints
    nothing when there are none."""
    from patterns import object_examples, object_rules  # noqa: PLC0415

    if not paths and not builtin:
        return True
    try:
        rules = object_rules.load(paths, builtin=builtin, check_examples=False)
    except PackError as exc:
        err.print(f"FAIL {exc}", markup=False)
        return False
    where = f"{len(rules.rules)} object rules in {len(rules.files)} files"
    if not run_examples:
        out.print(f"ok: {where}", markup=False)
        return True
    failures = object_examples.run(rules)
    for failure in failures:
        out.print(f"FAIL {failure}", markup=False, highlight=False)
    if failures:
        out.print(f"{len(failures)} object rule example failure(s)")
        return False
    out.print(f"ok: {object_examples.count(rules)} examples of {where}", markup=False)
    return True


def _packs_and_object_rules(
    dirs: list[Path], objects: list[Path], builtin: bool, *, run_examples: bool
) -> None:
    failed = False
    try:
        _pack_command(dirs, builtin, run_examples=run_examples)
    except typer.Exit:
        failed = True
    if not _object_rules_command(objects, builtin, run_examples=run_examples) or failed:
        raise typer.Exit(1)


ObjectRulePaths = Annotated[
    list[Path] | None,
    typer.Option("--objects", help="Object rule files or directories (repeatable), after the built-in ones."),
]


@patterns_app.command("lint")
def patterns_lint(
    dirs: Annotated[
        list[Path] | None, typer.Argument(help="Pack directories or files (default: built-ins only).")
    ] = None,
    objects: ObjectRulePaths = None,
    builtin: Annotated[bool, typer.Option(help="Load the built-in packs and object rules too.")] = True,
) -> None:
    """Validate packs (schema, regexes and catastrophic backtracking, templates, tables) and object rules
    (schema, CEL expressions)."""
    _packs_and_object_rules(dirs or [], objects or [], builtin, run_examples=False)


@patterns_app.command("test")
def patterns_test(
    dirs: Annotated[
        list[Path] | None, typer.Argument(help="Pack directories or files (default: built-ins only).")
    ] = None,
    objects: ObjectRulePaths = None,
    builtin: Annotated[bool, typer.Option(help="Load the built-in packs and object rules too.")] = True,
) -> None:
    """Run every pattern's positive and negative examples, and every object rule's example objects; report
    each failure with file and pattern or rule id."""
    _packs_and_object_rules(dirs or [], objects or [], builtin, run_examples=True)


@options.command(app, "agent", config.AgentConfig)
def agent(cfg: config.AgentConfig) -> None:
    """Run the node agent: GPU events (and the kernel journal) -> pattern packs -> faults in MongoDB and
    node conditions."""
    from cli import agent as agent_cmd  # noqa: PLC0415

    agent_cmd.run(cfg)


@sim_app.command("inject")
def sim_inject(
    node: Annotated[str, typer.Option(help="Simulated node.")],
    gpu: Annotated[int, typer.Option(min=0, max=15, help="GPU index.")],
    xid: Annotated[int | None, typer.Option(help="Raise this XID.")] = None,
    field: Annotated[
        str | None, typer.Option(help="Set a health field, NAME=VALUE (e.g. ecc_dbe_volatile=1).")
    ] = None,
    lost: Annotated[bool, typer.Option(help="The GPU falls off the bus.")] = False,
    clear: Annotated[bool, typer.Option(help="The GPU reports healthy again (resolves its faults).")] = False,
    reset: Annotated[
        bool, typer.Option(help="The GPU is reset: its volatile errors and pending remaps clear (no line).")
    ] = False,
    hang: Annotated[
        float | None, typer.Option(min=0, help="The GPU backend's reads hang for this many seconds.")
    ] = None,
    sim_dir: Annotated[Path | None, typer.Option(help="Simulator control directory.")] = None,
) -> None:
    """Make a simulated GPU report an event (one of --xid, --field, --lost, --clear, --reset, --hang)."""
    from sources import simulator  # noqa: PLC0415

    given = (("xid", xid is not None), ("field", field is not None), ("lost", lost), ("healthy", clear),
             ("reset", reset), ("hang", hang is not None))  # fmt: skip
    chosen = [name for name, on in given if on]
    if len(chosen) != 1:
        raise typer.BadParameter("give exactly one of --xid, --field, --lost, --clear, --reset, --hang")
    kind, name, value = chosen[0], "", xid or 0
    if field is not None:
        try:
            name, value = simulator.parse_field(field)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--field") from exc
    if hang is not None:
        value = round(hang)
    path = simulator.inject(node, gpu, kind=kind, value=value, name=name, directory=sim_dir)
    what = {"xid": f"xid {xid}", "field": f"field {field}", "hang": f"hang {value} s"}.get(kind, kind)
    out.print(f"injected {what} on {node} GPU {gpu} ({path})", markup=False)


@options.command(store_app, "retention", config.RetentionConfig)
def store_retention(cfg: config.RetentionConfig) -> None:
    """Delete old health events and the analyzer's feed documents (run periodically, e.g. by a CronJob:
    FerretDB and DocumentDB have no TTL indexes). Faults are kept: they hold the state of open problems and
    their remediation."""
    from faultline import store  # noqa: PLC0415

    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    try:
        with store.unreachable_is_transient("pruning health events"):
            deleted = st.prune_events(cfg.older_than)
            fed = st.prune_feed(cfg.older_than)  # the analyzer's feed: by age, read or not
            reports = st.prune_bug_reports(cfg.bug_reports_older_than)
    finally:
        st.close()
    older_than = flags.format_value(cfg.older_than)
    out.print(f"deleted {deleted} health events older than {older_than}", markup=False)
    if fed:
        out.print(f"deleted {fed} feed documents older than {older_than}", markup=False)
    if reports:
        kept = flags.format_value(cfg.bug_reports_older_than)
        out.print(f"deleted {reports} bug reports collected more than {kept} ago", markup=False)


@options.command(worker_app, "quarantine", config.QuarantineConfig)
def worker_quarantine(cfg: config.QuarantineConfig) -> None:
    """Cordon, taint and label nodes with open faults per the rules; release them when resolved."""
    from workers import run  # noqa: PLC0415

    err.print("quarantine: started", markup=False)
    run.quarantine_main(cfg)


@options.command(worker_app, "drain", config.DrainConfig)
def worker_drain(cfg: config.DrainConfig) -> None:
    """Evict the pods of the nodes faultline quarantined, per namespace mode, respecting PDBs."""
    from workers import run  # noqa: PLC0415

    err.print("drain: started", markup=False)
    run.drain_main(cfg)


@options.command(worker_app, "remediation", config.RemediationConfig)
def worker_remediation(cfg: config.RemediationConfig) -> None:
    """Decide each drained node's repair (with escalation) and write a RemediationRequest for it."""
    from workers import run  # noqa: PLC0415

    err.print("remediation: started", markup=False)
    run.remediation_main(cfg)


@options.command(worker_app, "janitor", config.JanitorConfig)
def worker_janitor(cfg: config.JanitorConfig) -> None:
    """Carry out RemediationRequests (reboot / GPU reset Jobs, cloud provider calls), validate, record,
    escalate on failure."""
    from workers import run  # noqa: PLC0415

    err.print("janitor: started", markup=False)
    run.janitor_main(cfg)


@options.command(app, "maintenance", config.MaintenanceConfig)
def maintenance(cfg: config.MaintenanceConfig) -> None:
    """Watch what the cloud providers announce for the cluster's nodes (AWS, GCP, OCI APIs; Azure through
    the node agents): a fault on each node a lead time before its maintenance, so it is quarantined and
    drained first; resolved once the maintenance is over and the node is back."""
    from workers import run  # noqa: PLC0415

    err.print("maintenance: started", markup=False)
    run.maintenance_main(cfg)


@options.command(app, "object-monitor", config.ObjectMonitorConfig)
def object_monitor(cfg: config.ObjectMonitorConfig) -> None:
    """Watch the kinds the object rules name and hold a fault open on a node while a rule's predicate is
    true for an object (GPUs not advertised, a node NotReady for long, GPU pods that cannot get GPUs)."""
    from workers import run  # noqa: PLC0415

    err.print("object-monitor: started", markup=False)
    run.object_monitor_main(cfg)


@options.command(app, "export", config.ExportConfig)
def export(cfg: config.ExportConfig) -> None:
    """Send fault changes and repair steps to each configured sink (CloudEvents over HTTP, or a webhook
    for chat tools), at least once, from a stored position per sink, retrying with back-off."""
    from workers import run  # noqa: PLC0415

    err.print(f"export: started ({len(cfg.sinks)} sinks)", markup=False)
    run.export_main(cfg)


@options.command(app, "uninstall", config.UninstallConfig)
def uninstall(cfg: config.UninstallConfig) -> None:
    """Take back faultline's marks from the cluster after its release is removed (the chart's post-delete
    hook): node conditions, cordons, taints, labels and annotations faultline added, its
    RemediationRequests and repair Jobs. Waits for the release's pods to stop first."""
    from faultline import kube  # noqa: PLC0415
    from workers import uninstall as cleanup  # noqa: PLC0415

    api = kube.api_client(cfg.kubeconfig)
    report = cleanup.run(api, namespace=cfg.namespace, repair_namespace=cfg.repair_namespace or cfg.namespace,
                         instance=cfg.instance, wait=cfg.wait.total_seconds())  # fmt: skip
    out.print(
        f"released {len(report.nodes_released)} nodes, removed the conditions of "
        f"{len(report.conditions_removed)}, deleted {len(report.requests_deleted)} RemediationRequests and "
        f"{len(report.jobs_deleted)} repair Jobs",
        markup=False,
    )


@options.command(app, "chart-secrets", config.ChartSecretsConfig)
def chart_secrets(cfg: config.ChartSecretsConfig) -> None:
    """Make the chart's Secrets that are missing (the store's password, the evidence key, the webhook's
    TLS Secret) and complete the others, never overwriting a stored value (the chart's pre-install and
    pre-upgrade hook: renders stay the same, so GitOps tools do not overwrite them)."""
    from faultline.kube import lite  # noqa: PLC0415
    from workers import chart_secrets as cs  # noqa: PLC0415

    specs = [cs.SecretSpec(s.name, dict(s.random), dict(s.fixed), dict(s.derived), dict(s.labels))
             for s in cfg.secrets]  # fmt: skip
    client = lite.Client.connect(cfg.kubeconfig)
    try:
        done = cs.ensure(client, cfg.namespace, specs)
        labelled = cs.label_namespaces(client, cfg.namespace_labels)
    finally:
        client.close()
    out.print(", ".join(f"{name} {what}" for name, what in done.items()) or "no Secret to make", markup=False)
    for namespace, keys in labelled.items():
        out.print(f"namespace {namespace}: {', '.join(keys) or 'labels kept'}", markup=False)


@options.command(app, "chart-crds", config.ChartCrdsConfig)
def chart_crds(cfg: config.ChartCrdsConfig) -> None:
    """Bring the RemediationRequest CRD to this version: created when missing, its spec replaced when it
    differs (the chart's pre-upgrade hook: Helm installs a chart's CRDs but never upgrades them)."""
    from faultline import kube  # noqa: PLC0415

    done = kube.resources.apply_crds(kube.api_client(cfg.kubeconfig))
    out.print(", ".join(f"{name} {what}" for name, what in done.items()), markup=False)


class Output(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


def _output_param() -> inspect.Parameter:
    return inspect.Parameter(
        "output",
        inspect.Parameter.KEYWORD_ONLY,
        default=Output.table,
        annotation=Annotated[Output, typer.Option("--output", "-o", help="table (people), json or yaml.")],
    )


def _node_param(*, required: bool) -> inspect.Parameter:
    help_text = "the node" if required else "only this node (its hold, open faults and parked work)"
    return inspect.Parameter(
        "node",
        inspect.Parameter.KEYWORD_ONLY,
        default=... if required else None,
        annotation=Annotated[
            str if required else str | None,
            typer.Argument(help=help_text, show_default=False, metavar="NODE"),
        ],
    )


def _dump(data: Any, output: Output) -> None:
    import json  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    if output == Output.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, width=120))


def status(resolved: Any, node: str | None = None, output: Output = Output.table) -> None:
    """The quarantine circuit breaker, the nodes faultline holds, the parked work items (failed
    permanently or out of attempts: they wait for a person), and the cluster analyzer's progress; with a
    NODE, only that node's hold, open faults and parked work."""
    from rich.table import Table  # noqa: PLC0415

    from cli import explain  # noqa: PLC0415
    from faultline import store  # noqa: PLC0415
    from patterns.cluster import PARTITIONS  # noqa: PLC0415

    cfg: config.StatusConfig = resolved.config
    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    try:
        with store.unreachable_is_transient("reading status"):
            brk = st.breaker()
            held = [h for h in st.held_nodes() if node is None or h.id == node]
            parked = [p for p in st.parked() if node is None or p.node == node]
            analyzer = st.analyzer_status(PARTITIONS)
            faults = st.faults_of([node]).get(node, []) if node is not None else []
    finally:
        st.close()
    t = explain.timestamp
    if output != Output.table:
        data: dict[str, Any] = {
            "breaker": {
                "state": brk.state,
                "since": t(brk.since),
                "reason": brk.reason,
                "reset_by": brk.reset_by or None,
                "reset_reason": brk.reset_reason or None,
                "reset_at": t(brk.reset_at),
            },
            "held": [
                {"node": h.id, "quarantined_at": t(h.quarantined_at), "faults": list(h.faults)} for h in held
            ],
            "parked": [
                {
                    "stage": str(p.stage),
                    "item": p.item,
                    "node": p.node,
                    "attempts": p.attempts,
                    "reason": p.reason,
                    "at": t(p.at),
                }
                for p in parked
            ],
            "analyzer": None
            if analyzer is None
            else {
                "owner": analyzer.owner,
                "position": analyzer.position,
                "head": analyzer.head,
                "behind": analyzer.head - analyzer.position,
                "checkpointed_at": t(analyzer.checkpointed_at),
            },
        }
        if node is not None:
            data = {
                "node": node,
                **data,
                "faults": [
                    {
                        "code": f.code,
                        "entity": {"type": f.entity.type, "id": f.entity.id},
                        "fatal": f.fatal,
                        "action": f.action,
                        "count": f.count,
                        "first_seen": t(f.first_seen),
                        "last_seen": t(f.last_seen),
                    }
                    for f in faults
                    if f.state == "open"
                ],
            }
        _dump(data, output)
        return
    _print_breaker(brk)
    if analyzer is not None and node is None:
        who = f"active: {analyzer.owner}" if analyzer.owner else "no replica active"
        at = analyzer.checkpointed_at
        saved = f", last checkpoint {at:%Y-%m-%d %H:%M:%S}Z" if at else ""
        out.print(
            f"cluster analyzer: {who}; feed read up to {analyzer.position} of {analyzer.head} "
            f"({analyzer.head - analyzer.position} behind){saved}",
            markup=False,
        )
    table = Table("node", "quarantined at", "faults")
    for hold in held:
        at = hold.quarantined_at
        table.add_row(hold.id, f"{at:%Y-%m-%d %H:%M:%S}Z" if at else "", ", ".join(hold.faults))
    out.print(table)
    if node is not None:
        open_ = [f for f in faults if f.state == "open"]
        listed = ", ".join(f"{f.code} ({f.entity.type} {f.entity.id})" for f in open_) or "none"
        out.print(f"open faults of {node}: {listed}", markup=False)
    if not parked:
        out.print("parked work items: none", markup=False)
        return
    table = Table("stage", "item", "node", "attempts", "reason", "parked at", title="parked work items")
    for item in parked:
        when = f"{item.at:%Y-%m-%d %H:%M:%S}Z" if item.at else ""
        table.add_row(item.stage, item.item, item.node, str(item.attempts), item.reason, when)
    out.print(table)


options.register(
    app,
    "status",
    config.StatusConfig,
    status,
    status.__doc__,
    extra=(_node_param(required=False), _output_param()),
)


def explain_node(resolved: Any, node: str, output: Output = Output.table) -> None:
    """Why faultline holds NODE (or does not): its marks, each fault with its evidence and the rules and
    breaker's decision on it, the drain's scope, the repair rounds, what comes next and what a person can
    do now (as commands). Reads the store and the cluster."""
    from cli import explain  # noqa: PLC0415
    from faultline import kube, store  # noqa: PLC0415
    from workers import rules  # noqa: PLC0415

    cfg: config.ExplainConfig = resolved.config
    quarantine_rules = rules.load_rules(cfg.rules)
    api = kube.api_client(cfg.kubeconfig)
    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    try:
        with store.unreachable_is_transient("reading the node's story"):
            data = explain.gather(st, api, node, quarantine_rules)
    finally:
        st.close()
    if output == Output.table:
        sys.stdout.write(explain.render(data))
    else:
        _dump(data, output)


options.register(
    app,
    "explain",
    config.ExplainConfig,
    explain_node,
    explain_node.__doc__,
    extra=(_node_param(required=True), _output_param()),
)


class ReportOutput(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def report(resolved: Any, output: ReportOutput = ReportOutput.table) -> None:
    """The fleet's reliability over a window: faults by code, GPU model and node; time to detect, to
    quarantine and to release (p50, p90); time out of service; repair success per action; GPUs that keep
    failing (followed by serial number across nodes); candidates for RMA. Reads the store."""
    import csv  # noqa: PLC0415
    import json  # noqa: PLC0415

    from cli import report as fleet_report  # noqa: PLC0415
    from faultline import store  # noqa: PLC0415

    cfg: config.ReportConfig = resolved.config
    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    try:
        with store.unreachable_is_transient("reading the fleet's history"):
            data = fleet_report.build(st, st.now(), cfg.window, repeat=cfg.repeat_offender)
    finally:
        st.close()
    if output == ReportOutput.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif output == ReportOutput.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(("measure", "dimension", "value"))
        writer.writerows(fleet_report.rows(data))
    else:
        sys.stdout.write(fleet_report.table(data))


options.register(app, "report", config.ReportConfig, report, report.__doc__, extra=(inspect.Parameter(
    "output", inspect.Parameter.KEYWORD_ONLY, default=ReportOutput.table,
    annotation=Annotated[ReportOutput, typer.Option("--output", "-o", help="table (people), json or csv.")],
),))  # fmt: skip


def rma_command(resolved: Any, target: str) -> None:
    """Write the RMA evidence bundles of a node, or of a GPU (serial number or UUID), as a tarball: the
    faults, the kernel lines and samples behind them, the GPUs' identity, the repair history and the
    nvidia-bug-report outputs the repair Jobs collected. Kept when a repair ends in CONTACT_SUPPORT or
    REPLACE. Reads the store."""
    from cli import rma_tarball  # noqa: PLC0415
    from faultline import store  # noqa: PLC0415

    cfg: config.RmaConfig = resolved.config
    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    try:
        with store.unreachable_is_transient("reading the RMA evidence"):
            bundles = st.rma_bundles(node=target) or st.rma_bundles(gpu=target)
            reports = {n: st.bug_reports(n, data=True) for n in sorted({b["node"] for b in bundles})}
    finally:
        st.close()
    if not bundles:
        _error(
            f"no RMA evidence of {target!r}: a bundle is kept when a repair of a node ends in "
            "CONTACT_SUPPORT or REPLACE (give the node's name, or a GPU's serial number or UUID)"
        )
        raise typer.Exit(1)
    stamp = dt.datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = cfg.file or Path(f"rma-{rma_tarball.safe(target)}-{stamp}.tar.gz")
    files = rma_tarball.write(path, target, bundles, reports)
    out.print(f"wrote {path}: {len(bundles)} bundle(s), {files} files", markup=False)


options.register(app, "rma", config.RmaConfig, rma_command, rma_command.__doc__, extra=(inspect.Parameter(
    "target", inspect.Parameter.KEYWORD_ONLY, default=...,
    annotation=Annotated[str, typer.Argument(help="a node, or a GPU's serial number or UUID",
                                             show_default=False, metavar="NODE|GPU")],
),))  # fmt: skip


def _print_breaker(brk: store_documents.Breaker) -> None:
    """The breaker's state, why, and its last reset (who, why, when)."""
    since = f" since {brk.since:%Y-%m-%d %H:%M:%S}Z ({brk.reason})" if brk.since else ""
    out.print(f"circuit breaker: {brk.state}{since}", markup=False)
    if brk.state == "open":
        out.print("  it stays open until a person runs `faultline breaker reset --reason TEXT`", markup=False)
    if brk.reset_at is not None:
        out.print(f"  last reset {brk.reset_at:%Y-%m-%d %H:%M:%S}Z by {brk.reset_by}: {brk.reset_reason}",
                  markup=False)  # fmt: skip


@options.command(breaker_app, "status", config.StatusConfig)
def breaker_status(cfg: config.StatusConfig) -> None:
    """The quarantine circuit breaker: closed or tripped (open), why, and its last reset."""
    from faultline import store  # noqa: PLC0415

    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    try:
        with store.unreachable_is_transient("reading the breaker"):
            brk = st.breaker()
    finally:
        st.close()
    _print_breaker(brk)


@options.command(breaker_app, "reset", config.BreakerResetConfig)
def breaker_reset(cfg: config.BreakerResetConfig) -> None:
    """Close the tripped quarantine circuit breaker: new quarantines go ahead again, up to its limits
    (counted from now), and it trips again at them. Who and why are recorded and shown by `status`."""
    from faultline import store  # noqa: PLC0415
    from workers import breaker  # noqa: PLC0415

    st = store.connect(cfg.mongodb_uri.get_secret_value(), cfg.database)
    try:
        with store.unreachable_is_transient("resetting the breaker"):
            was = st.breaker()
            new = breaker.reset(st.now(), cfg.by, cfg.reason)
            assert new.since is not None
            st.reset_breaker(new.state, new.since, new.reason, by=cfg.by, why=cfg.reason)
    finally:
        st.close()
    out.print(f"circuit breaker reset (was {was.state}) by {cfg.by}: {cfg.reason}", markup=False)


@cluster_app.command("up")
def cluster_up(
    nodes: Annotated[int, typer.Option(min=1, max=500, help="Simulated GPU nodes (8 GPUs each).")] = 4,
    real_nodes: Annotated[
        int,
        typer.Option(
            min=0,
            max=4,
            help="Real nodes (kubelet, containerd, runc, bridge CNI) running real pods; needs root. Their "
            "changes to the machine are undone on stop, or by `dev cluster down` after a crash.",
        ),
    ] = 0,
    image: Annotated[
        bool, typer.Option(help="With real nodes: push the project's image (make image) to their registry.")
    ] = True,
) -> None:
    """Run etcd, the API server, controller manager, scheduler, simulated nodes and FerretDB until Ctrl-C.

    Prints `KUBECONFIG=<path>` and `MONGODB_URI=<uri>` once ready; with real nodes also `REGISTRY=`,
    `IMAGE=` and `MONGODB_URI_PODS=` (the store's address from their pods).
    """
    from devtools import session  # noqa: PLC0415

    def emit(line: str) -> None:
        print(line, flush=True)  # noqa: T201 - the contract is plain lines on stdout

    session.up(nodes, emit, real_nodes=real_nodes, project_image=image)


@cluster_app.command("down")
def cluster_down() -> None:
    """Stop a dev cluster left running in the background."""
    from devtools import session  # noqa: PLC0415

    out.print(session.down(), markup=False)


def main() -> None:
    try:
        app()
    except FaultlineError as exc:
        _error(str(exc))
        sys.exit(2)
