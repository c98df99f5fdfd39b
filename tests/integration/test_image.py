"""The image and its supply chain, end to end: `make image`'s build twice (same digest), the size goal, the
image running the sample replay as the host does, and the signature, SBOM attestation and signed chart in a
registry on loopback, verified with the right key and refused with a wrong one.

Heavy (two image builds, about 2 minutes each on 2 cores, plus the Go tools when not yet built): one module,
its steps shared through module fixtures. Needs root (mmdebstrap's root mode, chroot), as CI has.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools import oci

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".cache" / "image"
BIN = ROOT / ".cache" / "bin"
SIZE_GOAL_MB = 350
REPLAY_ARGS = [
    "replay",
    "sample",
    "--year",
    "2026",
    "--boot-time",
    "2026-11-30T00:00:00",
    "--output",
    "jsonl",
]
# Same terminal for both sides of a comparison: rich wraps help text to COLUMNS.
TERM_ENV = {"COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1"}

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


@dataclass(frozen=True)
class Build:
    digest: str
    archive_sha: str
    unpacked_mb: float
    compressed_mb: float
    seconds: float


def run(*cmd: str | Path, timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )  # type: ignore[call-overload, no-any-return]


def ok(*cmd: str | Path, timeout: float = 600, **kw: object) -> str:
    p = run(*cmd, timeout=timeout, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p.stdout


def build_image(ref: str) -> Build:
    started = time.monotonic()
    env = {**os.environ, "IMAGE_REF": ref}
    out = ok("bash", ROOT / "image" / "build.sh", timeout=1200, cwd=ROOT, env=env)
    size = re.search(r"^image: ([\d.]+) MB unpacked, ([\d.]+) MB compressed$", out, re.M)
    archive = re.search(r"^archive: \S+ (sha256:[0-9a-f]{64})$", out, re.M)
    assert size and archive, out
    return Build(
        (OUT / "digest").read_text().strip(),
        archive[1],
        float(size[1]),
        float(size[2]),
        time.monotonic() - started,
    )


@pytest.fixture(scope="module")
def ref() -> str:
    """The commit both builds and the host's side use (others may commit while the module runs)."""
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def builds(ref: str) -> tuple[Build, Build]:
    assert os.geteuid() == 0, "the image build needs root (mmdebstrap --mode=root, chroot); CI runs as root"
    ok("bash", ROOT / "tools" / "build.sh", "syft", "cosign", "crane", "helm", timeout=1500)
    first = build_image(ref)
    second = build_image(ref)
    print(f"\nimage builds: {first.seconds:.0f} s and {second.seconds:.0f} s; {first.digest}")
    return first, second


@pytest.fixture(scope="module")
def head_tree(ref: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The commit's files: what the image is built from, so the host runs the same code."""
    src = tmp_path_factory.mktemp("head")
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    return src


@pytest.fixture(scope="module")
def unpacked(
    builds: tuple[Build, Build], head_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, object]]]:
    root = tmp_path_factory.mktemp("image") / "root"
    config = oci.unpack(OUT / "faultline.oci.tar", root)
    shutil.copytree(head_tree / "benchmarks" / "corpus" / "sample", root / "home" / "nonroot" / "sample")
    yield root, config
    shutil.rmtree(root)


def in_image(image: tuple[Path, dict[str, object]], *args: str) -> subprocess.CompletedProcess[str]:
    root, config = image
    config = {**config, "Env": [*config["Env"], *(f"{k}={v}" for k, v in TERM_ENV.items())]}  # type: ignore[misc]
    return run(*oci.chroot_argv(root, config, args), timeout=300)


