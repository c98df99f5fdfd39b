"""Where the locally built infrastructure binaries live, and building them when they are missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from faultline.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "tools" / "build.sh"
TOOLS = {
    "kubernetes": (
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kubelet",
        "kube-proxy",
    ),
    "etcd": ("etcd",),
    "ferretdb": ("ferretdb",),
    "helm": ("helm",),
    "crane": ("crane",),
    "cosign": ("cosign",),
    "syft": ("syft",),
    "containerd": ("containerd", "containerd-shim-runc-v2", "ctr"),
    "runc": ("runc",),
    "pause": ("pause",),
    "prometheus": ("prometheus", "promtool"),
}


def bin_dir() -> Path:
    return Path(os.environ.get("FAULTLINE_TOOLS_BIN", REPO / ".cache" / "bin"))


def binary(name: str) -> Path:
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise ConfigError(f"{path} is missing: build it with `make tools` (tools/build.sh)")
    return path


def ensure(*tools: str) -> None:
    """Build the named tools (see `TOOLS`) unless they are current."""
    if not BUILD_SCRIPT.exists():
        missing = [b for t in tools for b in TOOLS[t] if not (bin_dir() / b).exists()]
        if missing:
            raise ConfigError(
                f"missing {', '.join(missing)} in {bin_dir()} and no tools/build.sh to build them"
            )
        return
    done = subprocess.run(["bash", str(BUILD_SCRIPT), *tools], stdout=sys.stderr, check=False)  # noqa: S603, S607
    if done.returncode != 0:
        raise ConfigError(f"tools/build.sh {' '.join(tools)} failed with exit code {done.returncode}")
