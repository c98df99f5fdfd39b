"""A real MongoDB wire-protocol server for tests and the demo: FerretDB v1 on a temporary SQLite
directory, on a free loopback port.

    with LocalMongo() as mongo:
        client = pymongo.MongoClient(mongo.uri)
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path
from types import TracebackType

from faultline.dev import procs, tools


class LocalMongo:
    def __init__(self, *, workdir: Path | None = None, port: int = 0) -> None:
        """`workdir` and `port` given: a restart serves the same data at the same address."""
        self._own_dir = workdir is None
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="faultline-mongo-"))
        self.proc: procs.Proc | None = None
        self.port = port
        self.ready_seconds = 0.0

    @property
    def uri(self) -> str:
        # retryWrites off: FerretDB v1 ignores txnNumber, so a retried write is not deduplicated by the server
        return f"mongodb://127.0.0.1:{self.port}/?retryWrites=false&directConnection=true"

    def start(self) -> LocalMongo:
        started = time.monotonic()
        tools.ensure("ferretdb")
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.port = self.port or procs.free_port()
        self.proc = procs.Proc(
            "ferretdb",
            [
                str(tools.binary("ferretdb")),
                f"-listen-addr=127.0.0.1:{self.port}",
                f"-sqlite-url=file:{data}/",
            ],
            self.dir / "ferretdb.log",
        )
        try:
            procs.wait_for("FerretDB to accept connections", self._accepting, 30, proc=self.proc)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started
        return self

    def _accepting(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalMongo:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
