"""The embedded store's images (`make image-store`: image/store.sh) run as the chart runs them: PostgreSQL
from the postgres image as user 65532, initialised on its first start with the chart's generated password;
FerretDB from the ferretdb image (one static binary, no shell) pointed at it with no credentials; a client
with the URI the chart writes (SASL PLAIN, the role's password) reads and writes, one without it or with a
wrong password is refused; a restart keeps the data. Needs root (mmdebstrap, chroot), as CI has.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure

from devtools import oci, procs

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".cache" / "image" / "store"
NONROOT = 65532
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
ARCHES = ("amd64", "arm64")


def _build(*names: str) -> dict[str, tuple[str, float]]:
    """Build the named images; {name: (digest, unpacked MB)}."""
    done = subprocess.run(["bash", str(ROOT / "image" / "store.sh"), *names], cwd=ROOT, capture_output=True,
                          text=True, check=False, timeout=1500)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return _built(*names)


def _outputs(name: str) -> list[Path]:
    """What store.sh writes for image `name`: each architecture's report, then the index's digest."""
    return [*(OUT / arch / f"{name}.txt" for arch in ARCHES), OUT / f"{name}.digest"]


def _built(*names: str) -> dict[str, tuple[str, float]]:
    """The named images as built; {name: (digest, unpacked MB)}."""
    out = {}
    for name in names:  # the index's digest; the largest architecture's size
        sizes = []
        for arch in ARCHES:
            report = (OUT / arch / f"{name}.txt").read_text()
            size = re.search(rf"^{arch} image: ([\d.]+) MB unpacked", report, re.MULTILINE)
            assert size is not None, report
            sizes.append(float(size.group(1)))
        out[name] = ((OUT / f"{name}.digest").read_text().strip(), max(sizes))
    return out


@pytest.fixture(scope="module")
def built(built_this_run: Callable[[Path], bool]) -> dict[str, tuple[str, float]]:
    """Both images, as an earlier test of this run built them (the embedded store's chart test pushes them,
    building them when missing) or built here."""
    assert os.geteuid() == 0, (
        "the postgres image needs root (mmdebstrap --mode=root, chroot); CI runs as root"
    )
    names = ("ferretdb", "postgres")
    if all(built_this_run(path) for name in names for path in _outputs(name)):
        return _built(*names)
    return _build(*names)


@pytest.fixture(scope="module")
def roots(built: dict[str, tuple[str, float]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("store-images")
    base.chmod(0o755)  # user 65532 walks into the unpacked trees
    out: dict[str, Any] = {}
    for name in built:
        root = base / name
        out[name] = (root, oci.unpack(OUT / f"{name}.oci.tar", root))
    return out


def test_sizes_and_the_ferretdb_image_is_reproducible(built: dict[str, tuple[str, float]]) -> None:
    assert built["ferretdb"][1] < 40  # the binary and two files
    assert built["postgres"][1] < 200  # Debian's postgresql-15 without the LLVM JIT, Perl and locale sources
    assert _build("ferretdb")["ferretdb"][0] == built["ferretdb"][0]  # the index: both architectures


def test_the_arm64_store_images_run_under_emulation(
    built: dict[str, tuple[str, float]], tmp_path: Path
) -> None:
    """Each store image's arm64 build, from the same index, runs its program under QEMU user emulation
    (registered only in the command's own user namespace: devtools/foreign.py)."""
    foreign = [str(ROOT / ".venv" / "bin" / "python"), "-m", "devtools.foreign", "arm64", "--"]
    for name in ("ferretdb", "postgres"):
        root = tmp_path / name
        config = oci.unpack(OUT / f"{name}.oci.tar", root, "arm64")
        if name == "ferretdb":  # one static binary and no shell: chroot runs it directly
            argv = ["chroot", str(root), config["Entrypoint"][0], "--version"]
        else:
            argv = oci.chroot_argv(root, {**config, "Entrypoint": ["postgres"]}, ["--version"])
        done = subprocess.run([*foreign, *argv], cwd=ROOT, capture_output=True, text=True, check=False,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, (name, done.stdout, done.stderr)
        version = "15." if name == "postgres" else "v1.24"
        assert version in done.stdout, (name, done.stdout)


class _Postgres:
    def __init__(self, root: Path, config: dict[str, Any], log: Path) -> None:
        self.root, self.config, self.log = root, config, log
        self.port = procs.free_port()
        self.proc: procs.Proc | None = None

    def start(self, password: str | None) -> _Postgres:
        run = self.root / "run" / "postgresql"  # an emptyDir in the pod
        run.mkdir(parents=True, exist_ok=True)
        os.chown(run, NONROOT, NONROOT)
        env = [*self.config["Env"], *([f"POSTGRES_PASSWORD={password}"] if password else [])]
        argv = oci.chroot_argv(self.root, {**self.config, "Env": env},
                               ["-c", f"port={self.port}", "-c", "listen_addresses=127.0.0.1"])  # fmt: skip
        self.log.write_text("")
        self.proc = procs.Proc("postgres", argv, self.log, stop_signal=signal.SIGINT)
        procs.wait_for("PostgreSQL to accept connections",
                       lambda: "ready to accept connections" in self.log.read_text(errors="replace"), 60,
                       proc=self.proc)  # fmt: skip
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=30)
            self.proc = None


@pytest.fixture
def postgres(roots: dict[str, Any], tmp_path: Path) -> Iterator[_Postgres]:
    root, config = roots["postgres"]
    pg = _Postgres(root, config, tmp_path / "postgres.log")
    yield pg
    pg.stop()


def _ferretdb(roots: dict[str, Any], pg_port: int, log: Path) -> tuple[procs.Proc, int]:
    """FerretDB from its image, as the chart's Deployment runs it: its entrypoint as user 65532, no shell."""
    root, config = roots["ferretdb"]
    assert config["User"] == f"{NONROOT}:{NONROOT}" and not (root / "bin").exists()
    port = procs.free_port()
    argv = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={root}/proc", "--",
            "chroot", f"--userspec={config['User']}", str(root), *config["Entrypoint"],
            f"-listen-addr=127.0.0.1:{port}", f"-postgresql-url=postgres://127.0.0.1:{pg_port}/postgres"]  # fmt: skip
    proc = procs.Proc("ferretdb", argv, log)
    procs.wait_for(
        "FerretDB to listen", lambda: "listening on" in log.read_text(errors="replace"), 30, proc=proc
    )
    return proc, port


