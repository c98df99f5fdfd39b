"""`faultline demo`'s scripted scenario, on a running `DemoStack`, and what it shows.

Four cases, each injected the way the fault would reach a real node's agent: through the GPU simulator's
control file (what `faultline sim inject` appends), the node's kernel log (a syslog file the agent follows)
and the node's sysfs (the NIC ports the agent polls):

1. XID 79 (GPU fallen off the bus) under a running training pod: quarantine, drain (the pod evicted), a
   reboot (RemediationRequest, repair Job, the simulated node reboots), validation, release;
2. a burst of application XID 13 on several nodes: faults recorded, nothing cordoned;
3. a fatal NVSwitch SXid: the node is quarantined (and, like 1, rebooted and released);
4. a flapping NIC (link down/up three times): NIC-LINK-FLAPPING, the node quarantined.

`Observer.poll` reads the cluster and the store (every poll is a `View`) and records, per case, when each
step was first seen. It also plays the rebooted nodes' kernel: when a node's boot id changes it writes the
new boot's first kernel line to the node's log, as a real node's persistent journal would hold.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from devtools.demo import NAMESPACE, RELEASE, DemoStack
from faultline import kube, store
from faultline.errors import TransientError
from sources import simulator

STEPS = ("detected", "quarantined", "drained", "repair requested", "rebooted", "validated", "released")
POLL_S = 0.3
BOOT_LINE = "[    0.000000] Linux version 6.8.0-sim (faultline demo) #1 SMP"
WORKLOAD_NS = "ml"


@dataclass
class NodeView:
    name: str
    ready: bool = True
    cordoned: bool = False
    state: str = ""  # faultline.io/state
    boot_id: str = ""
    faults: list[str] = field(default_factory=list)  # open fault codes
    pods: list[str] = field(default_factory=list)  # workload pods (not faultline's own)
    requests: list[str] = field(default_factory=list)  # RemediationRequest actions and phases
    repair: str = ""  # the last repair round: step and outcome
    drained: bool = False
    validated: bool = False
    all_codes: set[str] = field(default_factory=set)  # every fault code seen, open or resolved
    ready_pods: list[str] = field(default_factory=list)


@dataclass
class Case:
    title: str
    nodes: list[str]
    code: str
    expect: tuple[str, ...]
    started: float = 0.0  # monotonic time of the injection
    steps: dict[str, float] = field(default_factory=dict)  # step -> seconds after the injection
    check: str = ""  # a verdict that is not a step (case 2)
    ok: bool | None = None

    def seen(self, step: str, now: float) -> None:
        if self.started and step not in self.steps:
            self.steps[step] = now - self.started


class Observer:
    def __init__(self, stack: DemoStack, on_view: Callable[[dict[str, NodeView], list[Case]], None]) -> None:
        assert stack.cluster is not None
        assert stack.mongo is not None
        self.stack = stack
        self.api = stack.cluster.api()
        self.nodes = list(stack.cluster.node_names)
        self.real = list(stack.cluster.real_node_names) if stack.cluster.real is not None else []
        self.store = store.connect(stack.mongo.uri, "faultline")
        self.on_view = on_view
        self.cases: list[Case] = []
        self.view: dict[str, NodeView] = {}
        self.boot_ids: dict[str, str] = {}
        self.first_boot: dict[str, str] = {}

    def close(self) -> None:
        self.store.close()

    def poll(self) -> dict[str, NodeView]:
        view = {n: NodeView(n) for n in [*self.nodes, *self.real]}
        for node in kube.nodes.list_all(self.api):
            v = view.get(node["metadata"]["name"])
            if v is None:
                continue
            status = node.get("status", {})
            v.ready = any(
                c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
            )
            v.cordoned = bool(node.get("spec", {}).get("unschedulable"))
            v.state = (node["metadata"].get("labels") or {}).get("faultline.io/state", "")
            v.boot_id = status.get("nodeInfo", {}).get("bootID", "")
        for pod in kube.pods.list_all(self.api, field_selector="spec.nodeName!="):
            meta, on = pod["metadata"], pod["spec"]["nodeName"]
            # the workload, not faultline's own pods (but every pod of a real node: they really run)
            if on in view and (meta["namespace"] != NAMESPACE or on in self.real):
                going = " (terminating)" if meta.get("deletionTimestamp") else ""
                view[on].pods.append(meta["name"] + going)
                if _pod_ready(pod):
                    view[on].ready_pods.append(meta["name"])
        for request in kube.resources.list_requests(self.api):
            v = view.get(request["spec"]["node"])
            if v is not None:
                v.requests.append(
                    f"{request['spec']['action']} {request.get('status', {}).get('phase', 'New')}"
                )
        for name, records in self.store.faults_of(self.nodes).items():
            view[name].all_codes = {r.code for r in records}
            view[name].faults = sorted({r.code for r in records if r.state == "open"})
        for name, v in view.items():
            repairs = self.store.repairs_of(name)
            if repairs and repairs[-1].rounds:
                last = repairs[-1].rounds[-1]
                v.repair = f"{last.step} {last.outcome or 'in progress'}"
                v.validated = any(r.outcome == "Succeeded" for rep in repairs for r in rep.rounds)
            drain = self.store.drain(name)
            v.drained = drain is not None and drain.result == "drained"
        self._reboots(view)
        self.view = view
        self._steps(view, time.monotonic())
        self.on_view(view, self.cases)
        return view

    def _reboots(self, view: dict[str, NodeView]) -> None:
        """A node back with a new boot id: its kernel's first line goes to its log (the boot marker)."""
        for node, v in view.items():
            self.first_boot.setdefault(node, v.boot_id)
            before = self.boot_ids.get(node)
            if before and v.boot_id and v.boot_id != before:
                kernel_line(
                    self.stack, node, "[    0.000000] Linux version 6.8.0-sim (faultline demo) #1 SMP"
                )
            if v.boot_id:
                self.boot_ids[node] = v.boot_id

    def _steps(self, view: dict[str, NodeView], now: float) -> None:
        for case in self.cases:
            v = view[case.nodes[0]]
            if case.code in v.all_codes:
                case.seen("detected", now)
            if "quarantined" in case.steps and v.drained:
                case.seen("drained", now)
            if v.cordoned:
                case.seen("quarantined", now)
            if any(r.startswith(("REBOOT", "GPU_RESET")) for r in v.requests):
                case.seen("repair requested", now)
            if v.boot_id != self.first_boot.get(v.name):
                case.seen("rebooted", now)
            if v.validated:
                case.seen("validated", now)
            if "quarantined" in case.steps and not v.cordoned:
                case.seen("released", now)

    def wait(self, what: str, check: Callable[[dict[str, NodeView]], bool], timeout: float) -> None:
        """Poll until `check(view)` holds; a failing look (the API server or the store busy) is a "not
        yet" and is named if the deadline passes."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while True:
            try:
                if check(self.poll()):
                    return
            except Exception as exc:  # noqa: BLE001 - any failure of a look means "not yet"
                last = exc
            if time.monotonic() >= deadline:
                seen = f" (last error: {last!r})" if last else ""
                raise TransientError(f"timed out after {timeout:.0f} s waiting for {what}{seen}")
            time.sleep(POLL_S)


def _pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def kernel_line(stack: DemoStack, node: str, message: str) -> None:
    """Append one kernel message to the node's log, in rsyslog's file format."""
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
    with stack.kernel_log(node).open("a", encoding="utf-8") as fh:
        fh.write(f"{stamp} {node} kernel: {message}\n")


def set_link(stack: DemoStack, node: str, up: bool) -> None:
    """The node's InfiniBand port mlx5_0/1 goes ACTIVE or DOWN (written whole, then renamed)."""
    state = stack.sysfs(node) / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state"
    tmp = state.with_suffix(".tmp")
    tmp.write_text("4: ACTIVE\n" if up else "1: DOWN\n")
    tmp.replace(state)


