"""`faultline demo`'s infrastructure: the local control plane with simulated GPU nodes, FerretDB, the whole
chart installed by Helm with every worker on, and the chart's agent and workers run as local processes.

On simulated nodes the chart's pods are only objects (the fake kubelet marks them Running; it executes
nothing), so `DemoStack` runs each of them the way a kubelet would, from what the API server holds: the
container's `args`, its environment (the store's URI from the chart's Secret, NODE_NAME from the downward
API), its ServiceAccount (a kubeconfig with a token minted for it) and its volumes (the ConfigMap holding
the component's settings file, written to a local directory; hostPaths under a directory that plays the
node's root). What differs from a pod, and why: one process per worker (the chart runs two replicas);
each metrics port is a free one (the pods' 9400 would collide on one machine); the simulated node keeps
its kernel log in a syslog file the demo writes, not a journal (so `journal_dir` is unset and
`syslog_file` set in the agent's file). The demo's tuning (hold-down, polls, leases) is in the Helm values
(`DEMO_VALUES`), which the chart writes into the settings files: no code path is changed for the demo.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devtools import procs, tools
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo

CHART = Path(__file__).resolve().parents[1] / "charts" / "faultline"
RELEASE = "faultline"
NAMESPACE = "faultline-system"
WORKERS = ("quarantine", "drain", "remediation", "janitor")
CONFIG_DIR = "/etc/faultline/config"

# The demo's settings, through the chart's values (each lands in the component's settings file): short
# polls, leases and hold-down so the scenario runs in minutes. Six simulated nodes, three quarantined by
# the scenario: the breaker's shares are 0.7 (at the default 0.1 a second quarantine would trip it, and it
# would wait for a person's `faultline breaker reset`).
DEMO_VALUES: dict[str, Any] = {
    "agent": {
        "gpuBackend": "sim",
        # the simulated nodes' agents are local processes, not pods: their tokens carry no node, which the
        # agents' node policy requires (a real node's agent, with --real-node, is a pod either way)
        "nodePolicy": False,
        "config": {
            "gpu_poll_interval": "500ms",
            "repair_poll_interval": "500ms",
            "repair_idle_poll_interval": "2s",
            "nic_interval": "200ms",
            "snapshot_interval": "2s",
        },
    },
    "quarantine": {
        "enabled": True,
        "holdDown": "3s",
        "breaker": {"maxShare": 0.7, "maxHeldShare": 0.7},
        "config": {"lease": "10s", "resync_interval": "500ms"},
    },
    # gpuOnly: the drain moves the GPU workload only (faultline's own worker pods, scheduled on these GPU
    # nodes for want of others, would each hold the drain for their 30 s termination grace period)
    "drain": {
        "enabled": True,
        "gpuOnly": True,
        "config": {"lease": "10s", "poll": "300ms", "resync_interval": "500ms"},
    },
    "remediation": {"enabled": True, "config": {"lease": "10s", "resync_interval": "500ms"}},
    "janitor": {
        "enabled": True,
        "rebootTimeout": "60s",
        "validateTimeout": "45s",
        "config": {"lease": "10s", "poll": "300ms"},
    },
}


def store_values(uri: str, chart: Path = CHART) -> dict[str, Any]:
    """Point the chart at the demo's FerretDB: `store.external.uri` (a chart that can bring its own
    store), or `mongodb.uri` (an earlier chart)."""
    defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    if "store" in defaults:
        return {"store": {"external": {"uri": uri}}}
    return {"mongodb": {"uri": uri}}


@dataclass
class Component:
    """One of the chart's pods, run as a local process."""

    name: str  # "agent/gpu-node-01", "quarantine"
    proc: procs.Proc
    metrics_port: int


