"""A real MongoDB wire-protocol server for tests and the demo: FerretDB v1 on a free loopback port,
storing in a temporary SQLite directory (the default) or in a private PostgreSQL server.

    with LocalMongo() as mongo:
        client = pymongo.MongoClient(mongo.uri)
        mongo.kill()                 # FerretDB stopped hard (SIGKILL); its storage stays
        mongo.revive()               # started again on the same port, with the same storage

Why PostgreSQL as well: FerretDB 1.x on SQLite finds a document by `_id` with an expression its `_id`
index does not cover, so every update scans the whole collection (measured: 23 ms per update at 1,000
documents of 1.2 KB, 3.6 ms on PostgreSQL). Tests are correct on either; the throughput benchmarks use
PostgreSQL unless given `--store sqlite`. The PostgreSQL server comes from Debian's packages.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from devtools import procs, tools
from faultline.errors import ConfigError

BACKENDS = ("sqlite", "postgresql")


def postgres_bin(name: str) -> Path:
    """A PostgreSQL server program (`initdb`, `postgres`) from the distribution's packages."""
    packaged = sorted(  # newest major version first
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
        reverse=True,
    )
    found = shutil.which(name) or next(iter(packaged), None)
    if found is None:
        raise ConfigError(f"PostgreSQL's {name} is not installed (Debian package postgresql)")
    return Path(found)


class LocalPostgres:
    """A throw-away PostgreSQL server on a free loopback port, trusting local connections, without
    fsync (test data). Run as the `postgres` user when we are root (the server refuses root)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = 0
        self.proc: procs.Proc | None = None

    def _as_server_user(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        if shutil.which("runuser") is None:
            raise ConfigError("running PostgreSQL as root needs runuser (util-linux) and a postgres user")
        return ["runuser", "-u", "postgres", "--", *argv]

    def start(self) -> LocalPostgres:
        data = self.dir / "pgdata"
        self.dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # the server user must reach its directory (mkdtemp makes them 0700)
            self.dir.parent.chmod(self.dir.parent.stat().st_mode | 0o011)
            shutil.chown(self.dir, "postgres")
        if not (data / "PG_VERSION").exists():
            done = subprocess.run(  # noqa: S603 - our own arguments
                self._as_server_user([str(postgres_bin("initdb")), "-D", str(data), "-A", "trust",
                                      "-U", "postgres", "--no-sync", "-E", "UTF8"]),
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise ConfigError(f"initdb failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        self.port = self.port or procs.free_port()
        settings = {"listen_addresses": "127.0.0.1", "port": str(self.port), "fsync": "off",
                    "synchronous_commit": "off", "full_page_writes": "off",
                    "unix_socket_directories": str(self.dir), "max_connections": "200"}  # fmt: skip
        argv = [str(postgres_bin("postgres")), "-D", str(data)]
        for k, v in settings.items():
            argv += ["-c", f"{k}={v}"]
        # SIGINT: PostgreSQL's fast shutdown (SIGTERM waits for every client to leave)
        self.proc = procs.Proc(
            "postgres", self._as_server_user(argv), self.dir / "postgres.log", stop_signal=signal.SIGINT
        )
        try:
            procs.wait_for("PostgreSQL to accept connections", self._accepting, 30, proc=self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def _accepting(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
            pass
        return "ready to accept connections" in (self.dir / "postgres.log").read_text(errors="replace")

    @property
    def url(self) -> str:
        # FerretDB creates its schema in the database it is given; the server's default one will do
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


class LocalMongo:
    def __init__(self, *, workdir: Path | None = None, port: int = 0, backend: str = "sqlite") -> None:
        """`workdir` and `port` given: a restart serves the same data at the same address.
        `backend`: where FerretDB stores, "sqlite" or "postgresql"."""
        if backend not in BACKENDS:
            raise ConfigError(f"unknown FerretDB backend {backend!r} (one of {', '.join(BACKENDS)})")
        self._own_dir = workdir is None
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="faultline-mongo-"))
        self.proc: procs.Proc | None = None
        self.port = port
        self.ready_seconds = 0.0
        self.backend = backend
        self.postgres: LocalPostgres | None = None
        self._argv: list[str] = []

    @property
    def uri(self) -> str:
        # retryWrites off: FerretDB v1 ignores txnNumber, so a retried write is not deduplicated by the server
        return f"mongodb://127.0.0.1:{self.port}/?retryWrites=false&directConnection=true"

    def start(self) -> LocalMongo:
        started = time.monotonic()
        tools.ensure("ferretdb")
        try:
            if self.backend == "postgresql":
                self.postgres = LocalPostgres(self.dir / "postgresql").start()
                storage = f"-postgresql-url={self.postgres.url}"
            else:
                data = self.dir / "data"
                data.mkdir(parents=True, exist_ok=True)
                storage = f"-sqlite-url=file:{data}/"
            self.port = self.port or procs.free_port()
            self._argv = [str(tools.binary("ferretdb")), f"-listen-addr=127.0.0.1:{self.port}", storage]
            self.revive()
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started
        return self

    def _accepting(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Stop FerretDB alone with `sig` (SIGKILL: no goodbye to its clients); PostgreSQL and the SQLite
        files stay, for `revive`."""
        if self.proc is not None:
            self.proc.stop_signal = sig
            self.proc.stop()
            self.proc = None

    def revive(self) -> None:
        """Start FerretDB (again) on the same port and storage; wait until it accepts connections."""
        if self.proc is not None:
            return
        self.proc = procs.Proc("ferretdb", self._argv, self.dir / "ferretdb.log")
        procs.wait_for("FerretDB to accept connections", self._accepting, 30, proc=self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalMongo:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
