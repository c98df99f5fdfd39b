"""A worker whose store is not up yet waits for it with back-off instead of exiting (a crash loop while the
chart's embedded store starts beside it)."""

from __future__ import annotations

import socket

import pytest

from workers import run


class _StopWaitingError(Exception):
    pass


def test_a_worker_waits_for_its_store_with_back_off() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 7:
            raise _StopWaitingError

    with pytest.raises(_StopWaitingError):
        run._connect(f"mongodb://127.0.0.1:{port}/", "faultline", sleep=sleep, timeout=0.05)
    assert slept == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
