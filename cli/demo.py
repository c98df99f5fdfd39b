"""`faultline demo`: the whole chart on a local cluster of simulated GPU nodes, a scripted fault scenario
shown live (a rich table updated in place on a terminal, one line per change otherwise), then a timeline
of each case's steps. The orchestration is `devtools.demo` (infrastructure) and `devtools.demo_scenario`
(the cases); this module is the command and what it prints."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from faultline.errors import FaultlineError

if TYPE_CHECKING:
    from pathlib import Path

    from devtools.demo import DemoStack
    from devtools.demo_scenario import Case, NodeView


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Screen:
    """The live view: a table redrawn in place on a terminal; plain lines, one per change, elsewhere."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live_mode = console.is_terminal
        self.started = time.monotonic()
        self.messages: list[str] = []
        self.last: dict[str, str] = {}
        self.live: Live | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        if not self.live_mode:
            yield
            return
        with Live(Text(""), console=self.console, refresh_per_second=4, transient=False) as live:
            self.live = live
            try:
                yield
            finally:
                self.live = None

    def say(self, message: str) -> None:
        stamp = f"{time.monotonic() - self.started:6.1f}s"
        if self.live is None:
            self.console.print(f"{stamp} {message}", markup=False, highlight=False)
        else:
            self.messages = [*self.messages, f"{stamp} {message}"][-8:]

    def update(self, view: dict[str, NodeView], cases: list[Case]) -> None:
        if self.live is not None:
            self.live.update(Group(_nodes_table(view), _cases_table(cases), Text("\n".join(self.messages))))
            return
        for name, v in view.items():
            line = _node_line(v)
            if self.last.get(name) != line:
                self.last[name] = line
                self.say(f"{name}: {line}")


def _doing(v: NodeView) -> str:
    if not v.ready:
        return "rebooting"
    if v.state:
        return v.state
    return "cordoned" if v.cordoned else "in service"


def _node_line(v: NodeView) -> str:
    parts = [_doing(v), f"faults={','.join(v.faults) or '-'}", f"pods={','.join(v.pods) or '-'}"]
    if v.requests:
        parts.append(f"request={v.requests[-1]}")
    if v.repair:
        parts.append(f"repair={v.repair}")
    return " ".join(parts)


def _nodes_table(view: dict[str, NodeView]) -> Table:
    table = Table(
        "node", "Ready", "faultline", "open faults", "workload", "repair", title="simulated GPU nodes"
    )
    for v in view.values():
        colour = "green" if _doing(v) == "in service" else "yellow" if v.ready else "red"
        table.add_row(v.name, "yes" if v.ready else "no", Text(_doing(v), style=colour), ", ".join(v.faults),
                      ", ".join(v.pods), v.repair or (v.requests[-1] if v.requests else ""))  # fmt: skip
    return table


def _cases_table(cases: list[Case]) -> Table:
    from devtools.demo_scenario import STEPS  # noqa: PLC0415

    table = Table("case", "node", *STEPS, "result", title="timeline (seconds after the fault)")
    for case in cases:
        cells = [f"{case.steps[s]:.1f}" if s in case.steps else "-" for s in STEPS]
        verdict = case.check or ("ok" if case.ok else "..." if case.ok is None else "missed steps")
        table.add_row(case.title, ",".join(case.nodes), *cells, verdict)
    return table


def timeline_lines(cases: list[Case]) -> list[str]:
    """One line per case, for machines and logs: `timeline CODE NODE step=1.2 ... ok`."""
    out = []
    for case in cases:
        steps = " ".join(f"{step.replace(' ', '_')}={seconds:.1f}" for step, seconds in case.steps.items())
        extra = f" {case.check}" if case.check else ""
        out.append(
            f"timeline {case.code} {','.join(case.nodes)} {steps}{extra} {'ok' if case.ok else 'FAILED'}"
        )
    return out


