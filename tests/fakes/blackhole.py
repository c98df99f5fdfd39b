"""An API server that hangs: a TCP server on loopback that takes every connection and never answers (the
liveness tests' wedged worker, the client's request timeout)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path


class BlackHole:
    """A TCP server on loopback that accepts every connection and never answers (a hung API server)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="black-hole", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            if self.closed.is_set():  # the wake-up of `close`, or one that came as it closed
                conn.close()
                self.sock.close()
                return
            self.held.append(conn)

    def close(self) -> None:
        """The hang ends: new connections are refused and every held one is reset."""
        if not self.closed.is_set():
            self.closed.set()
            socket.create_connection(("127.0.0.1", self.port)).close()  # wakes the accept
            self.thread.join(5)
        for conn in self.held:
            conn.close()

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "black-hole.kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: hole\n"
            f"clusters: [{{name: hole, cluster: {{server: 'http://127.0.0.1:{self.port}'}}}}]\n"
            "users: [{name: hole, user: {token: none}}]\n"
            "contexts: [{name: hole, context: {cluster: hole, user: hole}}]\n"
        )
        return path
