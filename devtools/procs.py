"""Child processes that never outlive their owner: each runs in its own process group, is stopped with
SIGTERM then SIGKILL, and every group still alive is stopped at interpreter exit."""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from faultline.errors import TransientError

_LIVE: set[Proc] = set()
_LOCK = threading.Lock()


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> int:
    """The first of `count` consecutive loopback TCP ports that were all free a moment ago, below the
    kernel's ephemeral range: a port from `free_port` is in that range, and the ports after it may be the
    local end of any connection made meanwhile (Bytewax's processes listen on consecutive ports)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()  # noqa: S311 - a port to try, not a secret
    for _ in range(200):
        first = rng.randrange(10000, max(10001, low - count))
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise TransientError(f"no {count} consecutive free loopback ports found below {low}")


class Proc:
    """A named child process whose output goes to a log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> None:
        self.name = name
        self.stop_signal = stop_signal
        self.argv = list(argv)
        self.log = log
        self._log = log.open("ab")
        self.popen = subprocess.Popen(  # noqa: S603 - argv built from our own binaries and flags
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        with _LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Signal the whole process group (SIGTERM unless told), SIGKILL it if it lingers, reap it."""
        try:
            if self.alive():
                _signal_group(self.popen.pid, self.stop_signal)
                try:
                    self.popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    _signal_group(self.popen.pid, signal.SIGKILL)
                    self.popen.wait(5)
            # children that left the group leader behind
            _signal_group(self.popen.pid, signal.SIGKILL)
        finally:
            self._log.close()
            with _LOCK:
                _LIVE.discard(self)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_all() -> None:
    with _LOCK:
        procs = list(_LIVE)
    for proc in reversed(procs):
        proc.stop(timeout=5)


atexit.register(stop_all)


def wait_for(
    what: str, check: Callable[[], bool], timeout: float, *, proc: Proc | None = None, interval: float = 0.1
) -> None:
    """Poll `check` until it is true; fail early if `proc` died, with the end of its log."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise TransientError(
                f"{proc.name} exited ({proc.popen.returncode}) before {what}:\n{proc.tail()}"
            )
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - any failure of the probe means "not yet"
            last = exc
        time.sleep(interval)
    tail = f"\n{proc.tail()}" if proc is not None else ""
    raise TransientError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last}){tail}")


def alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie is dead already)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def pids_named(names: Sequence[str]) -> list[tuple[int, str]]:
    """(pid, name) of running processes whose executable name is one of `names` (reads /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm in names:
            found.append((int(entry.name), comm))
    return found
