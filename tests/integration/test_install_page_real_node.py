"""The install page's commands as they are written (docs/install/helm.md, "Install"), on the local cluster
with a real node: `make release` to the cluster's registry, served over HTTPS as registries are (a test CA,
which the commands' environment trusts through SSL_CERT_FILE, as a machine trusts its registry's CA), then
each command of the page's first block with only REGISTRY replaced: the signatures verified with the
release's public key, and `helm install --wait` to Ready. The embedded store's PostgreSQL claim, naming no
class, is bound through the cluster's default StorageClass; PostgreSQL and FerretDB run on the real node
from the release's image indexes (containerd picks the amd64 image); the agent runs on the GPU nodes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import procs, tools, volumes
from devtools.certs import LocalPKI
from devtools.cluster import LocalCluster
from devtools.registry import tls_front
from faultline import kube
from tests.integration import chartutil
from tests.integration.chartutil import NODE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(2400),  # make release builds what is not built from HEAD (the store images)
    pytest.mark.skipif(os.geteuid() != 0, reason="real nodes need root (CI runs as root)"),
]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "install" / "helm.md"
NAMESPACE = "faultline"  # the page's
SYSTEM_CAS = Path("/etc/ssl/certs/ca-certificates.crt")


def install_commands() -> list[str]:
    """The commands of the first shell block under the page's "## Install"."""
    section = PAGE.read_text().split("\n## Install\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def chart_version() -> str:
    return (ROOT / "charts" / "faultline" / "Chart.yaml").read_text().split("\nversion: ", 1)[1].split()[0]


def test_the_install_commands_name_the_chart_s_version() -> None:
    """The page's commands are those of the chart as it is: its version, the registry left to the reader."""
    commands = install_commands()
    version = chart_version()
    assert [c.split()[0] for c in commands] == ["cosign", "cosign", "helm"], commands
    assert commands[-1].startswith(f"helm install faultline oci://REGISTRY/faultline --version {version} ")
    assert all("REGISTRY" in c and f":{version}" in c for c in commands[:2]), commands


@pytest.fixture
def https_registry(real_cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The cluster's registry behind HTTPS: its address and a CA bundle (the system's and the test's)."""
    assert real_cluster.real is not None
    pki = LocalPKI(tmp_path / "pki")  # its API server pair is a server certificate for 127.0.0.1
    front = tls_front(real_cluster.real.registry.address, pki.apiserver.cert, pki.apiserver.key)
    address = f"127.0.0.1:{front.port}"
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_text(SYSTEM_CAS.read_text() + pki.ca.read_text())
    real_cluster.real.trust_registry(address)
    try:
        yield address, bundle
    finally:
        front.stop()


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=timeout
    )
    assert done.returncode == 0, (
        f"{argv} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done.stdout


def _pods(api: Any) -> dict[str, dict[str, Any]]:
    pods = kube.pods.list_all(api, field_selector=f"metadata.namespace={NAMESPACE}")
    return {p["metadata"]["labels"].get("app.kubernetes.io/component", ""): p for p in pods
            if not p["metadata"].get("deletionTimestamp")}  # fmt: skip


@pytest.mark.usefixtures("sim_nodes_cordoned")
def test_the_install_page_s_commands_run_as_written_to_ready(
    real_cluster: LocalCluster, https_registry: tuple[str, Path], helm_env: dict[str, str], tmp_path: Path
) -> None:
    registry, bundle = https_registry
    api = real_cluster.api()
    core = kube.core(api)
    version = chart_version()
    env = {**helm_env, "SSL_CERT_FILE": str(bundle), "KUBECONFIG": str(real_cluster.kubeconfig),
           "PATH": f"{tools.bin_dir()}:{os.environ['PATH']}", "REGISTRY_TLS": "1"}  # fmt: skip
    started = time.monotonic()
    _run(
        ["make", "--no-print-directory", "release", f"REGISTRY={registry}", f"VERSION={version}"],
        env,
        ROOT,
        2000,
    )
    released = time.monotonic() - started
    shutil.copy(ROOT / ".cache" / "image" / "keys" / "cosign.pub", tmp_path / "cosign.pub")  # the publisher's
    digest = (ROOT / ".cache" / "image" / "digest").read_text().strip()
    try:
        for command in install_commands():
            _run(["bash", "-c", command.replace("REGISTRY", registry)], env, tmp_path, 900)
        installed = time.monotonic() - started - released
        pods = _pods(api)
        for component in ("postgres", "ferretdb"):
            pod = pods[component]
            assert pod["spec"]["nodeName"] == NODE and chartutil.ready(pod), component
            assert pod["spec"]["containers"][0]["image"].startswith(f"{registry}/images/{component}@sha256:")
        agent = pods["agent"]  # on a simulated GPU node (the real node has no GPU label)
        assert agent["spec"]["containers"][0]["image"] == f"{registry}/images/faultline@{digest}"
        assert chartutil.ready(agent)
        claim = core.read_namespaced_persistent_volume_claim(f"data-{NAMESPACE}-postgres-0", NAMESPACE)
        assert claim.spec.storage_class_name == volumes.DEFAULT_CLASS and claim.status.phase == "Bound"
        print(
            f"\ninstall page: make release {released:.0f} s, the page's commands to Ready {installed:.0f} s"
        )
    finally:
        subprocess.run([str(tools.binary("helm")), "uninstall", "faultline", "-n", NAMESPACE, "--wait"],
                       env=env, capture_output=True, check=False, timeout=300)  # fmt: skip
        volume = ""
        with contextlib.suppress(Exception):  # no claim: no volume to wait for
            claim_name = f"data-{NAMESPACE}-postgres-0"
            volume = core.read_namespaced_persistent_volume_claim(claim_name, NAMESPACE).spec.volume_name
        core.delete_namespace(NAMESPACE)

        def gone() -> bool:
            try:
                core.read_namespace(NAMESPACE)
            except Exception:  # noqa: BLE001 - NotFound through the generated client
                return not volume or not volumes.directory(real_cluster, volume).exists()
            return False

        procs.wait_for("the namespace and the store's volume gone", gone, 180, interval=1)
