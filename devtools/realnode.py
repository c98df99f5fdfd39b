"""Real nodes for the local cluster: a real kubelet with containerd, runc and bridge CNI, running real pods
pulled from a loopback registry, beside the simulated ones. Needs root.

    nodes = RealNodes(workdir, server=..., pki=..., names=["real-node-01"], services={...})
    nodes.start()     # registry + pause image, host networking, then per node containerd and kubelet
    nodes.stop()      # processes, containers, mounts, cgroups, iptables, bridge, addresses: all undone

Networking: each node's IP is a /32 on `lo` (kubelet refuses loopback addresses); pods sit on one bridge
(Debian's CNI plugins: bridge + host-local + loopback, no masquerading, so no iptables rules of theirs);
the API server (127.0.0.1:PORT) is reached from pods at the `kubernetes` Service's address 10.0.0.1:443 and
any other loopback service through `expose` at the bridge's address, by DNAT (devtools.realnode_host).

Services, as in a real cluster: the real kube-proxy (iptables mode; one for the set, as the nodes share
the machine's network) routes every Service's cluster IP to its endpoints, for pods and for the host
(a test reads a Service from here). `masqueradeAll`: the pods share one bridge and no `br_netfilter`
is loaded, so a reply from a pod on the bridge would go straight back to the client, past the address
translation; masqueraded, the reply returns through the host. Names: `devtools.clusterdns` answers
`<service>.<namespace>.svc.cluster.local` on the bridge's address, the kubelet's `clusterDNS`. Only one
set of real nodes on the machine runs kube-proxy at a time (its chains have fixed names): a set started
while another's runs has no Service routing and says why in `proxy_off`.

Why these kubelet settings (see ../shared/notes/real-node.md): this machine has cgroup v1 and swap rules
kubelet 1.37 refuses by default (failCgroupV1, failSwapOn), no systemd cgroup driver (cgroupfs), and
nothing to reserve for (no QoS cgroups, no allocatable enforcement, no eviction, no image GC). containerd
runs with
`restrict_oom_score_adj` (no CAP_SYS_RESOURCE here) and its netns mounts under its state directory.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path

from devtools import clusterdns, procs, realnode_host, realnode_proxy, tools
from devtools.certs import LocalPKI
from devtools.registry import LocalRegistry
from faultline.errors import ConfigError, TransientError

SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service (first address of the cluster's service range)
CLUSTER_DOMAIN = "cluster.local"
LABEL = "faultline.io/real-node"
CNI_BIN = Path("/usr/lib/cni")


class RealNodes:
    def __init__(
        self, workdir: Path, *, server: str, pki: LocalPKI, names: list[str], project_image: bool = True
    ) -> None:
        self.dir = workdir
        self.server = server
        self.pki = pki
        self.names = list(names)  # its own: `add_node` adds to it, not to the caller's
        self.project_image = project_image
        self.registry = LocalRegistry(workdir / "registry")
        self.state: realnode_host.HostState | None = None
        self.procs: list[procs.Proc] = []
        self.image = ""  # the project's image in the registry (when pushed)
        self.store_images: dict[str, str] = {}  # the embedded store's images there, by name (when pushed)
        self.pause = ""
        self.ips: dict[str, str] = {}
        self.dns: clusterdns.ClusterDNS | None = None
        self.proxy_off = "not started"  # why Services are not routed ("" while kube-proxy runs)

    # -- start/stop ----------------------------------------------------------------------------------
    def start(self) -> None:
        realnode_host.require_root()
        if not (CNI_BIN / "bridge").exists():
            raise ConfigError(
                f"{CNI_BIN}/bridge is missing: real nodes need Debian's CNI plugins (make system-deps)"
            )
        tools.ensure("kubernetes", "containerd", "runc", "pause", "crane")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state = realnode_host.claim(self.dir)
        self.registry.start()
        assert self.registry.proc is not None
        realnode_host.record_pid(self.state, self.registry.proc.pid)
        self.pause = self.registry.push_pause_image()
        if self.project_image:
            self.image = self.registry.push_project_image()
            self.store_images = self.registry.store_refs()  # pushed with it when built (make image-store)
        realnode_host.add_bridge(self.state)
        realnode_host.add_chain(self.state)
        api_port = int(self.server.rsplit(":", 1)[1])
        realnode_host.dnat(self.state, SERVICE_IP, 443, api_port)
        admin = ssl.create_default_context(cafile=str(self.pki.ca))
        admin.load_cert_chain(str(self.pki.admin.cert), str(self.pki.admin.key))
        reader = clusterdns.api_reader(self.server, admin)
        self.dns = clusterdns.ClusterDNS(self.state.gateway, reader, domain=CLUSTER_DOMAIN).start()
        realnode_host.record_sysctls(self.state)
        for i, name in enumerate(self.names):
            ip = realnode_host.node_ip(self.state.slot, i)
            realnode_host.add_address(self.state, ip)
            self.ips[name] = ip
            self._start_node(name, ip)

    def add_node(self, name: str) -> None:
        """Start one more real node in the set (its own kubelet and containerd, on the set's bridge; a set
        holds 4 at most): a test that needs pods on two machines. `remove_node` stops it; the set's stop
        undoes what it left on the machine."""
        assert self.state is not None, "start() first"
        if len(self.names) >= 4:
            raise ConfigError("a set of real nodes holds 4 at most (each takes a quarter of its /24)")
        self.names.append(name)
        ip = realnode_host.node_ip(self.state.slot, len(self.names) - 1)
        realnode_host.add_address(self.state, ip)
        self.ips[name] = ip
        self._start_node(name, ip)

    def remove_node(self, name: str) -> None:
        """Stop a node `add_node` started (its kubelet, then its containerd); its Node object is the
        caller's to delete. Its pods should be gone first: what containers stay are removed at `stop`."""
        for proc in [p for p in self.procs if p.name in (f"kubelet-{name}", f"containerd-{name}")]:
            proc.stop(timeout=5)
            self.procs.remove(proc)

    def expose(self, port: int) -> str:
        """Make 127.0.0.1:port reachable from pods (and the host) as <bridge address>:port."""
        assert self.state is not None, "start() first"
        realnode_host.dnat(self.state, self.state.gateway, port, port)
        return f"{self.state.gateway}:{port}"

    def start_proxy(self) -> None:
        """kube-proxy for the set, once its nodes are registered (it reads its Node), unless another set
        on the machine runs one (then `proxy_off` says so). Returns when it has synced the rules once."""
        assert self.state is not None, "start() first"
        self.proxy_off = realnode_host.claim_proxy(self.state)
        if self.proxy_off:
            return
        d = self.dir / "kube-proxy"
        d.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.pki.kubeconfig(d / "kubeconfig", self.server, self.pki.proxy, "system:kube-proxy")
        health = procs.free_port()
        node = self.names[0]
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": node,
            "bindAddress": self.ips[node],
            "healthzBindAddress": f"127.0.0.1:{health}",
            "metricsBindAddress": f"127.0.0.1:{procs.free_port()}",
            "mode": "iptables",
            "clusterCIDR": str(realnode_host.pod_subnet(self.state.slot)),
            "nodePortAddresses": [f"{ip}/32" for ip in self.ips.values()],
            # route_localnet stays as it is (no NodePorts on 127.0.0.1)
            "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
            # 0: the machine's conntrack table size and timeouts stay as they are
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        path = d / "config.yaml"
        path.write_text(json.dumps(config, indent=1))
        proxy = self._spawn(
            "kube-proxy",
            [str(tools.binary("kube-proxy")), f"--config={path}", "--v=1"],
            d / "kube-proxy.log",
            env={"PATH": str(realnode_proxy.ipv4_tools(d / "bin"))},  # no ip6tables: IPv4 only
        )
        procs.wait_for(
            "kube-proxy synced", lambda: _answers(f"http://127.0.0.1:{health}/healthz"), 60, proc=proxy
        )

    def stop(self) -> None:
        for proc in reversed(self.procs):  # kube-proxy, then kubelet: it stops no pods on exit, cleanup does
            proc.stop(timeout=5)
        self.procs.clear()
        if self.dns is not None:
            self.dns.stop()
            self.dns = None
        self.registry.stop()
        if self.state is not None:
            realnode_host.cleanup(self.state)
            self.state = None

    def trust_registry(self, address: str) -> None:
        """Let every node pull from the registry at `address` over HTTPS (its certificate not verified: a
        test's own CA). containerd reads a host's hosts.toml at each pull, so this holds at once."""
        for name in self.names:
            hosts = self.dir / name / "certs.d" / address
            hosts.mkdir(parents=True, exist_ok=True)
            (hosts / "hosts.toml").write_text(
                f'server = "https://{address}"\n[host."https://{address}"]\n'
                '  capabilities = ["pull", "resolve"]\n  skip_verify = true\n'
            )

    # -- one node ------------------------------------------------------------------------------------
    def _start_node(self, name: str, ip: str) -> None:
        assert self.state is not None
        d = self.dir / name
        for sub in ("containerd", "kubelet", "logs", "certs.d", "cni/net.d", "cni/ipam", "runc"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        sock = d / "containerd" / "containerd.sock"
        self._containerd_config(d)
        self._cni_config(d)
        path = f"{tools.bin_dir()}:{CNI_BIN}:/usr/sbin:/usr/bin:/sbin:/bin"
        containerd = self._spawn(
            f"containerd-{name}",
            [str(tools.binary("containerd")), "--config", str(d / "containerd.toml")],
            d / "logs" / "containerd.log",
            env={"PATH": path},
        )
        procs.wait_for(f"containerd of {name}", sock.exists, 30, proc=containerd)
        user = f"system:node:{name}"
        kubeconfig = self.pki.kubeconfig(d / "kubelet.kubeconfig", self.server, self.pki.node(name), user)
        config = self._kubelet_config(d, ip, sock)
        self._spawn(
            f"kubelet-{name}",
            [
                str(tools.binary("kubelet")),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={d / 'kubelet'}",
                f"--cert-dir={d / 'kubelet' / 'pki'}",
                f"--hostname-override={name}",
                f"--node-ip={ip}",
                f"--node-labels={LABEL}=true",
                "--v=1",
            ],
            d / "logs" / "kubelet.log",
            env={"PATH": path},
        )

    def _spawn(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> procs.Proc:
        proc = procs.Proc(name, argv, log, env=env)
        self.procs.append(proc)
        return proc

    def wait_ready(self, ready: object, timeout: float = 90) -> None:
        """Poll `ready()` (the cluster's view of the nodes) while checking every node process lives."""

        def check() -> bool:
            dead = [p for p in self.procs if not p.alive()]
            if dead:
                raise TransientError(f"{dead[0].name} exited ({dead[0].popen.returncode}):\n{dead[0].tail()}")
            return bool(ready())  # type: ignore[operator]

        try:
            procs.wait_for("real nodes Ready", check, timeout)
        except TransientError as exc:
            tails = "\n".join(f"--- {p.name}\n{p.tail(15)}" for p in self.procs)
            raise TransientError(f"{exc}\n{tails}") from None

    def _containerd_config(self, d: Path) -> None:
        cri = "plugins.'io.containerd.cri.v1"
        registry_host = self.registry.address
        hosts = d / "certs.d" / registry_host
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts.toml").write_text(
            f'server = "http://{registry_host}"\n[host."http://{registry_host}"]\n'
            '  capabilities = ["pull", "resolve"]\n  skip_verify = true\n'
        )
        runc = tools.binary("runc")
        (d / "containerd.toml").write_text(
            f"""version = 3
root = "{d / "containerd" / "root"}"
state = "{d / "containerd" / "state"}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.blockfile", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{d / "containerd" / "containerd.sock"}"
[ttrpc]
  address = "{d / "containerd" / "containerd.sock.ttrpc"}"
[{cri}.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [{cri}.runtime'.containerd]
    default_runtime_name = "runc"
    [{cri}.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{d / "runc"}"
        SystemdCgroup = false
  [{cri}.runtime'.cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{d / "cni" / "net.d"}"
[{cri}.images']
  snapshotter = "overlayfs"
  use_local_image_pull = true
  [{cri}.images'.pinned_images]
    sandbox = "{self.pause}"
  [{cri}.images'.registry]
    config_path = "{d / "certs.d"}"
"""
        )

    def _cni_config(self, d: Path) -> None:
        assert self.state is not None
        subnet = realnode_host.pod_subnet(self.state.slot)
        index = self.names.index(d.name)
        # one bridge for the slot; each node takes its own quarter... of a /24: up to 4 nodes, 60 pods each
        start = subnet.network_address + 2 + 62 * index
        conf = {
            "cniVersion": "1.0.0",
            "name": f"faultline-{self.state.slot}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.state.bridge,
                    "isGateway": True,
                    "isDefaultGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(d / "cni" / "ipam"),
                        "ranges": [
                            [
                                {
                                    "subnet": str(subnet),
                                    "rangeStart": str(start),
                                    "rangeEnd": str(start + 59),
                                    "gateway": self.state.gateway,
                                }
                            ]
                        ],
                    },
                },
                {"type": "loopback"},
            ],
        }
        (d / "cni" / "net.d" / "10-faultline.conflist").write_text(json.dumps(conf, indent=1))

    def _kubelet_config(self, d: Path, ip: str, sock: Path) -> Path:
        assert self.state is not None
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": ip,
            "port": procs.free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": procs.free_port(),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.pki.ca)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{sock}",
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "evictionHard": {},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "imagePullCredentialsVerificationPolicy": "NeverVerify",
            "makeIPTablesUtilChains": False,
            "serializeImagePulls": False,
            "podLogsDir": str(d / "pod-logs"),
            "resolvConf": "/etc/resolv.conf",
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [self.state.gateway],  # devtools.clusterdns, on the bridge
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "60s",
            "localStorageCapacityIsolation": False,
            "protectKernelDefaults": False,
            "registerNode": True,
        }
        path = d / "kubelet.yaml"
        path.write_text(json.dumps(config, indent=1))
        os.chmod(path, 0o600)
        return path


def _answers(url: str) -> bool:
    """The URL answers 200 (kube-proxy's /healthz does once its first sync is done)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - our own loopback server
            return bool(resp.status == 200)
    except urllib.error.HTTPError as exc:
        exc.close()
        return False
    except OSError:
        return False