def on_host(head_tree: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; sys.argv[0] = 'faultline'; from cli.app import main; sys.exit(main())"
    env = {**os.environ, **TERM_ENV, "PYTHONPATH": str(head_tree)}
    return run(ROOT / ".venv" / "bin" / "python", "-c", code, *args, cwd=cwd, env=env, timeout=300)


def test_building_twice_gives_the_same_digest(builds: tuple[Build, Build]) -> None:
    first, second = builds
    assert first.digest == second.digest
    assert first.archive_sha == second.archive_sha


def test_size_goal(builds: tuple[Build, Build]) -> None:
    first, _ = builds
    print(f"\nimage: {first.unpacked_mb} MB unpacked, {first.compressed_mb} MB compressed")
    assert first.unpacked_mb <= SIZE_GOAL_MB


def test_runs_as_the_non_root_user_and_journalctl_reads_a_journal_file(
    unpacked: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    root, config = unpacked
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["/opt/faultline/bin/faultline"]
    assert not (root / "opt/faultline/lib/python3.11/site-packages/pip").exists()
    # A real journal file (systemd-journal-remote, as the journal tests write them), read in the image
    # the way the agent reads one: journalctl --file ... -o json.
    export = tmp_path / "kernel.export"
    export.write_text(
        "__REALTIME_TIMESTAMP=1796000000000000\n__MONOTONIC_TIMESTAMP=5000000\n"
        "_BOOT_ID=4b1d3c2a9e8f4d7c8b6a5f4e3d2c1b0a\n_HOSTNAME=gpu-node-09\n_TRANSPORT=kernel\nSYSLOG_FACILITY=0\n"
        "MESSAGE=NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n\n"
    )
    ok("/lib/systemd/systemd-journal-remote", f"--output={root / 'tmp' / 'kernel.journal'}", export)
    (root / "tmp" / "kernel.journal").chmod(0o644)
    probe = {**config, "Entrypoint": ["/bin/sh", "-c"]}
    script = "id -u; python3 -V; journalctl --file /tmp/kernel.journal -o json --no-pager"
    p = run(*oci.chroot_argv(root, probe, [script]), timeout=60)
    assert p.returncode == 0, p.stderr
    uid, python, entry = p.stdout.splitlines()
    assert (uid, python.rsplit(".", 1)[0]) == ("65532", "Python 3.11")
    assert json.loads(entry)["MESSAGE"].endswith("GPU has fallen off the bus.")


def test_help_and_sample_replay_match_the_host(
    unpacked: tuple[Path, dict[str, object]], head_tree: Path
) -> None:
    inside = in_image(unpacked, "--help")
    host = on_host(head_tree, head_tree, "--help")
    assert inside.returncode == host.returncode == 0, inside.stderr
    assert inside.stdout == host.stdout
    inside = in_image(unpacked, *REPLAY_ARGS)
    host = on_host(head_tree, head_tree / "benchmarks" / "corpus", *REPLAY_ARGS)
    assert inside.returncode == host.returncode == 0, inside.stderr
    faults = [json.loads(line) for line in inside.stdout.splitlines() if line.strip()]
    assert len(faults) > 10
    assert faults == [json.loads(line) for line in host.stdout.splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def registry(builds: tuple[Build, Build]) -> Iterator[str]:
    """crane's registry on a free loopback port, stopped (and checked gone) at the end."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(BIN / "crane"), "registry", "serve", "--address", address],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while run(BIN / "crane", "catalog", "--insecure", address, timeout=10).returncode != 0:
            assert proc.poll() is None, "the registry exited"
            assert time.monotonic() < deadline, "the registry did not answer in 30 s"
            time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.poll() is not None
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "something still listens on the registry's port"


@pytest.fixture(scope="module")
def pushed(registry: str) -> str:
    started = time.monotonic()
    out = ok("bash", ROOT / "image" / "supply-chain.sh", "push", registry, cwd=ROOT)
    print(f"\nSBOM, push, sign, attest, chart: {time.monotonic() - started:.0f} s\n{out}")
    return registry


def test_sbom_describes_this_image_with_its_debian_and_python_packages(
    pushed: str, builds: tuple[Build, Build]
) -> None:
    sbom = json.loads((OUT / "sbom.cdx.json").read_text())
    assert sbom["metadata"]["component"]["version"] == builds[0].digest
    assert sbom["metadata"]["component"]["name"] == "faultline"
    components = sbom["components"]
    purls = {c.get("purl", "").split("@")[0] for c in components}
    assert {
        "pkg:deb/debian/python3.11",
        "pkg:deb/debian/systemd",
        "pkg:pypi/bytewax",
        "pkg:pypi/faultline",
    } <= purls


def test_signature_and_attestation_verify_with_the_key_and_fail_with_another(
    pushed: str, tmp_path: Path
) -> None:
    good = run("make", "--no-print-directory", "verify-image", f"REGISTRY={pushed}", cwd=ROOT)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "signature verified" in good.stdout
    assert "SBOM attestation verified" in good.stdout
    assert "chart signature verified" in good.stdout
    ok(BIN / "cosign", "generate-key-pair", cwd=tmp_path, env={**os.environ, "COSIGN_PASSWORD": ""})
    bad = run(
        "make",
        "--no-print-directory",
        "verify-image",
        f"REGISTRY={pushed}",
        f"COSIGN_KEY={tmp_path / 'cosign.pub'}",
        cwd=ROOT,
    )
    assert bad.returncode != 0
    assert "signature verified" not in bad.stdout


def test_the_chart_is_packaged_with_what_its_links_point_to(ref: str, tmp_path: Path) -> None:
    """`supply-chain.sh chart` (what push pushes): each symbolic link of the chart at the image's commit is
    a file of the package with its target's content. An archive of charts/ alone left the built-in object
    rules' link dangling and helm refused to package the chart, so no real-node test could install it."""
    ok("bash", ROOT / "tools" / "build.sh", "helm", timeout=1500)
    (tmp_path / "revision").write_text(f"{ref}\n")
    ok("bash", ROOT / "image" / "supply-chain.sh", "chart", cwd=ROOT,
       env={**os.environ, "FAULTLINE_IMAGE_DIR": str(tmp_path)})  # fmt: skip
    (package,) = (tmp_path / "chart").glob("faultline-*.tgz")

    def show(path: str) -> bytes:
        return subprocess.run(
            ["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, check=True
        ).stdout

    listed = ok("git", "ls-tree", "-r", ref, "charts", cwd=ROOT).splitlines()
    links = [line.split("\t")[1] for line in listed if line.startswith("120000 ")]
    assert {
        "charts/faultline/crds/remediationrequests.yaml",
        "charts/faultline/files/object-rules.yaml",
    } <= set(links), links
    with tarfile.open(package) as tar:
        for link in links:
            target = os.path.normpath(os.path.join(os.path.dirname(link), show(link).decode()))
            member = tar.getmember(link.removeprefix("charts/"))
            content = tar.extractfile(member)
            assert member.isfile() and content is not None, link
            assert content.read() == show(target), link


def test_the_chart_installs_from_the_registry(pushed: str, tmp_path: Path) -> None:
    version = (ROOT / "charts" / "faultline" / "Chart.yaml").read_text().split("\nversion: ")[1].split()[0]
    ref = f"oci://{pushed}/faultline"
    shown = ok(BIN / "helm", "show", "chart", ref, "--version", version, "--plain-http")
    assert "name: faultline" in shown
    ok(BIN / "helm", "pull", ref, "--version", version, "--plain-http", "--destination", tmp_path)
    assert (tmp_path / f"faultline-{version}.tgz").is_file()