def training_pod(node: str) -> dict[str, Any]:
    """A pod holding the node's 8 GPUs that checkpoints within 5 s when asked to stop (its grace period,
    which the drain waits out)."""
    gpus = {"nvidia.com/gpu": "8"}
    trainer = {"name": "trainer", "image": "example.com/llm-train:latest",
               "resources": {"limits": gpus, "requests": gpus}}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "training-0", "namespace": WORKLOAD_NS, "labels": {"app": "training"}},
        "spec": {"nodeName": node, "restartPolicy": "Always", "terminationGracePeriodSeconds": 5,
                 "containers": [trainer]},
    }  # fmt: skip


def cases_for(nodes: list[str]) -> list[Case]:
    return [
        Case("XID 79 under a training pod", [nodes[0]], "XID-79", STEPS),
        Case("XID 13 burst (application errors)", nodes[1:4], "XID-13", ("detected",)),
        Case("NVSwitch fatal SXid", [nodes[4]], "SXID-24007", ("detected", "quarantined")),
        Case("flapping NIC", [nodes[5]], "NIC-LINK-FLAPPING", ("detected", "quarantined")),
    ]


def run(stack: DemoStack, obs: Observer, say: Callable[[str], None], *, timeout: float = 150.0) -> list[Case]:
    """The four cases in order; returns them with their steps' times. Raises when a case misses its
    expected steps within `timeout` (seconds, for the whole scenario)."""
    end = time.monotonic() + timeout
    obs.cases = cases_for(obs.nodes)
    xid79, xid13, nvswitch, nic = obs.cases
    core = kube.core(obs.api)
    with kube.client.translated("create", f"Namespace {WORKLOAD_NS}"):
        core.create_namespace({"metadata": {"name": WORKLOAD_NS}})  # type: ignore[arg-type]
    obs.wait(f"namespace {WORKLOAD_NS}'s ServiceAccount", lambda _: bool(
        core.read_namespaced_service_account("default", WORKLOAD_NS)), 30)  # fmt: skip
    with kube.client.translated("create", "Pod training-0"):
        core.create_namespaced_pod(WORKLOAD_NS, training_pod(xid79.nodes[0]))  # type: ignore[arg-type]
    obs.wait("the training pod running", lambda v: "training-0" in v[xid79.nodes[0]].pods, 30)

    def left() -> float:
        return max(1.0, end - time.monotonic())

    first = xid79.nodes[0]
    say(f"case 1: XID 79 on {first} GPU 3 (faultline sim inject --node {first} --gpu 3 --xid 79)")
    xid79.started = time.monotonic()
    simulator.inject(xid79.nodes[0], 3, kind="xid", value=79, directory=stack.sim_dir())
    obs.wait(
        "XID 79: quarantined and drained", lambda _: {"quarantined", "drained"} <= xid79.steps.keys(), left()
    )

    say(f"case 2: XID 13 on GPUs 0 and 1 of {', '.join(xid13.nodes)} (faultline sim inject ... --xid 13)")
    xid13.started = time.monotonic()
    for node in xid13.nodes:
        for gpu in (0, 1):
            simulator.inject(node, gpu, kind="xid", value=13, directory=stack.sim_dir())

    def decided(_: dict[str, NodeView]) -> bool:  # every XID 13 fault seen and passed by the quarantine
        read = obs.store.faults_of(xid13.nodes, stage=store.Stage.QUARANTINE)
        faults = [r for rs in read.values() for r in rs if r.code == "XID-13"]
        open_ = (store.State.PENDING, store.State.CLAIMED)
        return len(faults) == 2 * len(xid13.nodes) and all(
            r.work is not None and r.work.state not in open_ for r in faults)  # fmt: skip

    obs.wait("the XID 13 faults decided by the quarantine", decided, left())
    cordoned = [n for n in xid13.nodes if obs.view[n].cordoned]
    xid13.check = f"cordoned: {', '.join(cordoned) or 'none'}"
    xid13.ok = not cordoned

    say(f"case 3: NVSwitch SXid 24007 (Fatal) in {nvswitch.nodes[0]}'s kernel log")
    nvswitch.started = time.monotonic()
    kernel_line(stack, nvswitch.nodes[0], "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, "
                "Link 28 sourcetrack timeout error (First)")  # fmt: skip
    obs.wait("SXid: quarantined", lambda _: "quarantined" in nvswitch.steps, left())

    say(f"case 4: NIC mlx5_0/1 on {nic.nodes[0]} flaps (link down/up x3 in its sysfs)")
    nic.started = time.monotonic()
    for cycle in range(1, 4):
        set_link(stack, nic.nodes[0], up=False)
        obs.wait(f"link down {cycle} seen", lambda v: "NIC-LINK-DOWN" in v[nic.nodes[0]].faults, left())
        set_link(stack, nic.nodes[0], up=True)
        obs.wait(f"link up {cycle} seen", lambda v: "NIC-LINK-DOWN" not in v[nic.nodes[0]].faults, left())
    obs.wait("NIC flapping: quarantined", lambda _: {"detected", "quarantined"} <= nic.steps.keys(), left())

    for real in obs.real:  # the chart's agent as a real pod: image pulled, started, its probe passing
        case = Case("the chart's agent, a real pod", [real], "REAL-NODE", (), started=time.monotonic())
        obs.cases.append(case)
        say(f"real node {real}: waiting for the chart's agent pod to be Ready (its /healthz probe)")

        def agent_ready(v: dict[str, NodeView], real: str = real) -> bool:
            return any(p.startswith(f"{RELEASE}-agent-") for p in v[real].ready_pods)

        obs.wait(f"the agent pod Ready on {real}", agent_ready, left())
        pod = next(p for p in obs.view[real].ready_pods if p.startswith(f"{RELEASE}-agent-"))
        case.check, case.ok = f"pod {pod} Ready after {time.monotonic() - case.started:.1f} s", True

    say("waiting for the repairs in flight to finish")
    obs.wait("XID 79 released", lambda _: "released" in xid79.steps, left())
    with contextlib.suppress(TransientError):  # not an expected step: the timeline shows how far it got
        obs.wait("SXid released", lambda _: "released" in nvswitch.steps, min(left(), 60))
    return settle(obs.cases)


def settle(cases: list[Case]) -> list[Case]:
    """Each case without a verdict yet: whether it reached its expected steps."""
    for case in cases:
        if case.ok is None:
            case.ok = set(case.expect) <= case.steps.keys()
    return cases
