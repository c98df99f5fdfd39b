"""The active analyzer replica's other processes (setting `processes`): one object starts them, watches
them and stops them.

Process 0 (the replica's own) holds the lease, reads the feed and runs the flow in its main thread.
Processes 1 to N-1 run the same flow without the reader, as the hidden command `faultline analyzer
process`, given their settings on standard input (so a secret never shows in an argument list or an
environment), and talk over loopback on the ports `process_port` to `process_port + N - 1`: fixed, and
below Linux's ephemeral range, so no outgoing connection can take one between choosing and binding it.

Ownership: the kernel ends each of them when process 0 ends (`PR_SET_PDEATHSIG` with SIGKILL, set in the
child before it does anything), so nothing polls for orphans. When one of them fails, the group's watcher
thread calls `on_failure` (process 0's flow is asked to stop); Bytewax itself fails a cluster whose peer
is gone, and a flow that stops neither way stops making progress, which fails `/healthz`.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from faultline import config
from faultline.errors import ConfigError

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent thread ends
WATCH_S = 0.5  # how often the watcher looks at the processes
COMMAND = ("analyzer", "process")  # the hidden command a process runs (after `python -m faultline`)


@dataclass(frozen=True)
class Spec:
    """What a process is told on its standard input."""

    settings: config.AnalyzerConfig
    index: int
    addresses: tuple[str, ...]
    owner: str
    parent: int


class ProcessGroup:
    """Processes 1..`processes`-1 of the replica: `start` (from the main thread: the kernel signals a
    child when the thread that started it ends), `failed`, `signal`, then `stop`, which joins the
    watcher and waits for (or kills) every process."""

    def __init__(
        self, settings: config.AnalyzerConfig, owner: str, *, on_failure: Callable[[], None] = lambda: None
    ) -> None:
        self.settings = settings
        self.owner = owner
        self.on_failure = on_failure
        self.processes = settings.processes
        self.addresses: list[str] = []
        self.popen: list[subprocess.Popen[bytes]] = []
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        if self.processes < 2:
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the analyzer's processes are started from the main thread")
        port = self.settings.process_port
        self.addresses = [f"127.0.0.1:{port + i}" for i in range(self.processes)]
        for i in range(1, self.processes):
            spec = Spec(self.settings, i, tuple(self.addresses), self.owner, os.getpid())
            child = subprocess.Popen(  # noqa: S603 - this program, with its settings on stdin
                [sys.executable, "-m", "faultline", *COMMAND], stdin=subprocess.PIPE
            )  # fmt: skip
            assert child.stdin is not None
            with child.stdin:
                child.stdin.write(pickle.dumps(spec))
            self.popen.append(child)
        self._watcher = threading.Thread(target=self._watch, name="analyzer-processes", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._done.wait(WATCH_S):
            if self.failed(wait=0) is not None:
                self.on_failure()
                return

    def failed(self, wait: float = 2.0) -> str | None:
        """Which process exited with an error (waiting up to `wait` s for one to be seen), or None."""
        deadline = time.monotonic() + wait
        while True:
            for i, p in enumerate(self.popen, start=1):
                if p.poll() not in (None, 0):
                    return f"process {i} of {self.processes} exited with {p.returncode}"
            if not self.popen or time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def signal(self) -> None:
        """Ask every process to stop (the lease is lost: their output is dropped from now on)."""
        for p in self.popen:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        """After the flow ended (they end with it): join the watcher, wait for them, kill what is left."""
        self._done.set()
        if self._watcher is not None:
            self._watcher.join()
        for p in self.popen:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def read_spec(stream: BinaryIO) -> Spec:
    """A process's settings, from its parent (a pipe only the parent writes)."""
    spec = pickle.load(stream)  # noqa: S301 - written by this program's own parent process
    if not isinstance(spec, Spec):
        raise ConfigError("analyzer process: its standard input is not what the replica sends")
    return spec


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent ends; if it already has, stop now."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # the parent ended before the setting took
        raise ConfigError(f"analyzer process: process 0 ({parent}) is gone")