@dataclass
class DemoStack:
    nodes: int = 6
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="faultline-demo-")))
    cluster: LocalCluster | None = None
    mongo: LocalMongo | None = None
    components: list[Component] = field(default_factory=list)
    sa_seconds: int = 6 * 3600
    real_node: bool = False  # add a real kubelet node (root): the chart's pods run there for real

    # -- start / stop --------------------------------------------------------------------------------
    def start(self, say: Any = print) -> DemoStack:
        try:
            tools.ensure("helm")  # the cluster and the store build (or find) their own
            say(f"starting the local control plane with {self.nodes} simulated GPU nodes")
            if self.real_node:
                say("and a real kubelet node (containerd, runc) pulling the project's image from a loopback "
                    "registry")  # fmt: skip
            real = 1 if self.real_node else 0
            self.cluster = LocalCluster(nodes=self.nodes, workdir=self.dir / "cluster", real_nodes=real)
            self.cluster.start()
            say("starting FerretDB (the store)")
            self.mongo = LocalMongo(workdir=self.dir / "store").start()
            say(f"helm install {RELEASE} charts/faultline (every worker on) into {NAMESPACE}")
            self._helm_install()
            for node in self.cluster.node_names:
                self._node_root(node)
            also = " (on the real node the chart's pods run for real)" if self.real_node else ""
            say(
                "simulated nodes execute no pod: the chart's agent (one per simulated node) and its four "
                f"workers run as local processes, each as its ServiceAccount with its settings file{also}"
            )
            self._run_components()
            say(f"processes: {' '.join(map(str, self.pids()))} (work directory {self.dir})")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for c in self.components:  # all at once: each hands back its claims on SIGTERM
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGTERM)
        for c in self.components:
            c.proc.stop(timeout=25)
        self.components.clear()
        if self.mongo is not None:
            self.mongo.stop()
            self.mongo = None
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            cluster.stop()  # a real node that could not undo its mounts raises: the directory stays
        if not _mounted_under(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        """Every process this stack started (for `--keep`'s state file and the tests)."""
        own = [c.proc.pid for c in self.components]
        if self.cluster is not None:
            own += [p.pid for p in self.cluster.procs]
        if self.mongo is not None and self.mongo.proc is not None:
            own.append(self.mongo.proc.pid)
        return own

    # -- the node's files the demo writes --------------------------------------------------------------
    def node_root(self, node: str) -> Path:
        return self.dir / "nodes" / node

    def sim_dir(self) -> Path:
        return self.dir / "sim"

    def kernel_log(self, node: str) -> Path:
        return self.node_root(node) / "var" / "log" / "kern.log"

    def sysfs(self, node: str) -> Path:
        """The node's /sys as the agent sees it (the chart's sysfsRoot, a read-only mount of the host's)."""
        return self.node_root(node) / "sys"

    def _node_root(self, node: str) -> None:
        self.kernel_log(node).parent.mkdir(parents=True, exist_ok=True)
        self.kernel_log(node).touch()
        port = self.sysfs(node) / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
        (port / "counters").mkdir(parents=True, exist_ok=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "counters" / "link_downed").write_text("0\n")

    # -- helm ----------------------------------------------------------------------------------------
    def _helm_install(self) -> None:
        assert self.cluster is not None
        assert self.mongo is not None
        values = self.dir / "demo-values.yaml"
        chosen = {**DEMO_VALUES, **store_values(self.store_uri()), **self._real_values()}
        values.write_text(yaml.safe_dump(chosen))
        argv = [str(tools.binary("helm")), "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--create-namespace", "--kubeconfig", str(self.cluster.kubeconfig),
                "-f", str(values)]  # fmt: skip
        env = {**os.environ, "HELM_CACHE_HOME": str(self.dir / "helm" / "cache"),
               "HELM_CONFIG_HOME": str(self.dir / "helm" / "config"),
               "HELM_DATA_HOME": str(self.dir / "helm" / "data")}  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=120)  # noqa: S603
        if done.returncode:
            raise RuntimeError(f"helm install failed: {done.stderr.strip()}")

    def store_uri(self) -> str:
        """The store as the chart's components reach it: on loopback, or with a real node at the address
        its pods reach it by (which the host reaches too)."""
        assert self.mongo is not None
        if self.cluster is None or self.cluster.real is None:
            return self.mongo.uri
        return f"mongodb://{self.cluster.expose(self.mongo.port)}/?retryWrites=false&directConnection=true"

    def _real_values(self) -> dict[str, Any]:
        """With a real node: the project's image by digest from the loopback registry, the agent on every
        node (the real one has no GPU label) with its host paths under the demo's directory (the real node
        is this machine: the chart's defaults would leave /var/lib/faultline and /run/faultline behind),
        and repair Jobs that only record what they would do (a Job on the real node must never reboot
        this machine)."""
        if self.cluster is None or self.cluster.real is None:
            return {}
        repository, _, digest = self.cluster.real.image.partition("@")
        host = self.dir / "h"  # the agent's hostPaths on this machine, removed with the demo (short: the
        # simulated nodes' agents nest the same paths under their own directory, and a socket's path
        # must stay under 108 bytes)
        agent = {  # on every node, the real one (no GPU label) too
            **DEMO_VALUES["agent"], "nodeSelector": {"kubernetes.io/os": "linux"},
            "stateDir": str(host / "state"), "ingestSocket": str(host / "ingest.sock"),
        }  # fmt: skip
        record = {**DEMO_VALUES["janitor"]["config"], "record_only": True}
        janitor = {**DEMO_VALUES["janitor"], "config": record}
        return {"image": {"repository": repository, "digest": digest}, "agent": agent, "janitor": janitor}

    # -- the chart's pods as processes ------------------------------------------------------------------
    def _run_components(self) -> None:
        from faultline import kube  # noqa: PLC0415 - the Kubernetes client only when started

        assert self.cluster is not None
        api = self.cluster.api()
        agent = kube.apps(api).read_namespaced_daemon_set(f"{RELEASE}-agent", NAMESPACE).to_dict()
        for node in self.cluster.node_names:
            self.components.append(
                self._launch(api, f"agent/{node}", agent["spec"]["template"]["spec"], node)
            )
        for worker in WORKERS:
            dep = kube.apps(api).read_namespaced_deployment(f"{RELEASE}-{worker}", NAMESPACE).to_dict()
            self.components.append(self._launch(api, worker, dep["spec"]["template"]["spec"], None))
        for c in self.components:
            port = c.metrics_port
            procs.wait_for(f"{c.name} /healthz", lambda port=port: _healthy(port), 90, proc=c.proc)  # type: ignore[misc]

    def _launch(self, api: Any, name: str, pod: dict[str, Any], node: str | None) -> Component:
        from faultline import kube  # noqa: PLC0415

        assert self.cluster is not None
        container = pod["containers"][0]
        home = self.dir / "pods" / name.replace("/", "-")
        mounts: dict[str, Path] = {}  # container path -> local path
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        for mount in container.get("volume_mounts") or []:
            volume, local = volumes[mount["name"]], home / "volumes" / mount["name"]
            if volume.get("config_map"):
                cm = kube.core(api).read_namespaced_config_map(volume["config_map"]["name"], NAMESPACE)
                local.mkdir(parents=True, exist_ok=True)
                for file, text in (cm.data or {}).items():
                    (local / file).write_text(text)
            elif volume.get("secret"):  # the evidence key: the Secret's items as files
                secret = kube.core(api).read_namespaced_secret(volume["secret"]["secret_name"], NAMESPACE)
                local.mkdir(parents=True, exist_ok=True)
                data = secret.data or {}
                for item in volume["secret"].get("items") or [{"key": k, "path": k} for k in data]:
                    (local / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
            elif volume.get("host_path") and node is not None:  # the node's file system
                local = self.node_root(node) / volume["host_path"]["path"].lstrip("/")
                if volume["host_path"].get("type") != "File":
                    local.mkdir(parents=True, exist_ok=True)
            else:  # emptyDir
                local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mount_path"]] = local
        port = procs.free_port()
        config = Path(_local(_flag(container["args"], "--config"), mounts))
        settings = yaml.safe_load(config.read_text()) or {}
        settings = {k: str(_local(v, mounts)) if isinstance(v, str) else v for k, v in settings.items()}
        settings["metrics_port"] = port
        if node is not None:  # the simulated node's kernel log is a file the demo writes, not a journal
            settings.pop("journal_dir", None)
            settings["syslog_file"] = str(self.kernel_log(node))
            settings["syslog_trusted"] = True  # only the demo's simulated kernel writes that file
            settings["sim_dir"] = str(self.sim_dir())
        config.write_text(yaml.safe_dump(settings))
        token = self.cluster.service_account_kubeconfig(NAMESPACE, pod["service_account_name"],
                                                        seconds=self.sa_seconds)  # fmt: skip
        # the log format by the environment: the agent starts without the command line's global options
        env = {"KUBECONFIG": str(token), "FAULTLINE_LOG_FORMAT": "json"}
        for var in container.get("env") or []:
            env[var["name"]] = self._env_value(api, var, node)
        args = [f"--config={config}" if a.startswith("--config=") else a for a in container["args"]]
        log = self.dir / "logs" / f"{name.replace('/', '-')}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "faultline", *args]
        return Component(name, procs.Proc(name, argv, log, env=env), port)

    def _env_value(self, api: Any, var: dict[str, Any], node: str | None) -> str:
        from faultline import kube  # noqa: PLC0415

        if var.get("value") is not None:
            return str(var["value"])
        source = var.get("value_from") or {}
        if (source.get("field_ref") or {}).get("field_path") == "spec.nodeName" and node is not None:
            return node
        if source.get("secret_key_ref"):
            ref = source["secret_key_ref"]
            secret = kube.core(api).read_namespaced_secret(ref["name"], NAMESPACE)
            return base64.b64decode((secret.data or {})[ref["key"]]).decode()
        return ""


def _local(path: str, mounts: dict[str, Path]) -> Any:
    """A container path under one of the mounts, as the local path (other values unchanged)."""
    for mount_path, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            return local / path[len(mount_path) :].lstrip("/")
    return path


def _mounted_under(directory: Path) -> bool:
    """Whether anything is mounted under `directory` (never remove through a mount)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    return any(line.split()[1].startswith(f"{directory}/") for line in mounts if len(line.split()) > 1)


def _flag(args: list[str], name: str) -> str:
    return next(a.removeprefix(f"{name}=") for a in args if a.startswith(f"{name}="))


def _healthy(port: int) -> bool:
    import urllib.request  # noqa: PLC0415

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
        return bool(resp.status == 200)
