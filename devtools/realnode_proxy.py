"""What the real nodes' kube-proxy (and their own DNAT chain) leave in the machine's iptables, and how
it is undone (devtools.realnode_host records that a set runs kube-proxy, and which tables existed before
it started, then calls these on cleanup).

kube-proxy (iptables mode) makes its KUBE-* chains in the nat, filter and mangle tables, with jumps from
the built-in chains; `kube-proxy --cleanup` removes them all but KUBE-FIREWALL (and its jumps from INPUT
and OUTPUT), which `remove_rules` sweeps too, with any other KUBE-* chain left. The tables a set made
stay behind, empty; with iptables' nf_tables backend (Debian's default) restoring a table with no rules
deletes it, so `remove_new_tables` deletes those that did not exist before and are empty now (with the
legacy backend a table is a kernel module, and stays).

The cluster is IPv4 only, so kube-proxy is given a PATH with iptables' IPv4 tools alone (`ipv4_tools`):
without ip6tables it runs single-stack and leaves the IPv6 tables alone. The cleanup still sweeps both
families.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from devtools import tools

FAMILIES = ("iptables", "ip6tables")
PREFIX = "KUBE-"


def ipv4_tools(directory: Path) -> Path:
    """`directory` holding iptables, iptables-save and iptables-restore (links), and nothing else."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("iptables", "iptables-save", "iptables-restore"):
        found = shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
        if found is None:
            raise FileNotFoundError(f"{name} is missing: real nodes need iptables (make system-deps)")
        link = directory / name
        link.unlink(missing_ok=True)
        link.symlink_to(found)  # the multi-call binary reads the name it was called by
    return directory


def tables(family: str) -> list[str]:
    """The tables `family` (iptables, ip6tables) has on the machine now."""
    if shutil.which(f"{family}-save") is None:
        return []
    return sorted(line[1:] for line in _run([f"{family}-save"]).splitlines() if line.startswith("*"))


def remove_rules() -> None:
    """kube-proxy's chains and the rules that jump to them, in both families."""
    _run([str(tools.binary("kube-proxy")), "--cleanup"], check=True)
    for family in FAMILIES:
        for table in tables(family):
            _sweep(family, table)


def remove_new_tables(before: dict[str, list[str]]) -> None:
    """The tables (per family) that were not there `before` and are empty now."""
    for family in FAMILIES:
        for table in tables(family):
            if table not in before.get(family, []) and _empty(family, table):
                _run([f"{family}-restore"], stdin=f"*{table}\nCOMMIT\n", check=True)


def _sweep(family: str, table: str) -> None:
    """Every KUBE-* chain of `table` and every rule that jumps to one."""
    rules = _run([family, "-w", "-t", table, "-S"], check=True).splitlines()
    chains = [r.split()[1] for r in rules if r.startswith("-N ") and r.split()[1].startswith(PREFIX)]
    for rule in rules:
        words = shlex.split(rule)
        if words[:1] == ["-A"] and not words[1].startswith(PREFIX) and _jumps_to_ours(words):
            _run([family, "-w", "-t", table, "-D", *words[1:]], check=True)
    for chain in chains:
        _run([family, "-w", "-t", table, "-F", chain], check=True)
    for chain in chains:
        _run([family, "-w", "-t", table, "-X", chain], check=True)


def _jumps_to_ours(words: list[str]) -> bool:
    return any(w in ("-j", "-g") and i + 1 < len(words) and words[i + 1].startswith(PREFIX)
               for i, w in enumerate(words))  # fmt: skip


def _empty(family: str, table: str) -> bool:
    """Only built-in chains, no rule, every policy ACCEPT."""
    lines = _run([family, "-w", "-t", table, "-S"], check=True).splitlines()
    return all(line.startswith("-P ") and line.endswith(" ACCEPT") for line in lines)


def _run(argv: list[str], *, stdin: str | None = None, check: bool = False) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)  # noqa: S603
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout
