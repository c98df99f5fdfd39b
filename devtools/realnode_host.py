"""What the local cluster's real nodes change on the machine, recorded before it is changed and undone on
stop, or by the next start (or `faultline dev cluster down`) after a crash.

Every change is written to a state file under `STATE_DIR` *before* it is made, so a process killed at any
line leaves a record of everything it may have done:

- a /32 address on `lo` per node (the node IP: kubelet refuses loopback addresses);
- a Linux bridge for the pods (created here, not by the CNI plugin, so that `route_localnet` can be set on
  it before the first pod: pods reach the API server and the store, which listen on 127.0.0.1, through
  DNAT to loopback, which the kernel routes only from an interface with `route_localnet`);
- one iptables nat chain with the DNAT rules, jumped to from PREROUTING (pods) and OUTPUT (the host and
  hostNetwork pods);
- kube-proxy's iptables chains (KUBE-SERVICES and the rest, in the nat, filter and mangle tables; the
  Services' routing): they carry fixed names, so one set of real nodes on the machine at a time runs
  kube-proxy (`claim_proxy`); its cleanup removes them (devtools.realnode_proxy), and the iptables tables
  that did not exist before the set started, once empty;
- a work directory holding everything else: kubelet's root (volume mounts), containerd's root and state
  (overlay rootfs mounts, sandbox shm mounts, network namespaces: `netns_mounts_under_state_dir`), runc's
  state, the CNI configuration and IP allocations, the pod logs;
- the few paths the runtime uses outside it that cannot be moved: containerd's shim sockets in
  /run/containerd/s, the kubelet's /var/log/containers links, the CNI result cache /var/lib/cni; each is
  removed only where the state says it did not exist before;
- the kernel settings kubelet sets at start unless told to fail instead (vm.overcommit_memory,
  kernel.panic, kernel.panic_on_oops, ...): their values before the first kubelet, restored when the last
  set of real nodes on the machine stops (a second set started meanwhile inherits the first's record).

`cleanup(state)` undoes all of it in order: processes whose command line names the work directory
(kubelet, containerd, shims) and every container (`runc delete --force`, which also removes its
cgroups, then whatever is left in the runtime's cgroup parent), every mount under the work directory
(deepest first; the directory is removed only when nothing is mounted under it, so a hostPath bind mount
can never lead the removal into the host), the network namespaces, the iptables chain, the bridge, the
addresses, the kernel settings. Each step is idempotent; errors are collected and raised together at the end.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from devtools import procs, realnode_proxy, tools
from faultline.errors import ConfigError

STATE_DIR = Path("/run/faultline-realnodes")
CHAIN_PREFIX = "FAULTLINE-RN"
BRIDGE_PREFIX = "flrn"
RUNTIME_CGROUP = "k8s.io"  # containers' cgroups: /sys/fs/cgroup/<hierarchy>/k8s.io/<container id>
SHIM_SOCKETS = Path("/run/containerd/s")
# paths the runtime uses regardless of its configuration
OUTSIDE = ("/run/containerd", "/var/log/containers", "/var/lib/cni")
# what kubelet's container manager sets at start (setupKernelTunables) unless protectKernelDefaults makes
# it fail instead; on this machine kernel.panic is 1 and panic_on_oops 0, which it would turn into 10 and 1
KUBELET_SYSCTLS = (
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
)  # fmt: skip


@dataclass
class HostState:
    """What one local cluster's real nodes changed; written to `path` after every addition."""

    slot: int
    workdir: str
    owner: int = field(default_factory=os.getpid)
    addresses: list[str] = field(default_factory=list)
    bridge: str = ""
    chain: str = ""
    dnat: list[list[str]] = field(default_factory=list)  # [match address, port, to port]
    existed: dict[str, bool] = field(default_factory=dict)  # OUTSIDE path -> existed before the start
    pids: list[int] = field(default_factory=list)  # helpers that name no work directory (the registry)
    sysctls: dict[str, str] = field(default_factory=dict)  # KUBELET_SYSCTLS before any kubelet ran
    proxy: bool = False  # runs kube-proxy: its KUBE-* chains are this set's to remove
    tables: dict[str, list[str]] = field(default_factory=dict)  # iptables family -> its tables at the start

    @property
    def path(self) -> Path:
        return STATE_DIR / f"slot-{self.slot}.json"

    @property
    def gateway(self) -> str:
        """The bridge's address: the pods' default gateway, and the address the host's services are
        exposed on (`expose`)."""
        return str(pod_subnet(self.slot).network_address + 1)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.rename(self.path)

    @classmethod
    def load(cls, path: Path) -> HostState:
        return cls(**json.loads(path.read_text()))


