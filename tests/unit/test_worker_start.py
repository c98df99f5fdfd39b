"""A worker whose store is not up yet waits for it with back-off instead of exiting (a crash loop while the
chart's embedded store starts beside it); its API client keeps a connection for each of its threads."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from faultline import store
from faultline.config import DrainConfig, QuarantineConfig
from faultline.kube import client
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


def test_a_workers_api_client_keeps_a_connection_for_each_of_its_threads(
    unreachable_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers that call the API server from many threads at once size their client's connection pool
    from their `threads` (and no fewer than the floor), not from the machine's CPUs."""
    # a client that connects only when used: nothing here calls the store
    monkeypatch.setattr(run, "_connect", lambda uri, database: store.connect(uri, database, timeout=0.05))
    fields = {"mongodb_uri": "mongodb://127.0.0.1:1/", "kubeconfig": unreachable_kubeconfig}
    quarantine = run.quarantine_worker(QuarantineConfig(**fields, threads=40))
    drain = run.drain_worker(DrainConfig(**fields, threads=4))
    try:
        assert quarantine.api.configuration.connection_pool_maxsize == 40 + client.POOL_SPARE
        assert drain.api.configuration.connection_pool_maxsize == client.POOL_FLOOR
    finally:
        for worker in (quarantine, drain):
            worker.api.close()
            worker.store.close()
