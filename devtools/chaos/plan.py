"""The chaos scenarios and their schedules (pure: no I/O, a seeded random generator).

Every scenario runs the same load on a fresh database: non-fatal XIDs (XID 14, action NONE) at a steady
rate on random GPUs of random nodes, and one fatal XID 79 (fell off the bus: cordon, drain, reboot) on
a share of the nodes, each node at most once, so every node's expected end state is known: the nodes
given a fatal fault are cordoned once, drained, rebooted once, validated and released; the others are
never touched. Part of the fatal faults come as a storm around the moment the scenario's fault is
injected, a moment drawn from the seed; the rest are spread over the load.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

NOISE_XID = 14  # "fake/injected error": fatal false, action NONE, no escalation in the catalogue
FATAL_XID = 79  # fell off the bus: fatal, RESTART_BM (a reboot)
GPUS = 8

WORKERS = ("quarantine", "drain", "remediation", "janitor")


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str  # none | agent-kill | worker-kill | ferretdb-kill | restart | outage | delay
    target: str = ""  # the worker, or the control-plane process, it hits
    what: str = ""


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("baseline", "none", what="the load alone"),
        Scenario("agent-kill", "agent-kill", what="SIGKILL of node agents in the middle of a burst"),
        *(Scenario(f"{w}-kill", "worker-kill", w, f"SIGKILL of the {w} worker holding a claim, restarted")
          for w in WORKERS),
        Scenario("ferretdb-kill", "ferretdb-kill", what="SIGKILL of FerretDB during a storm, restarted"),
        Scenario("apiserver-restart", "restart", "kube-apiserver", what="the API server restarted (SIGTERM)"),
        Scenario("etcd-restart", "restart", "etcd", what="etcd killed (SIGKILL) and restarted"),
        Scenario("store-outage", "outage", what="the store unreachable (partitioned), events keep coming"),
        Scenario("agent-store-delay", "delay", what="latency added between the agents and the store"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Knobs:
    """One run's sizes and times (seconds). `full()` is `make chaos`; `reduced()` the integration test."""

    nodes: int = 52
    pods_per_node: int = 2
    load_s: float = 60.0  # the steady load's length (longer where the fault lasts longer)
    noise_per_s: float = 4.0  # non-fatal events per second, over all nodes
    fatal_share: float = 0.5  # of the nodes, each given one fatal fault
    storm_share: float = 0.5  # of those, hit within `storm_s` around the fault's moment
    storm_s: float = 2.0
    fault_window: tuple[float, float] = (0.3, 0.5)  # the fault's moment, as shares of load_s
    victims_share: float = 0.1  # agent-kill: of the nodes (at least 2)
    burst: int = 60  # agent-kill: events written to each victim's GPUs right before the kill
    down_s: float = 2.0  # a killed process stays down this long before it is started again
    outage_s: float = 600.0  # store-outage
    delay_s: float = 0.3  # agent-store-delay: added each way
    delay_for_s: float = 60.0
    claim_wait_s: float = 30.0  # worker-kill: how long to wait for the worker to hold a claim
    converge_goal_s: float = 60.0
    converge_timeout_s: float = 240.0
    snapshot_s: float = 5.0  # the agents' recovery snapshots (the product default)
    repair_poll_s: float = 5.0  # the agents' reads of their node's verified repairs (the product default)
    repair_idle_poll_s: float = 30.0  # the same while none of its repairs is open (the product default)
    seed: int = 15

    @classmethod
    def full(cls, **changes: object) -> Knobs:
        return replace(cls(), **changes)  # type: ignore[arg-type]

    @classmethod
    def reduced(cls, **changes: object) -> Knobs:
        small = cls(
            nodes=10, load_s=12.0, noise_per_s=3.0, fatal_share=0.6, burst=40, down_s=1.0, outage_s=20.0,
            delay_for_s=10.0, claim_wait_s=15.0, converge_timeout_s=120.0, snapshot_s=2.0,
            repair_poll_s=2.0, repair_idle_poll_s=2.0,
        )  # fmt: skip
        return replace(small, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Injection:
    at: float  # seconds from the load's start
    node: str
    gpu: int
    xid: int

    @property
    def fatal(self) -> bool:
        return self.xid == FATAL_XID


@dataclass(frozen=True)
class Schedule:
    injections: tuple[Injection, ...]  # in time order
    fault_at: float  # when the scenario's fault is injected (from the load's start)
    load_end: float  # the last injection's time at the latest
    fatal: dict[str, int]  # node -> the GPU given its fatal fault
    victims: tuple[str, ...] = ()  # agent-kill: the agents killed


def load_length(scenario: Scenario, knobs: Knobs, fault_at: float) -> float:
    """The load runs on through faults that outlast it (the outage: events keep coming)."""
    if scenario.fault == "outage":
        return max(knobs.load_s, fault_at + knobs.outage_s + 2.0)
    if scenario.fault == "delay":
        return max(knobs.load_s, fault_at + knobs.delay_for_s + 2.0)
    return knobs.load_s


def schedule(scenario: Scenario, knobs: Knobs, nodes: list[str]) -> Schedule:
    """The scenario's events and fault moment, the same for the same seed, scenario and nodes."""
    rng = random.Random(f"{knobs.seed}/{scenario.name}/{len(nodes)}")  # noqa: S311 - a test schedule
    lo, hi = knobs.fault_window
    fault_at = round(rng.uniform(lo, hi) * knobs.load_s, 3)
    end = load_length(scenario, knobs, fault_at)
    fatal_nodes = rng.sample(nodes, max(1, round(knobs.fatal_share * len(nodes))))
    storm = set(fatal_nodes[: round(knobs.storm_share * len(fatal_nodes))])
    out: list[Injection] = []
    fatal: dict[str, int] = {}
    for node in fatal_nodes:
        if node in storm:
            at = fault_at - knobs.storm_s / 2 + rng.uniform(0, knobs.storm_s)
        else:
            at = rng.uniform(0.5, end - 0.5)
        gpu = rng.randrange(GPUS)
        fatal[node] = gpu
        out.append(Injection(round(max(0.0, at), 3), node, gpu, FATAL_XID))
    t = 0.0
    while knobs.noise_per_s > 0:
        t += rng.expovariate(knobs.noise_per_s)
        if t >= end:
            break
        out.append(Injection(round(t, 3), rng.choice(nodes), rng.randrange(GPUS), NOISE_XID))
    victims: tuple[str, ...] = ()
    if scenario.fault == "agent-kill":
        victims = tuple(sorted(rng.sample(nodes, max(2, round(knobs.victims_share * len(nodes))))))
        for i in range(knobs.burst):  # written in the 100 ms before the kill, 2 ms apart per node
            out.extend(Injection(round(fault_at - 0.1 + i * 0.1 / knobs.burst, 4), v, i % GPUS, NOISE_XID)
                       for v in victims)  # fmt: skip
    out.sort(key=lambda i: (i.at, i.node, i.gpu))
    return Schedule(tuple(out), fault_at, end, fatal, victims)
