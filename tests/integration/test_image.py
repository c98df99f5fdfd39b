"""The image and its supply chain, end to end: `make image`'s build twice (same digest), the size goal, the
image running the sample replay as the host does, the agent signing its evidence in each architecture's
image, and the signature, SBOM attestation and signed chart in a registry on loopback, verified with the
right key and refused with a wrong one.

Heavy (two image builds, about 5 minutes each on 2 cores, three quarters of it the arm64 root filesystem
under QEMU, plus the Go tools when not yet built; in the whole suite the first is the one an earlier test
of the same run built, so the module builds once): one module, its steps shared through module fixtures.
Needs root (mmdebstrap's root mode, chroot), as CI has.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools import oci

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".cache" / "image"
BIN = ROOT / ".cache" / "bin"
SIZE_GOAL_MB = 350
ARCHES = ("amd64", "arm64")
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
    digest: str  # the image index's
    arch_digests: dict[str, str]  # each architecture's image (manifest) digest
    archive_sha: str
    unpacked_mb: float  # this machine's architecture's
    compressed_mb: float
    seconds: float
    arch_unpacked_mb: dict[str, float]


def run(*cmd: str | Path, timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )  # type: ignore[call-overload, no-any-return]


def ok(*cmd: str | Path, timeout: float = 600, **kw: object) -> str:
    p = run(*cmd, timeout=timeout, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p.stdout


def build_image(ref: str) -> Build:
    env = {**os.environ, "IMAGE_REF": ref}
    ok("bash", ROOT / "image" / "build.sh", timeout=1200, cwd=ROOT, env=env)
    return built_image()


def built_image() -> Build:
    """The image in .cache/image, from what its build reported (report.txt) and wrote."""
    report = (OUT / "report.txt").read_text()
    sizes = dict(re.findall(r"^(\w+) image: ([\d.]+) MB unpacked, [\d.]+ MB compressed$", report, re.M))
    size = re.search(rf"^{oci.native()} image: ([\d.]+) MB unpacked, ([\d.]+) MB compressed$", report, re.M)
    archive = re.search(r"^archive: \S+ (sha256:[0-9a-f]{64})$", report, re.M)  # the index's archive
    seconds = re.search(r"^image: index sha256:[0-9a-f]{64} of .*; built in (\d+) s$", report, re.M)
    assert size and archive and seconds and set(sizes) == set(ARCHES), report
    return Build(
        (OUT / "digest").read_text().strip(),
        {arch: (OUT / arch / "digest").read_text().strip() for arch in ARCHES},
        archive[1],
        float(size[1]),
        float(size[2]),
        float(seconds[1]),
        {arch: float(mb) for arch, mb in sizes.items()},
    )


def built_earlier_in_this_run(ref: str, built_this_run: Callable[[Path], bool]) -> bool:
    """Whether .cache/image holds an image of both architectures that another test of this run built from
    `ref` (the real-node and chart tests build it when they need it): then it is the first of the two
    builds compared, and this module builds once. A build from before this run (its recipe may have
    changed since) never counts."""
    arches = OUT / "arches"
    return (
        built_this_run(OUT / "report.txt")  # written last: a build that failed before it is not counted
        and (OUT / "revision").read_text().strip() == ref
        and arches.is_file()
        and tuple(arches.read_text().split()) == ARCHES
    )


@pytest.fixture(scope="module")
def ref() -> str:
    """The commit both builds and the host's side use (others may commit while the module runs)."""
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def builds(ref: str, built_this_run: Callable[[Path], bool]) -> tuple[Build, Build]:
    """Two builds of `ref`, the first one another test's of this run when there is one."""
    assert os.geteuid() == 0, "the image build needs root (mmdebstrap --mode=root, chroot); CI runs as root"
    ok("bash", ROOT / "tools" / "build.sh", "syft", "cosign", "crane", "helm", timeout=1500)
    earlier = built_earlier_in_this_run(ref, built_this_run)
    first = built_image() if earlier else build_image(ref)
    second = build_image(ref)
    whose = " (the first by an earlier test of this run)" if earlier else ""
    print(f"\nimage builds: {first.seconds:.0f} s and {second.seconds:.0f} s{whose}; {first.digest}")
    return first, second


@pytest.fixture(scope="module")
def head_tree(ref: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The commit's files: what the image is built from, so the host runs the same code."""
    src = tmp_path_factory.mktemp("head")
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    return src


def _unpack(
    arch: str, head_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, object]]:
    root = tmp_path_factory.mktemp(f"image-{arch}") / "root"
    config = oci.unpack(OUT / "faultline.oci.tar", root, arch)
    shutil.copytree(head_tree / "benchmarks" / "corpus" / "sample", root / "home" / "nonroot" / "sample")
    return root, config


