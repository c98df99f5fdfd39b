"""The analyzer's Bytewax cluster: where its processes are (`layout`: one pod, or pods of a StatefulSet,
setting `peers`), and this pod's other processes (setting `processes`): one object starts them, watches
them and stops them.

Process 0 (the replica's own) holds the lease, reads the feed and runs the flow in its main thread.
Processes 1 to N-1 run the same flow without the reader, as the hidden command `faultline analyzer
process`, given their settings on standard input (so a secret never shows in an argument list or an
environment), and talk over loopback on the ports `process_port` to `process_port + N - 1`: fixed, and
below Linux's ephemeral range, so no outgoing connection can take one between choosing and binding it.

Spread over pods (`peers`: every pod's host:port, a StatefulSet's stable names), pod p runs processes
p x `processes` to (p + 1) x `processes` - 1 on the ports from its peer's port on; the processes of pod 0
are the ones above (pod 0 holds the lease and reads). Each process is given every address, with its own
as 0.0.0.0 (it listens there) and its pod's others on loopback; Bytewax (timely) connects a process to
each lower one, retrying every second until it answers, so the pods may start in any order. The pods
other than 0 hold no lease: they join once pod 0 holds it running the same settings (`fingerprint`: a
pod of an update half done waits for the rest), and their output is written while it does (`LeaseGuard`).

Ownership: the kernel ends each of them when process 0 ends (`PR_SET_PDEATHSIG` with SIGKILL, set in the
child before it does anything), so nothing polls for orphans. When one of them fails, the group's watcher
thread calls `on_failure` (process 0's flow is asked to stop); Bytewax itself fails a cluster whose peer
is gone, and a flow that stops neither way stops making progress, which fails `/healthz`.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import pickle
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from faultline import config
from faultline.errors import ConfigError, FaultlineError, TransientError

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent thread ends
WATCH_S = 0.5  # how often the watcher looks at the processes
COMMAND = ("analyzer", "process")  # the hidden command a process runs (after `python -m faultline`)


ORDINAL = re.compile(r"-(\d+)$")  # a StatefulSet pod's name ends with its ordinal
LEASE_CHECK_S = 5.0  # how long a member pod trusts its last look at the lease's holder
LEADER_POLL_S = 1.0  # how often a member pod looks for pod 0 holding the lease before it joins
# the settings that shape the flow, which every pod of the cluster must run alike (with the patterns)
SHAPE = ("workers", "processes", "peers", "checkpoint_interval", "node_labels", "anomaly", "anomaly_fields",
         "anomaly_warmup", "anomaly_expire")  # fmt: skip
CODE = ("cli", "dataflows", "faultline", "patterns", "sinks", "sources")  # the packages the flow's code is in


@dataclass(frozen=True)
class Layout:
    """The analyzer's cluster as this pod sees it: `hosts` (per process, in process order: its host and
    port), this pod's `first` process and its `processes`, `leader` (pod 0's peer address, None with one
    pod)."""

    hosts: tuple[tuple[str, int], ...]
    first: int
    processes: int
    leader: str | None

    @property
    def place(self) -> int:
        """This pod's place among the pods (0: it holds the lease and reads the feed)."""
        return self.first // self.processes

    @property
    def clustered(self) -> bool:
        return len(self.hosts) > 1

    def addresses(self, index: int) -> list[str]:
        """Every process's address as process `index` (of this pod) uses them: its own to listen on (all
        interfaces), its pod's others on loopback, the other pods' by their names."""
        mine = range(self.first, self.first + self.processes)
        out = []
        for i, (name, port) in enumerate(self.hosts):
            host = name
            if i == index and self.leader is not None:
                host = "0.0.0.0"  # noqa: S104 - the port its peers connect to
            elif i in mine:
                host = "127.0.0.1"
            out.append(f"{host}:{port}")
        return out


def layout(settings: config.AnalyzerConfig, hostname: str | None = None) -> Layout:
    """Where this pod's processes sit in the analyzer's cluster (a ConfigError naming the setting when
    the pods' settings do not fit)."""
    n = settings.processes
    if not settings.peers:
        local = tuple(("127.0.0.1", settings.process_port + i) for i in range(n))
        return Layout(local if n > 1 else local[:1], 0, n, None)
    hostname = hostname if hostname is not None else socket.gethostname()
    place = settings.peer_index
    if place is None:
        found = ORDINAL.search(hostname)
        if found is None:
            raise ConfigError(f"peers: this pod's place is not given (peer_index) and its host name "
                              f"{hostname!r} does not end with -<ordinal> (a StatefulSet pod's)")  # fmt: skip
        place = int(found.group(1))
    if place >= len(settings.peers):
        raise ConfigError(f"peers: this pod's place is {place}, but {len(settings.peers)} peers are given "
                          f"({', '.join(settings.peers)})")  # fmt: skip
    if settings.owner:
        raise ConfigError("owner: not with peers (each pod's owner names its pod, and the other pods "
                          "write while pod 0's holds the lease)")  # fmt: skip
    hosts: list[tuple[str, int]] = []
    for peer in settings.peers:
        host, _, port = peer.rpartition(":")  # a port up to 65000, and 16 processes at most: all fit
        hosts += [(host, int(port) + i) for i in range(n)]
    return Layout(tuple(hosts), place * n, n, settings.peers[0])