def _uri(port: int, user: str | None, password: str | None) -> str:
    # the chart's URI (templates/store.yaml), with this test's address
    auth = f"{user}:{password}@" if user else ""
    params = "authMechanism=PLAIN&authSource=%24external&" if user else ""
    return f"mongodb://{auth}127.0.0.1:{port}/?{params}retryWrites=false&directConnection=true"


def _write_and_count(uri: str) -> int:
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000)
    try:
        client["faultline"]["probe"].insert_one({"ok": 1})
        return client["faultline"]["probe"].count_documents({})
    finally:
        client.close()


def test_the_embedded_store_as_the_chart_runs_it(
    roots: dict[str, Any], postgres: _Postgres, tmp_path: Path
) -> None:
    password = secrets.token_urlsafe(24)
    postgres.start(password)
    data = roots["postgres"][0] / "var" / "lib" / "postgresql" / "data" / "pgdata"
    assert data.stat().st_uid == NONROOT and data.stat().st_mode & 0o777 == 0o700
    ferret, port = _ferretdb(roots, postgres.port, tmp_path / "ferretdb.log")
    try:
        assert _write_and_count(_uri(port, "faultline", password)) == 1
        for refused in (_uri(port, None, None), _uri(port, "faultline", "wrong")):
            with pytest.raises(OperationFailure):
                _write_and_count(refused)
        postgres.stop()  # a restart (the StatefulSet's pod replaced): the volume keeps the data
        postgres.start(None)
        assert "initialised" not in postgres.log.read_text()
        # FerretDB's pooled connections to the old server fail once each (SQLSTATE 57P01), as a brief
        # outage does for the components, whose store calls retry
        counts: list[int] = []

        def written() -> bool:
            counts.append(_write_and_count(_uri(port, "faultline", password)))
            return True

        procs.wait_for("a write after the restart", written, 30)
        assert counts == [2]
    finally:
        ferret.stop()
