"""A real Kubernetes control plane on loopback for tests and the demo.

etcd, kube-apiserver (secure port, generated PKI, RBAC on), kube-controller-manager and kube-scheduler
run as child processes on free loopback ports in a temporary directory; simulated GPU nodes come from
the fakelet, and as root `real_nodes` real ones (devtools.realnode: kubelet, containerd, runc, bridge CNI,
images from a loopback registry).  `stop()` (also on exceptions, Ctrl-C and interpreter exit) leaves no
process behind, and undoes what real nodes changed on the machine.

    with LocalCluster(nodes=4) as cluster:
        api = cluster.api()          # an admin API client
        cluster.kubeconfig           # admin kubeconfig path

    with LocalCluster(nodes=2, real_nodes=1) as cluster:
        cluster.real.image           # the project's image in the loopback registry, by digest
        cluster.expose(mongo_port)   # "<address>:<port>" at which pods reach 127.0.0.1:<port>

    with LocalCluster(nodes=50, audit_policy=POLICY) as cluster:   # the API server's audit log (JSON lines)
        cluster.audit_log            # appended to across restarts
        cluster.restart("etcd", sig=signal.SIGKILL)   # same flags, ports and data directory
"""

from __future__ import annotations

import json
import shutil
import signal
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from devtools import kubeconfig, procs, realnode, realnode_host, tools
from devtools.certs import LocalPKI

CONTROLLERS = (
    "garbage-collector-controller",
    "disruption-controller",
    "namespace-controller",
    "replicaset-controller",
    "deployment-controller",
    "daemonset-controller",
    "job-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "ttl-after-finished-controller",
    "pod-garbage-collector-controller",
    "clusterrole-aggregation-controller",
)
# With real nodes also: the chart's embedded store (a StatefulSet whose claim binds a PersistentVolume;
# the protection controllers lift the finalizers that keep a claim and its volume while in use) and the
# EndpointSlices kube-proxy routes Services by. Only then: on 2 cores they made a simulated cluster's
# start 1.1 s slower (median of 3, 5.4 -> 6.5 s with 5 nodes), for objects no simulated node runs.
REAL_NODE_CONTROLLERS = (
    "statefulset-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "endpointslice-controller",
)
SERVICE_CIDR = "10.0.0.0/24"