@pytest.fixture(scope="module")
def unpacked(
    builds: tuple[Build, Build], head_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, object]]]:
    """The image of this machine's architecture (amd64 here), from the index."""
    image = _unpack(oci.native(), head_tree, tmp_path_factory)
    yield image
    shutil.rmtree(image[0])


@pytest.fixture(scope="module")
def unpacked_arm64(
    builds: tuple[Build, Build], head_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, object]]]:
    """The arm64 image, from the same index."""
    image = _unpack("arm64", head_tree, tmp_path_factory)
    yield image
    shutil.rmtree(image[0])


def in_image(
    image: tuple[Path, dict[str, object]], *args: str, arch: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run the unpacked image; `arch`: another architecture's, under QEMU user emulation registered only
    in the command's own user namespace (devtools/foreign.py)."""
    root, config = image
    config = {**config, "Env": [*config["Env"], *(f"{k}={v}" for k, v in TERM_ENV.items())]}  # type: ignore[misc]
    emulated = [str(ROOT / ".venv" / "bin" / "python"), "-m", "devtools.foreign", arch, "--"] if arch else []
    return run(*emulated, *oci.chroot_argv(root, config, args), timeout=900, cwd=ROOT)


def on_host(head_tree: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; sys.argv[0] = 'faultline'; from cli.app import main; sys.exit(main())"
    env = {**os.environ, **TERM_ENV, "PYTHONPATH": str(head_tree)}
    return run(ROOT / ".venv" / "bin" / "python", "-c", code, *args, cwd=cwd, env=env, timeout=300)


def test_building_twice_gives_the_same_digest(builds: tuple[Build, Build]) -> None:
    first, second = builds
    assert first.digest == second.digest
    assert first.arch_digests == second.arch_digests  # each architecture's image, the arm64 one emulated
    assert first.archive_sha == second.archive_sha


def test_one_index_holds_an_image_for_each_architecture(builds: tuple[Build, Build]) -> None:
    """What a node pulls is the index; its runtime picks its own architecture's image (the chart needs no
    architecture setting): GH200 and GB200 nodes are arm64."""
    blobs = OUT / "oci" / "blobs" / "sha256"

    def blob(digest: str) -> dict[str, object]:
        return json.loads((blobs / digest.removeprefix("sha256:")).read_text())  # type: ignore[no-any-return]

    first, _ = builds
    (top,) = json.loads((OUT / "oci" / "index.json").read_text())["manifests"]
    assert (top["mediaType"], top["digest"]) == (oci.INDEX_TYPE, first.digest)
    index = blob(first.digest)
    by_arch = {d["platform"]["architecture"]: d for d in index["manifests"]}  # type: ignore[attr-defined]
    assert {a: d["digest"] for a, d in by_arch.items()} == first.arch_digests
    for arch, descriptor in by_arch.items():
        config = blob(blob(descriptor["digest"])["config"]["digest"])  # type: ignore[index]
        assert (config["architecture"], config["os"]) == (arch, "linux")
        assert descriptor["platform"]["os"] == "linux"


def test_size_goal(builds: tuple[Build, Build]) -> None:
    first, _ = builds
    print(
        f"\nimage: {first.unpacked_mb} MB unpacked, {first.compressed_mb} MB compressed; {first.arch_unpacked_mb}"
    )
    assert all(mb <= SIZE_GOAL_MB for mb in first.arch_unpacked_mb.values()), first.arch_unpacked_mb


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


def test_the_arm64_image_runs_the_agent_and_the_sample_replay_under_emulation(
    unpacked_arm64: tuple[Path, dict[str, object]], head_tree: Path
) -> None:
    """The arm64 image's own interpreter and native extensions (bytewax, re2, grpcio, pydantic-core) run
    under QEMU's user-mode emulator: `faultline agent --help` prints what the host prints, and the sample
    corpus replays to the same faults."""
    root, config = unpacked_arm64
    python = root / "usr" / "bin" / "python3.11"
    assert python.read_bytes()[18:20] == b"\xb7\x00", "not an aarch64 executable"  # ELF e_machine 183
    machine = in_image((root, {**config, "Entrypoint": ["/opt/faultline/bin/python", "-c"]}),
                       "import platform; print(platform.machine())", arch="arm64")  # fmt: skip
    assert (machine.returncode, machine.stdout.strip()) == (0, "aarch64"), machine.stderr
    inside = in_image(unpacked_arm64, "agent", "--help", arch="arm64")
    host = on_host(head_tree, head_tree, "agent", "--help")
    assert inside.returncode == host.returncode == 0, inside.stderr
    assert inside.stdout == host.stdout
    inside = in_image(unpacked_arm64, *REPLAY_ARGS, arch="arm64")
    host = on_host(head_tree, head_tree / "benchmarks" / "corpus", *REPLAY_ARGS)
    assert inside.returncode == host.returncode == 0, inside.stderr
    faults = [json.loads(line) for line in inside.stdout.splitlines() if line.strip()]
    assert len(faults) > 10
    assert faults == [json.loads(line) for line in host.stdout.splitlines() if line.strip()]


# RFC 8032 7.1, test 1: the key, its public key and the signature of the empty message.
RFC8032_SEED = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
RFC8032_PUBLIC = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
RFC8032_SIGNATURE = (
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25b"
    "f5f0595bbe24655141438e7a100b"
)
# What the agent does with its evidence key, in the image's interpreter: sign through the backend it picks
# (the libcrypto its `ssl` mapped, through ctypes), then verify as the workers do (with `cryptography`,
# imported after the signature so it cannot be what signed).
SIGN_IN_IMAGE = f"""
import sys
from faultline import ed25519
backend = type(ed25519.backend()).__name__
key = ed25519.private_key(bytes.fromhex("{RFC8032_SEED}"))
signature = key.sign(b"")
signed_by_cryptography = "cryptography" in sys.modules
mapped = [path for path in ed25519._libcrypto_paths() if path.startswith("/")]  # read from /proc/self/maps
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
Ed25519PublicKey.from_public_bytes(key.public).verify(signature, b"")
print(backend, signed_by_cryptography, len(mapped), key.public.hex(), signature.hex())
"""


def _signs_through_the_images_libcrypto(image: tuple[Path, dict[str, object]], arch: str = "") -> None:
    root, config = image
    probe = (root, {**config, "Entrypoint": ["/opt/faultline/bin/python", "-c"]})
    signed = in_image(probe, SIGN_IN_IMAGE, arch=arch)
    assert signed.returncode == 0, signed.stderr
    assert signed.stdout.split() == ["_Libcrypto", "False", "1", RFC8032_PUBLIC, RFC8032_SIGNATURE]
    # the agent's own start (`cli.agent`, flags from the settings model, no CLI framework) on this
    # interpreter: a wrong flag is refused by name, before anything is opened
    refused = in_image(image, "agent", "--no-such-flag", "1", arch=arch)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "no such option '--no-such-flag' for faultline agent" in refused.stderr


def test_the_agent_signs_its_evidence_through_the_images_libcrypto(
    unpacked: tuple[Path, dict[str, object]],
) -> None:
    """The image's interpreter maps Debian's libcrypto (its `ssl`), so the agent signs there and loads no
    `cryptography`; the signature is RFC 8032's and verifies as the workers verify it."""
    _signs_through_the_images_libcrypto(unpacked)


def test_the_arm64_agent_signs_its_evidence_through_its_libcrypto_under_emulation(
    unpacked_arm64: tuple[Path, dict[str, object]],
) -> None:
    """The same on the arm64 image (GH200, GB200 nodes): the ctypes calls into aarch64 OpenSSL give the same
    bytes; QEMU's user mode shows the guest's own mappings in /proc/self/maps, as the kernel does."""
    _signs_through_the_images_libcrypto(unpacked_arm64, arch="arm64")


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
    for arch in ARCHES:  # one SBOM per architecture's image
        sbom = json.loads((OUT / arch / "sbom.cdx.json").read_text())
        assert sbom["metadata"]["component"]["version"] == builds[0].arch_digests[arch]
        assert sbom["metadata"]["component"]["name"] == "faultline"
        components = sbom["components"]
        purls = {c.get("purl", "").split("@")[0] for c in components}
        assert {
            "pkg:deb/debian/python3.11",
            "pkg:deb/debian/systemd",
            "pkg:pypi/bytewax",
            "pkg:pypi/faultline",
        } <= purls, arch
        debs = [
            c.get("purl", "")
            for c in components
            if c.get("purl", "").startswith("pkg:deb/debian/python3.11@")
        ]
        assert debs and all(f"arch={arch}" in p for p in debs), debs


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