def demo(
    keep: Annotated[
        bool, typer.Option(help="Leave everything running after the scenario (Ctrl-C stops it).")
    ] = False,
    real_node: Annotated[
        bool,
        typer.Option(
            help="Add a real kubelet node (root only) where the chart's pods run for real (the "
            "project's image, `make image`); its repair Jobs only record what they would do."
        ),
    ] = False,
) -> None:
    """Run the whole chart on a local cluster of simulated GPU nodes and play four faults, live: an XID 79
    under a training pod (quarantine, drain, reboot, release), a burst of application XID 13 (nothing
    cordoned), a fatal NVSwitch SXid and a flapping NIC; then print the timeline. Everything started is
    stopped at the end (or kept with --keep)."""
    from devtools import session  # noqa: PLC0415
    from devtools.demo import DemoStack  # noqa: PLC0415

    _refuse(real_node=real_node, keep=keep)
    wide = None if sys.stdout.isatty() else 200  # not a terminal: lay the timeline out wide
    console = Console(highlight=False, soft_wrap=True, emoji=False, width=wide)
    signal.signal(signal.SIGTERM, _interrupt)
    screen = Screen(console)
    stack = DemoStack(real_node=real_node)
    failed = True
    try:
        stack.start(say=screen.say)
        failed = _play(stack, screen, console)
        if keep:
            _keep(stack, session.STATE, console)
    except KeyboardInterrupt:
        console.print("interrupted: stopping", markup=False)
    finally:
        console.print("stopping everything the demo started", markup=False)
        stack.stop()
        if keep:
            session.STATE.unlink(missing_ok=True)
    if failed:
        raise typer.Exit(1)


def _refuse(*, real_node: bool, keep: bool) -> None:
    from devtools import procs, realnode_host, session  # noqa: PLC0415

    problem = ""
    if real_node:
        try:
            realnode_host.require_root()
        except FaultlineError as exc:
            problem = f"--real-node: {exc}"
    running = session.STATE.exists() and procs.alive(json.loads(session.STATE.read_text()).get("pid", 0))
    if not problem and keep and running:
        problem = f"--keep: a dev cluster is running (see {session.STATE}); `faultline dev cluster down`"
    if problem:
        Console(stderr=True).print(f"error: {problem}", markup=False)
        raise typer.Exit(2)


def _play(stack: DemoStack, screen: Screen, console: Console) -> bool:
    """The scenario, live, then its timeline; True when a case missed a step."""
    from devtools import demo_scenario  # noqa: PLC0415

    setup = time.monotonic() - screen.started
    screen.say(f"ready in {setup:.1f} s; the scenario starts")
    observer = demo_scenario.Observer(stack, screen.update)
    began = time.monotonic()
    error = ""
    try:
        with screen.running():
            try:
                demo_scenario.run(stack, observer, screen.say)
            finally:  # the live view's last frame: the final verdicts
                screen.update(observer.view, demo_scenario.settle(observer.cases))
    except FaultlineError as exc:  # a case missed its steps: still show how far each got
        error = str(exc)
    finally:
        observer.close()
    took = time.monotonic() - began
    cases = observer.cases
    if not screen.live_mode:  # on a terminal the live view's last frame shows it already
        console.print(_cases_table(cases))
    for line in timeline_lines(cases):
        console.print(line, markup=False, highlight=False)
    if error:
        console.print(f"error: {error}", markup=False)
        for c in stack.components:  # the end of each component's log, before it is removed
            console.print(f"--- {c.name} ---\n{c.proc.tail(5)}", markup=False, highlight=False)
    failed = bool(error) or not all(c.ok for c in cases)
    verdict = "FAILED" if failed else "completed"
    console.print(f"scenario: {verdict} in {took:.1f} s (setup {setup:.1f} s)", markup=False)
    return failed


def _keep(stack: DemoStack, state: Path, console: Console) -> None:
    """Print the lines `faultline dev cluster up` prints and stay up until Ctrl-C (or `faultline dev
    cluster down`, through the same state file)."""
    assert stack.cluster is not None
    assert stack.mongo is not None
    kept = {"pid": os.getpid(), "children": stack.pids(), "kubeconfig": str(stack.cluster.kubeconfig),
            "mongodb_uri": stack.mongo.uri}  # fmt: skip
    state.write_text(json.dumps(kept))
    print(f"KUBECONFIG={stack.cluster.kubeconfig}", flush=True)  # noqa: T201 - the contract is plain lines
    print(f"MONGODB_URI={stack.mongo.uri}", flush=True)  # noqa: T201
    logs = stack.dir / "logs"
    console.print(f"# kept running (the components log in {logs}); Ctrl-C or `faultline dev cluster down` "
                  "stops it", markup=False)  # fmt: skip
    while True:
        time.sleep(1)
        dead = [c.name for c in stack.components if not c.proc.alive()]
        if dead:
            console.print(f"{', '.join(dead)} exited; stopping", markup=False)
            sys.exit(1)