def pod_subnet(slot: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"10.89.{slot}.0/24")


def node_ip(slot: int, index: int) -> str:
    return f"10.254.{slot}.{index + 1}"


def require_root() -> None:
    if os.geteuid() != 0:
        raise ConfigError(
            "real nodes need root: they add addresses on lo, a bridge, iptables rules and mounts, and run "
            "containerd and runc (run as root, as CI does, or use simulated nodes only)"
        )


def claim(workdir: Path) -> HostState:
    """Clean up after dead owners, then take a free slot (its state file created exclusively)."""
    require_root()
    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    cleanup_stale()
    outside = [*OUTSIDE, *(str(h / RUNTIME_CGROUP) for h in _hierarchies())]
    existed = {p: os.path.lexists(p) for p in outside}
    tables = {family: realnode_proxy.tables(family) for family in realnode_proxy.FAMILIES}
    for slot in range(1, 250):
        if _address_in_use(slot):  # something else uses the slot's networks: leave them alone
            continue
        state = HostState(slot=slot, workdir=str(workdir), existed=existed, tables=tables)
        STATE_DIR.mkdir(mode=0o700, exist_ok=True)  # again: the last cleanup removes it
        tmp = STATE_DIR / f".claim-{os.getpid()}"
        tmp.write_text(json.dumps(asdict(state), indent=1))
        try:
            os.link(tmp, state.path)  # exclusive, and never seen without its content
        except FileExistsError:
            continue
        finally:
            tmp.unlink()
        return state
    raise ConfigError(f"no free slot for real nodes in {STATE_DIR}")


def cleanup_stale() -> list[str]:
    """Undo what real nodes of owners no longer running changed; return their state files."""
    done: list[str] = []
    if not STATE_DIR.is_dir():
        return done
    for path in sorted(STATE_DIR.glob("slot-*.json")):
        try:
            state = HostState.load(path)
        except (ValueError, TypeError):  # not a state file of this version: not ours to judge
            continue
        if not procs.alive(state.owner):
            cleanup(state)
            done.append(str(path))
    return done


def _hierarchies() -> list[Path]:
    return sorted(h for h in Path("/sys/fs/cgroup").iterdir() if (h / "cgroup.procs").exists())


def _address_in_use(slot: int) -> bool:
    out = run(["ip", "-4", "-o", "addr", "show"], check=True)
    return f" 10.254.{slot}." in out or f" 10.89.{slot}." in out


# -- changes, each recorded first ----------------------------------------------------------------------
def record_sysctls(state: HostState) -> None:
    """Before the first kubelet: the kernel settings it will change, as they are (or, when other real
    nodes run, as they were before theirs)."""
    others = [s for s in live_states() if s.slot != state.slot and s.sysctls]
    state.sysctls = others[0].sysctls if others else {k: read_sysctl(k) for k in KUBELET_SYSCTLS}
    state.save()


def read_sysctl(key: str) -> str:
    return Path("/proc/sys", key).read_text().strip()


def live_states() -> list[HostState]:
    states = []
    for path in sorted(STATE_DIR.glob("slot-*.json")):
        with contextlib.suppress(ValueError, TypeError, OSError):
            state = HostState.load(path)
            if procs.alive(state.owner):
                states.append(state)
    return states


def _restore_sysctls(state: HostState) -> None:
    if any(s.slot != state.slot for s in live_states()):  # their kubelets run on: the last one restores
        return
    for key, value in state.sysctls.items():
        if read_sysctl(key) != value:
            Path("/proc/sys", key).write_text(value)


def record_pid(state: HostState, pid: int) -> None:
    """A process of ours (one of tools' binaries) that a cleanup after a crash must stop."""
    state.pids.append(pid)
    state.save()


