"""The node agents and the four workers of one scenario, as the real `faultline agent` and `faultline
worker ...` processes (so a SIGKILL is a real one), each in its own process group with its own log.

Agents run the simulated GPU backend (`--sim-dir`: the injector appends to each node's control file),
write to the store through the agents' proxy, keep their spool and recovery snapshots in a state
directory of their own (kept across a kill, as a hostPath is), and publish conditions with the admin
kubeconfig. Workers get one settings file each (the chaos timings below: shorter than the product's
defaults so a scenario converges in seconds, each one said in the file) and a new owner name at every
start, as a new pod would.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from devtools import procs
from devtools.chaos.plan import WORKERS, Knobs

JANITOR_NAMESPACE = "faultline-system"
JANITOR_ACCOUNT = "faultline-janitor"

# Worker settings for the chaos runs (field: value, as in a --config file). Leases of 15 s (default 30 s)
# so a killed worker's claims are taken over well inside the 60 s goal; a hold-down of 3 s (default
# 60 s) so a repaired node is released in seconds; no circuit breaker and no cap on repairs in flight
# (half the fleet is faulted on purpose, and an outage's backlog of repairs is the subject); resync and
# polls of about a second. Timeouts that only bound how long a failure takes to show (the janitor's
# reboot and validation waits) keep their defaults: a wait ends when its condition holds, and a shorter
# one turns slow reports after an outage into failed repairs and escalations.
WARNINGS_SHOWN = 12  # of each worker's log, in a report of a scenario that did not converge
LINE_SHOWN = 400  # characters of each such line

WORKER_SETTINGS: dict[str, dict[str, Any]] = {
    "quarantine": {"lease": "15s", "hold_down": "3s", "resync_interval": "1s", "threads": 8,
                   "breaker_max_share": None, "breaker_max_count": None, "breaker_max_held_share": None,
                   "breaker_max_held": 0},
    "drain": {"lease": "15s", "poll": "500ms", "resync_interval": "1s", "backoff_max": "2s", "threads": 8},
    "remediation": {"lease": "15s", "resync_interval": "1s"},
    "janitor": {"lease": "15s", "poll": "1s", "threads": 8, "max_repairs_in_flight": 0,
                "namespace": JANITOR_NAMESPACE, "service_account": JANITOR_ACCOUNT,
                "image": "registry.invalid/faultline:chaos"},
}  # fmt: skip


class Fleet:
    def __init__(
        self, work: Path, *, kubeconfig: Path, agent_uri: str, worker_uri: str, database: str, knobs: Knobs,
        janitor: Mapping[str, Any] | None = None, worker_env: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        """`janitor`: settings added to the janitor's (its cloud provider); `worker_env`: the workers'
        environment additions (the provider's credentials)."""
        self.work = work
        self.kubeconfig = kubeconfig
        self.agent_uri = agent_uri
        self.worker_uri = worker_uri
        self.database = database
        self.knobs = knobs
        self.janitor = dict(janitor or {})
        self.worker_env = dict(worker_env or {})
        self.sim_dir = work / "sim"
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.agents: dict[str, procs.Proc] = {}
        self.workers: dict[str, procs.Proc] = {}
        self.owners: dict[str, str] = {}
        self.ports: dict[str, int] = {}
        self.starts: dict[str, int] = {}  # process key -> times started
        self.pids: list[int] = []  # every process ever started (the caller checks none is left)

    # -- agents -----------------------------------------------------------------------------------------
    def start_agents(self, nodes: list[str], timeout: float = 120.0) -> None:
        """Start the nodes' agents at once and wait until each watches its GPUs."""
        for node in nodes:
            self._spawn_agent(node)
        for node in nodes:
            self._wait_agent(node, timeout)

    def restart_agent(self, node: str, timeout: float = 60.0) -> None:
        self._spawn_agent(node)
        self._wait_agent(node, timeout)

    def _spawn_agent(self, node: str) -> None:
        key = f"agent-{node}"
        n = self.starts[key] = self.starts.get(key, 0) + 1
        argv = [
            sys.executable, "-m", "faultline", "agent", "--node", node,
            "--mongodb-uri", self.agent_uri, "--database", self.database,
            "--kubeconfig", str(self.kubeconfig), "--sim-dir", str(self.sim_dir),
            "--state-dir", str(self.work / "agents" / node),
            "--snapshot-interval", f"{self.knobs.snapshot_s}s",
            "--repair-poll-interval", f"{self.knobs.repair_poll_s}s",
            "--repair-idle-poll-interval", f"{self.knobs.repair_idle_poll_s}s",
        ]  # fmt: skip
        # the log format from the environment: the agent starts without the CLI framework (`cli.agent`)
        log = self.work / "logs" / f"{key}.{n}.log"
        proc = procs.Proc(key, argv, log, env={"FAULTLINE_LOG_FORMAT": "json"})
        self.agents[node] = proc
        self.pids.append(proc.pid)

    def _wait_agent(self, node: str, timeout: float) -> None:
        proc = self.agents[node]
        procs.wait_for(f"the agent of {node}", lambda: "agent: watching" in _read(proc.log), timeout,
                       proc=proc, interval=0.2)  # fmt: skip

    def kill_agents(self, nodes: list[str]) -> None:
        for node in nodes:
            _kill(self.agents[node])

    # -- workers ----------------------------------------------------------------------------------------
    def spawn_workers(self) -> None:
        """Start the four workers (`wait_workers` waits until each serves /healthz)."""
        for name in WORKERS:
            self._spawn_worker(name)

    def wait_workers(self, timeout: float = 90.0) -> None:
        for name in WORKERS:
            self._wait_worker(name, timeout)

    def restart_worker(self, name: str, timeout: float = 60.0) -> None:
        self._spawn_worker(name)
        self._wait_worker(name, timeout)

    def _spawn_worker(self, name: str) -> None:
        n = self.starts[name] = self.starts.get(name, 0) + 1
        owner = f"{name}-{n}"
        port = procs.free_port()
        settings = {
            "mongodb_uri": self.worker_uri, "database": self.database, "kubeconfig": str(self.kubeconfig),
            "owner": owner, "metrics_port": port, "metrics_address": "127.0.0.1",
            **WORKER_SETTINGS[name], **(self.janitor if name == "janitor" else {}),
        }  # fmt: skip
        config = self.work / "config" / f"{name}.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump(settings, sort_keys=False))
        argv = [sys.executable, "-m", "faultline", "--log-format", "json", "worker", name,
                "--config", str(config)]  # fmt: skip
        proc = procs.Proc(owner, argv, self.work / "logs" / f"{owner}.log", env=self.worker_env)
        self.workers[name], self.owners[name], self.ports[name] = proc, owner, port
        self.pids.append(proc.pid)

    def _wait_worker(self, name: str, timeout: float) -> None:
        port = self.ports[name]
        procs.wait_for(f"the {name} worker", lambda: _healthy(port), timeout, proc=self.workers[name],
                       interval=0.2)  # fmt: skip

    def kill_worker(self, name: str) -> None:
        _kill(self.workers[name])

    def pause_worker(self, name: str, paused: bool) -> None:
        """SIGSTOP (or SIGCONT) the worker: frozen mid-line, as a kill would leave it."""
        os.killpg(self.workers[name].pid, signal.SIGSTOP if paused else signal.SIGCONT)

    # -- all --------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM to every process (agents write their last snapshot, workers finish their claims)."""
        for proc in [*self.workers.values(), *self.agents.values()]:
            if proc.alive():
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in [*self.workers.values(), *self.agents.values()]:
            proc.stop(timeout=25)

    def errors(self) -> dict[str, int]:
        """ERROR-level log lines of each process (a crash shows here)."""
        out = {}
        for path in sorted((self.work / "logs").glob("*.log")):
            count = sum(1 for line in _read(path).splitlines() if _level(line) in ("ERROR", "CRITICAL"))
            if count:
                out[path.name] = count
        return out

    def warnings(self, last: int = WARNINGS_SHOWN) -> dict[str, list[str]]:
        """The last WARNING-or-worse lines of each worker's log: what a scenario that did not converge
        reports where its kept logs cannot be read (a CI run's)."""
        out = {}
        for path in sorted((self.work / "logs").glob("*.log")):
            if path.name.startswith(WORKERS):
                lines = [line[:LINE_SHOWN] for line in _read(path).splitlines()
                         if _level(line) in ("WARNING", "ERROR", "CRITICAL")]  # fmt: skip
                if lines:
                    out[path.name] = lines[-last:]
        return out


def _kill(proc: procs.Proc) -> None:
    """SIGKILL to the process group: no handler runs, nothing is flushed or recorded."""
    proc.stop_signal = signal.SIGKILL
    proc.stop(timeout=5)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _level(line: str) -> str:
    if not line.startswith("{"):
        return "ERROR" if line.startswith("Traceback") else ""
    try:
        return str(json.loads(line).get("level", "")).upper()
    except ValueError:
        return ""


def _healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
        return bool(resp.status == 200)
