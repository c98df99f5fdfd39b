"""`devtools.procs.free_ports`: consecutive loopback ports for processes that listen on a port and the
ones after it (the analyzer's Bytewax processes), outside the range the kernel hands to connections."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any

import pytest

from devtools import procs


def _bind_all(first: int, count: int) -> None:
    with contextlib.ExitStack() as held:
        for port in range(first, first + count):
            held.enter_context(socket.socket()).bind(("127.0.0.1", port))


def test_consecutive_free_ports_lie_below_the_ephemeral_range_and_can_be_bound() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for count in (1, 2, 4):
        first = procs.free_ports(count)
        assert first >= 10000 and first + count <= low
        _bind_all(first, count)


def test_a_range_with_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = procs.free_ports(3)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken + 2))  # the last of the first range tried
        holder.listen()
        free = procs.free_ports(3)
        tries = iter([taken, free])

        class Picks:
            def __init__(self, *_: Any) -> None: ...

            def randrange(self, *_: Any) -> int:
                return next(tries)

        monkeypatch.setattr(procs.random, "Random", Picks)
        assert procs.free_ports(3) == free
        assert next(tries, None) is None  # both ranges looked at