def claim_proxy(state: HostState) -> str:
    """Record that this set runs kube-proxy, unless another does ("" when claimed; else why not): its
    chains have fixed names, so two would overwrite each other's rules and one's cleanup remove both."""
    others = [s for s in live_states() if s.slot != state.slot and s.proxy]
    if others:
        return f"the real nodes of slot {others[0].slot} (process {others[0].owner}) run kube-proxy"
    if _has_chain("KUBE-SERVICES"):
        return "another kube-proxy runs here (a KUBE-SERVICES chain that no real nodes here recorded)"
    state.proxy = True
    state.save()
    return ""


def _has_chain(chain: str) -> bool:
    return f"-N {chain}" in run(["iptables", "-w", "-t", "nat", "-S"]).splitlines()


def add_address(state: HostState, ip: str) -> None:
    state.addresses.append(ip)
    state.save()
    run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], check=True)


def add_bridge(state: HostState) -> None:
    state.bridge = f"{BRIDGE_PREFIX}{state.slot}"
    state.save()
    gw = f"{state.gateway}/{pod_subnet(state.slot).prefixlen}"
    run(["ip", "link", "add", "name", state.bridge, "type", "bridge"], check=True)
    run(["ip", "addr", "add", gw, "dev", state.bridge], check=True)
    run(["ip", "link", "set", state.bridge, "up"], check=True)
    Path(f"/proc/sys/net/ipv4/conf/{state.bridge}/route_localnet").write_text("1")


def add_chain(state: HostState) -> None:
    state.chain = f"{CHAIN_PREFIX}{state.slot}"
    state.save()
    _iptables("-N", state.chain)
    for hook in ("PREROUTING", "OUTPUT"):
        _iptables("-A", hook, "-j", state.chain)


def dnat(state: HostState, address: str, port: int, to_port: int) -> None:
    """Connections to address:port (from pods or the host) go to 127.0.0.1:to_port."""
    state.dnat.append([address, str(port), str(to_port)])
    state.save()
    _iptables(
        "-A", state.chain, "-d", f"{address}/32", "-p", "tcp", "--dport", str(port),
        "-j", "DNAT", "--to-destination", f"127.0.0.1:{to_port}",
    )  # fmt: skip