class LocalCluster:
    def __init__(
        self,
        nodes: int = 4,
        *,
        workdir: Path | None = None,
        node_prefix: str = "gpu-node",
        keep_workdir: bool = False,
        real_nodes: int = 0,
        real_prefix: str = "real-node",
        project_image: bool = True,
        audit_policy: dict[str, Any] | None = None,
    ) -> None:
        """`audit_policy`: an audit.k8s.io/v1 Policy (as a dict); the API server then writes the events it
        selects to `audit_log` (JSON lines)."""
        self.node_names = [f"{node_prefix}-{i:02d}" for i in range(1, nodes + 1)]
        self.real_node_names = [f"{real_prefix}-{i:02d}" for i in range(1, real_nodes + 1)]
        self.real: realnode.RealNodes | None = None
        self._project_image = project_image  # real nodes: push the project's image (make image) too
        self._own_dir = workdir is None
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="faultline-cluster-"))
        self.keep_workdir = keep_workdir
        self.procs: list[procs.Proc] = []
        self.fakelet: Any = None
        self.provisioner: Any = None  # devtools.volumes.Provisioner, with real nodes
        self._api: Any = None
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self.server = ""
        self.ready_seconds = 0.0
        self.audit_policy = audit_policy
        self.audit_log = self.dir / "logs" / "audit.jsonl"
        self._health: dict[str, Any] = {}  # process name -> its readiness check (restart waits for it)

    # -- start/stop ----------------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        started = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started
        return self

    def _start(self) -> None:
        if self.real_node_names:
            realnode_host.require_root()  # before anything starts: say so clearly
        tools.ensure("etcd", "kubernetes")
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        pki = LocalPKI(self.dir / "pki")
        self.pki = pki
        etcd_port, etcd_peer, api_port = procs.free_port(), procs.free_port(), procs.free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        etcd = self._spawn(
            "etcd",
            [
                str(tools.binary("etcd")),
                "--name",
                "default",
                "--data-dir",
                str(self.dir / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{etcd_peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{etcd_peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
                "--quota-backend-bytes",
                str(2 << 30),
            ],
        )
        self._health["etcd"] = lambda: _http_ok(f"http://127.0.0.1:{etcd_port}/health")
        procs.wait_for("etcd health", self._health["etcd"], 30, proc=etcd)
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(tools.binary("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={self.dir / 'pki'}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={self.server}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--allow-privileged=true",
                "--profiling=false",
                "--enable-priority-and-fairness=false",
                "--endpoint-reconciler-type=none",
                *self._kubelet_flags(pki),
                *self._audit_flags(),
            ],
        )
        self._admin_ssl = _ssl_context(pki.ca, pki.admin.cert, pki.admin.key)
        self._health["kube-apiserver"] = lambda: self._get("/readyz") == "ok"
        procs.wait_for("kube-apiserver /readyz", self._health["kube-apiserver"], 90, proc=apiserver)
        pki.kubeconfig(self.kubeconfig, self.server, pki.admin, "admin")
        kcm_cfg = pki.kubeconfig(self.dir / "kcm.kubeconfig", self.server, pki.controller_manager, "kcm")
        sched_cfg = pki.kubeconfig(self.dir / "scheduler.kubeconfig", self.server, pki.scheduler, "scheduler")
        self._spawn(
            "kube-controller-manager",
            [
                str(tools.binary("kube-controller-manager")),
                f"--kubeconfig={kcm_cfg}",
                f"--authentication-kubeconfig={kcm_cfg}",
                f"--authorization-kubeconfig={kcm_cfg}",
                f"--controllers={','.join(self._controllers())}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={procs.free_port()}",
                f"--root-ca-file={pki.ca}",
                f"--service-account-private-key-file={pki.sa_key}",
                "--use-service-account-credentials=true",
                "--node-monitor-period=1s",
                "--node-monitor-grace-period=12s",
                "--concurrent-gc-syncs=5",
                "--profiling=false",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(tools.binary("kube-scheduler")),
                f"--kubeconfig={sched_cfg}",
                f"--authentication-kubeconfig={sched_cfg}",
                f"--authorization-kubeconfig={sched_cfg}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={procs.free_port()}",
                "--profiling=false",
            ],
        )
        from devtools.fakelet import Fakelet  # noqa: PLC0415 - imports the Kubernetes client

        self.fakelet = Fakelet(self.api(), self.node_names, kubeconfig=self.kubeconfig)
        self.fakelet.start()
        procs.wait_for("default ServiceAccount", self._has_default_sa, 60)
        procs.wait_for("nodes Ready", self._nodes_ready, 60)
        if self.real_node_names:
            self.real = realnode.RealNodes(
                self.dir / "real", server=self.server, pki=pki, names=self.real_node_names,
                project_image=self._project_image,
            )  # fmt: skip
            self.real.start()
            self.real.wait_ready(self._nodes_ready)
            self.real.start_proxy()
            from devtools.volumes import Provisioner  # noqa: PLC0415 - devtools.volumes imports this module

            # the default StorageClass, provided on demand on the first real node (as local-path would)
            self.provisioner = Provisioner(self.api(), self.real.dir / "volumes", self.real_node_names[0])
            self.provisioner.start()

    def _controllers(self) -> tuple[str, ...]:
        return CONTROLLERS + (REAL_NODE_CONTROLLERS if self.real_node_names else ())

    def _kubelet_flags(self, pki: LocalPKI) -> list[str]:
        """How the API server reaches real kubelets (logs, exec): their node IP, its client certificate."""
        if not self.real_node_names:
            return []
        return [
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki.kubelet_client.cert}",
            f"--kubelet-client-key={pki.kubelet_client.key}",
        ]

    def _audit_flags(self) -> list[str]:
        if self.audit_policy is None:
            return []
        policy = self.dir / "audit-policy.json"  # JSON is YAML: the API server reads either
        policy.write_text(json.dumps(self.audit_policy))
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                "--audit-log-maxsize=0", "--audit-log-mode=blocking"]  # fmt: skip

    def restart(self, name: str, *, sig: signal.Signals = signal.SIGTERM, timeout: float = 90.0) -> float:
        """Stop one control-plane process (`etcd`, `kube-apiserver`, `kube-controller-manager`,
        `kube-scheduler`) with `sig` and start it again with the same flags, so on the same ports and data
        directory; wait until it serves (etcd /health, the API server /readyz). Returns the seconds it
        took from the signal."""
        index = next((i for i, p in enumerate(self.procs) if p.name == name), None)
        if index is None:
            raise ValueError(f"no control-plane process {name!r} (one of {[p.name for p in self.procs]})")
        started = time.monotonic()
        old = self.procs[index]
        old.stop_signal = sig
        old.stop()
        new = procs.Proc(name, old.argv, old.log)
        self.procs[index] = new
        check = self._health.get(name)
        if check is not None:
            procs.wait_for(f"{name} serving again", check, timeout, proc=new)
        return time.monotonic() - started

    def expose(self, port: int) -> str:
        """`address:port` at which pods on the real nodes reach 127.0.0.1:`port` (the store, say)."""
        if self.real is None:
            raise RuntimeError("expose() is for real nodes: start the cluster with real_nodes")
        return self.real.expose(port)

    def stop(self) -> None:
        real_error: Exception | None = None
        if self.provisioner is not None:
            self.provisioner.stop()
            self.provisioner = None
        if self.real is not None:
            real, self.real = self.real, None
            try:
                real.stop()
            except Exception as exc:  # noqa: BLE001 - the control plane still stops; raised below
                real_error = exc
        if self.fakelet is not None:
            self.fakelet.stop()
            self.fakelet = None
        if self._api is not None:
            self._api.close()
            self._api = None
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()
        if real_error is not None:  # something may still be mounted under the directory: keep it
            raise real_error
        if self._own_dir and not self.keep_workdir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- helpers -------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> procs.Proc:
        proc = procs.Proc(name, argv, self.dir / "logs" / f"{name}.log")
        self.procs.append(proc)
        return proc

    def _get(self, path: str) -> str:
        return _fetch(self.server + path, self._admin_ssl)

    def api(self) -> Any:
        """The admin API client (one, shared)."""
        if self._api is None:
            from faultline import kube  # noqa: PLC0415

            self._api = kube.api_client(self.kubeconfig)
        return self._api

    def _has_default_sa(self) -> bool:
        return '"name":"default"' in self._get("/api/v1/namespaces/default/serviceaccounts/default").replace(
            " ", ""
        )

    def _nodes_ready(self) -> bool:
        nodes = json.loads(self._get("/api/v1/nodes"))["items"]
        ready = {
            n["metadata"]["name"]
            for n in nodes
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
        }
        return set(self.node_names) | set(self.real_node_names if self.real else ()) <= ready

    def service_account_kubeconfig(self, namespace: str, name: str, *, seconds: int = 3600) -> Path:
        """A kubeconfig that acts as the ServiceAccount `namespace/name` (bound token, for RBAC tests)."""
        from faultline import kube  # noqa: PLC0415

        token = kube.tokens.mint(self.api(), namespace, name, seconds=seconds)
        return kubeconfig.write(
            self.dir / f"sa-{namespace}-{name}.kubeconfig",
            self.server,
            self.pki.ca,
            f"{namespace}-{name}",
            {"token": token},
        )

    def service_account_mount(
        self, namespace: str, name: str, directory: Path, *, seconds: int = 3600
    ) -> dict[str, str]:
        """What a pod of the ServiceAccount `namespace/name` has instead of a kubeconfig: its bound token and
        the cluster's CA in `directory` (made here, as the kubelet mounts them), and the environment that
        points faultline's clients there (`KUBERNETES_SERVICE_HOST/PORT`, `FAULTLINE_SERVICE_ACCOUNT_DIR`)."""
        from faultline import kube  # noqa: PLC0415

        directory.mkdir()
        (directory / "token").write_text(kube.tokens.mint(self.api(), namespace, name, seconds=seconds))
        (directory / "ca.crt").write_bytes(self.pki.ca.read_bytes())
        host, port = self.server.removeprefix("https://").rsplit(":", 1)
        return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
                "FAULTLINE_SERVICE_ACCOUNT_DIR": str(directory)}  # fmt: skip


def connections_opened(api: Any) -> int:
    """The connections an API client (`faultline.kube.api_client`) has opened to the API server so far."""
    manager = api.rest_client.pool_manager
    # urllib3's container of pools is not iterable itself (it says so), only its keys()
    return sum(manager.pools[key].num_connections for key in manager.pools.keys())  # noqa: SIM118


def _ssl_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def _fetch(url: str, context: ssl.SSLContext | None = None) -> str:
    """GET a loopback URL; an HTTP error status raises (after closing its connection)."""
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as resp:  # noqa: S310 - our own servers
            return str(resp.read().decode())
    except urllib.error.HTTPError as exc:
        exc.close()
        raise


def _http_ok(url: str) -> bool:
    return '"health":"true"' in _fetch(url).replace(" ", "")