def fingerprint(settings: config.AnalyzerConfig, patterns: Mapping[str, Any], code: str = "") -> str:
    """What the pods of one cluster must run alike, in short: the settings that shape the flow (SHAPE),
    the cluster patterns (`patterns`: by id, as JSON data) and the code (`code`: `code_identity()`). Pods
    of a StatefulSet being updated run two versions for a while; a member joins pod 0 only when theirs
    are the same."""
    shape = settings.model_dump(mode="json", include=set(SHAPE))
    shape["patterns"] = dict(patterns)
    shape["code"] = code
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def code_identity() -> str:
    """The code a pod runs: a digest of this project's Python files and Bytewax's version (an image
    update that changes no setting still changes this)."""
    from importlib import metadata  # noqa: PLC0415

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(metadata.version("bytewax").encode())
    for package in CODE:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def owner(where: Layout, default: str, print_: str = "") -> str:
    """This pod's name in the analyzer's lease: pod 0 of several is named by its peer address, which
    every pod is given (so the others know whose lease lets them write), its settings' fingerprint
    (`print_`: so they know it runs theirs) and this start of it (pid and a random part: a container's
    pid is the same at each start); otherwise `default`."""
    if where.leader is not None and where.place == 0:
        return f"analyzer/{where.leader}/{print_}/{os.getpid()}.{secrets.token_hex(4)}"
    return default


def led_by(holder: str | None, leader: str, print_: str) -> bool | None:
    """Whether the lease's `holder` is pod 0 (`leader`: its peer address) running the settings whose
    fingerprint is `print_` (True), pod 0 running others (False: the pods are being updated), or
    another owner or none (None)."""
    parts = (holder or "").split("/")
    if len(parts) != 4 or parts[0] != "analyzer" or parts[1] != leader:
        return None
    return parts[2] == print_


class OtherSettingsError(FaultlineError):
    """Pod 0 has held the lease running other settings for longer than a member waits."""


def wait_for_leader(
    holder: Callable[[], str | None], leader: str, print_: str, stop: threading.Event, *,
    say: Callable[[str], None], beat: Callable[[], None] = lambda: None, poll: float = LEADER_POLL_S,
    other_for: float = float("inf"),
) -> str | None:  # fmt: skip
    """A member pod's wait, before it reads the checkpoints and joins: until pod 0 holds the lease running
    the same settings (its owner, which the member then holds to), or `stop` (None). `holder()` raises
    TransientError while the store is away; `say` is told each new reason to wait once. Pod 0 running
    other settings for `other_for` seconds on end raises OtherSettingsError: the member starts again and
    reads its settings and packs again (a ConfigMap of packs changes under a running pod)."""
    said = ""
    other_since: float | None = None
    while not stop.is_set():
        try:
            owner = holder()
            found = led_by(owner, leader, print_)
            why = ("pod 0 holds the lease running other settings (the pods being updated?)" if found is False
                   else f"waiting for pod 0 ({leader}) to hold the lease")  # fmt: skip
        except TransientError as exc:
            owner, found, why = None, None, f"the store: {exc}"
        if found:
            return owner
        other_since = (other_since or time.monotonic()) if found is False else None
        if other_since is not None and time.monotonic() - other_since >= other_for:
            raise OtherSettingsError(f"pod 0 has held the lease running other settings for {other_for:.0f} s")
        if why != said:
            say(why)
            said = why
        beat()
        stop.wait(poll)
    return None


class LeaseGuard:
    """Whether the analyzer's lease is still held by the start of pod 0 this member joined (`joined`: its
    owner, `analyzer/<leader>/<fingerprint>/<pid>.<random>`), as a member pod's output asks before each
    batch and its watch every `every` seconds; the holder (`holder()`, raising TransientError while the
    store is away: the last answer stands) is read at most every `every` seconds. Once the lease is seen
    held otherwise, the answer is no for good and `on_lost` is called (the member pod's main process
    stops, which fails the cluster's flow; its other processes write nothing more and end with it): no
    output dropped may be followed by a later checkpoint, and the pods join the next cluster from the
    checkpoints."""

    def __init__(
        self, holder: Callable[[], str | None], joined: str, *, every: float = LEASE_CHECK_S,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:  # fmt: skip
        self.holder = holder
        self.joined = joined
        self.every = every
        self.on_lost = on_lost
        self.lost = False
        self._at = float("-inf")
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        with self._lock:
            if self.lost or time.monotonic() - self._at < self.every:
                return not self.lost
            try:
                owner = self.holder()
            except TransientError:
                return True  # the sink's own writes wait for the store
            self._at = time.monotonic()
            if owner == self.joined:
                return True
            self.lost = True
        self.on_lost()
        return False


@dataclass(frozen=True)
class Spec:
    """What a process is told on its standard input."""

    settings: config.AnalyzerConfig
    index: int
    addresses: tuple[str, ...]
    owner: str
    parent: int
    joined: str | None = (
        None  # a member pod's process: pod 0's owner in the lease (it writes while that holds)
    )


class ProcessGroup:
    """Processes 1..`processes`-1 of the replica: `start` (from the main thread: the kernel signals a
    child when the thread that started it ends), `failed`, `signal`, then `stop`, which joins the
    watcher and waits for (or kills) every process."""

    def __init__(
        self, settings: config.AnalyzerConfig, owner: str, *, on_failure: Callable[[], None] = lambda: None,
        where: Layout | None = None, joined: str | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.owner = owner
        self.joined = joined  # a member pod's: the owner of the lease its processes write while it holds
        self.on_failure = on_failure
        self.where = where if where is not None else layout(settings)
        self.processes = settings.processes
        self.addresses: list[str] = []  # process 0's, once started (empty: no cluster)
        self.popen: list[subprocess.Popen[bytes]] = []
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        where = self.where
        if not where.clustered:
            return
        self.addresses = where.addresses(where.first)
        if self.processes < 2:
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the analyzer's processes are started from the main thread")
        for i in range(where.first + 1, where.first + self.processes):
            spec = Spec(self.settings, i, tuple(where.addresses(i)), self.owner, os.getpid(), self.joined)
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