# -- undoing -------------------------------------------------------------------------------------------
def cleanup(state: HostState) -> None:
    """Undo everything `state` records (idempotent); raise once at the end if anything stays."""
    errors: list[str] = []

    def step(what: str, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - every step runs; failures are reported together
            errors.append(f"{what}: {exc}")

    work = Path(state.workdir)
    step("processes", kill_processes, work, state.pids)
    step("containers", _delete_containers, work)
    step("cgroups", _remove_cgroups, work)
    step("mounts", _unmount_under, work)
    step("iptables", _remove_chain, state)
    if state.proxy:
        step("kube-proxy rules", realnode_proxy.remove_rules)
    step("iptables tables", realnode_proxy.remove_new_tables, state.tables)
    if state.bridge:
        step("bridge", run, ["ip", "link", "del", state.bridge])
    for ip in state.addresses:
        step(f"address {ip}", run, ["ip", "addr", "del", f"{ip}/32", "dev", "lo"])
    step("outside paths", _remove_outside, state)
    step("kernel settings", _restore_sysctls, state)
    if mounts_under(work):
        errors.append(f"mounts remain under {work}; it was not removed: {mounts_under(work)}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if errors:
        raise RuntimeError("real-node cleanup incomplete: " + "; ".join(errors))
    state.path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the last one out leaves no directory behind either
        STATE_DIR.rmdir()


def processes_under(work: Path) -> list[int]:
    """Processes whose command line names `work` (kubelet, containerd and the shims all do)."""
    needle = str(work).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def kill_processes(work: Path, recorded: list[int]) -> None:
    ours = [pid for pid in recorded if _exe_under(pid, tools.bin_dir())]
    for pid in [*processes_under(work), *ours]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    procs.wait_for("the real nodes' processes to exit", lambda: not processes_under(work), 15)


def _exe_under(pid: int, directory: Path) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe").startswith(str(directory) + "/")
    except OSError:
        return False


def _delete_containers(work: Path) -> None:
    binary = str(tools.bin_dir() / "runc")
    for root in sorted(work.glob("*/runc/*")):  # <node>/runc/<containerd namespace>
        for ident in run([binary, "--root", str(root), "list", "-q"]).split():
            run([binary, "--root", str(root), "delete", "--force", ident])


def container_ids(work: Path) -> list[str]:
    """Every container and sandbox the nodes' containerd ran (its state outlives a crash)."""
    state = "*/containerd/state"
    tasks = work.glob(f"{state}/io.containerd.runtime.v2.task/*/*")
    sandboxes = work.glob(f"{state}/io.containerd.grpc.v1.cri/sandboxes/*")
    return sorted({p.name for p in (*tasks, *sandboxes)})


def _remove_cgroups(work: Path) -> None:
    """runc removes a container's cgroups on delete; kill and remove any it no longer knew of. Pods have
    no cgroup parent of their own here (kubelet without QoS cgroups gives none), so containerd puts them
    under /k8s.io/<id> in every hierarchy."""
    dirs = [d for i in container_ids(work) for d in Path("/sys/fs/cgroup").glob(f"*/{RUNTIME_CGROUP}/{i}")]
    for d in dirs:
        for procs_file in d.rglob("cgroup.procs"):
            for pid in procs_file.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    for d in dirs:
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _rmdir_when_empty(sub)
        _rmdir_when_empty(d)


def _rmdir_when_empty(d: Path) -> None:
    def gone() -> bool:
        try:
            d.rmdir()
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY while killed tasks are still leaving
            return False
        return True

    procs.wait_for(f"cgroup {d} to be removed", gone, 10)


def mounts_under(work: Path) -> list[str]:
    prefix = str(work).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point.startswith(prefix) or point == str(work):
            points.append(point)
    return points


def _unmount_under(work: Path) -> None:
    for _ in range(5):  # a mount may reappear under another while propagating: a few passes
        points = mounts_under(work)
        if not points:
            return
        for point in sorted(set(points), key=lambda p: -p.count("/")):
            run(["umount", "-l", point])
    if mounts_under(work):
        raise RuntimeError(f"still mounted: {mounts_under(work)}")


def _remove_chain(state: HostState) -> None:
    if not state.chain:
        return
    for hook in ("PREROUTING", "OUTPUT"):
        while chain_jumps(state.chain, hook):
            _iptables("-D", hook, "-j", state.chain)
    if state.chain in run(["iptables", "-w", "-t", "nat", "-S"]):
        _iptables("-F", state.chain)
        _iptables("-X", state.chain)


def chain_jumps(chain: str, hook: str) -> bool:
    return f"-A {hook} -j {chain}" in run(["iptables", "-w", "-t", "nat", "-S", hook])


def _remove_outside(state: HostState) -> None:
    work = state.workdir
    if SHIM_SOCKETS.is_dir():  # shim sockets carry no owner: ours are those no process listens on now
        for sock in SHIM_SOCKETS.iterdir():
            if sock.is_socket() and not _listening(sock):
                sock.unlink(missing_ok=True)
    ids = container_ids(Path(work))
    cni_cache = Path("/var/lib/cni/results")  # results of pods whose network was never torn down
    if cni_cache.is_dir():
        for result in cni_cache.iterdir():
            if any(f"-{i}-" in result.name for i in ids):
                result.unlink()
    logs = Path("/var/log/containers")
    if logs.is_dir():
        for link in logs.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(work):
                link.unlink()
    for path, existed in state.existed.items():
        if not existed and os.path.isdir(path):
            _remove_if_only_empty_dirs(Path(path))


def _listening(sock: Path) -> bool:
    import socket  # noqa: PLC0415

    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
        return True


def _remove_if_only_empty_dirs(top: Path) -> None:
    dirs = [p for p in top.rglob("*") if p.is_dir() and not p.is_symlink()]
    for d in sorted(dirs, key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


def _iptables(*args: str) -> None:
    run(["iptables", "-w", "-t", "nat", *args], check=True)


def run(argv: list[str], *, check: bool = False) -> str:
    """Run a host tool; its output (stdout), or raise with its stderr when `check` and it failed."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603 - fixed tools
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout
