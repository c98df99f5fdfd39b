"""What the local cluster's real nodes left on the machine: for tests, and for `dev cluster down` to report.

- `leftovers()`: any real node's marks (state files, node addresses, bridges, iptables chains, container
  cgroups, mounts under a cluster directory), whoever made them;
- `footprint(state)`: what one recorded set of real nodes still has on the machine;
- `host_snapshot()` / `snapshot_diff()`: everything real nodes may touch (links, addresses, every iptables
  and ip6tables rule and table, mounts, network namespaces, cgroups, the runtime's paths outside its
  directory, the kernel settings kubelet changes), to compare before a start with after a stop.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from devtools import realnode_host as host


def leftovers() -> list[str]:
    """Anything of any local cluster's real nodes still on the machine."""
    left = [f"state file {p}" for p in sorted(host.STATE_DIR.glob("slot-*.json"))]
    left += [f"directory {host.STATE_DIR}"] if host.STATE_DIR.exists() and not left else []
    addrs = host.run(["ip", "-4", "-o", "addr", "show"])
    left += [f"address {w}" for w in addrs.split() if w.startswith("10.254.") and w.endswith("/32")]
    links = host.run(["ip", "-o", "link", "show"])
    left += [f"link {w.rstrip(':')}" for w in links.split() if w.startswith(host.BRIDGE_PREFIX)]
    rules = host.run(["iptables", "-w", "-t", "nat", "-S"]) if shutil.which("iptables") else ""
    left += [f"iptables {r}" for r in rules.splitlines() if host.CHAIN_PREFIX in r or "KUBE-" in r]
    left += [f"cgroup {d}" for d in Path("/sys/fs/cgroup").glob(f"*/{host.RUNTIME_CGROUP}/*") if d.is_dir()]
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    left += [f"mount {m.split()[4]}" for m in mounts if "/faultline-cluster-" in m.split()[4]]
    return left


def footprint(state: host.HostState, ids: list[str] | None = None) -> list[str]:
    """What of the real nodes recorded in `state` is on the machine now (empty after a cleanup); `ids`:
    their containers (default: those its work directory knows, which a cleanup removes)."""
    work = Path(state.workdir)
    ids = host.container_ids(work) if ids is None else ids
    left = [f"state file {state.path}"] if state.path.exists() else []
    left += [f"process {pid}" for pid in host.processes_under(work)]
    left += [f"mount {m}" for m in host.mounts_under(work)]
    lo = host.run(["ip", "-4", "-o", "addr", "show", "dev", "lo"])
    left += [f"address {ip}" for ip in state.addresses if f" {ip}/32 " in lo]
    if state.bridge and Path(f"/sys/class/net/{state.bridge}").exists():
        left.append(f"bridge {state.bridge}")
    if state.chain and state.chain in host.run(["iptables", "-w", "-t", "nat", "-S"]):
        left.append(f"iptables chain {state.chain}")
    left += [f"cgroup {d}" for i in ids for d in Path("/sys/fs/cgroup").glob(f"*/{host.RUNTIME_CGROUP}/{i}")]
    results = Path("/var/lib/cni/results")
    left += [f"CNI result {r}" for r in _tree(results)[1:] if any(f"-{i}-" in r.name for i in ids)]
    if work.exists():
        left.append(f"directory {work}")
    if not host.live_states():  # the last real nodes gone: the kernel settings are as they were
        now = {k: host.read_sysctl(k) for k in state.sysctls}
        left += [f"sysctl {k}={now[k]} (was {v})" for k, v in state.sysctls.items() if now[k] != v]
    return left


def host_snapshot() -> dict[str, set[str]]:
    """What real nodes may change, as sets to compare before a start and after a stop."""
    links = {
        line.split()[1].split("@")[0].rstrip(":") for line in host.run(["ip", "-o", "link"]).splitlines()
    }
    addrs = {" ".join(line.split()[1:4:2]) for line in host.run(["ip", "-o", "addr", "show"]).splitlines()}
    rules = {r for r in host.run(["iptables-save"]).splitlines() if r.startswith(("-A", ":", "*"))}
    rules6 = {r for r in _saved("ip6tables-save").splitlines() if r.startswith(("-A", ":", "*"))}
    mounts = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    cgroups = {str(d) for d in Path("/sys/fs/cgroup").glob("*/*") if d.is_dir()}
    cgroups |= {str(d) for d in Path("/sys/fs/cgroup").glob(f"*/{host.RUNTIME_CGROUP}/*") if d.is_dir()}
    return {
        "link": links,
        "address": addrs,
        "iptables": {r.split(" [")[0] for r in rules},  # chain lines carry packet counters
        "ip6tables": {r.split(" [")[0] for r in rules6},  # kube-proxy's, were it dual-stack
        "mount": {m for m in mounts if "/faultline-cluster-" in m or "netns" in m},  # not other work's
        "netns": set(host.run(["ip", "netns", "list"]).split()),
        "cgroup": cgroups,
        "path": {str(p) for top in host.OUTSIDE for p in _tree(Path(top))},
        "sysctl": {f"{k}={host.read_sysctl(k)}" for k in host.KUBELET_SYSCTLS},
    }


def _saved(tool: str) -> str:
    return host.run([tool]) if shutil.which(tool) else ""


def _tree(top: Path) -> list[Path]:
    return [top, *top.rglob("*")] if top.is_dir() else []


def snapshot_diff(before: dict[str, set[str]], after: dict[str, set[str]]) -> list[str]:
    """What `after` has that `before` had not, and the reverse."""
    changes = []
    for kind, was in before.items():
        changes += [f"{kind} added: {x}" for x in sorted(after[kind] - was)]
        changes += [f"{kind} removed: {x}" for x in sorted(was - after[kind])]
    return changes
