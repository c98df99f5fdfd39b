"""Liveness (`faultline.liveness`), the one lease renewer (`faultline.renewal`), the probe's answer, and the
admission webhook wedged for real: a client that opens a connection and never finishes its request holds
a request thread, and the webhook's own `/healthz` fails, naming it, until the request ends."""

from __future__ import annotations

import datetime as dt
import http.client
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from faultline import liveness, metrics, renewal
from faultline.errors import LeaseLostError
from workers import preflight_inject, webhook, webhook_certs
from workers.webhook_certs import Validity, plan


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_silent_past_its_limit_is_a_stall_until_it_beats_or_ends() -> None:
    clock = Clock()
    alive = liveness.Liveness(clock=clock)
    beat = alive.loop("claimer", 10.0)
    alive.loop("maintain", 30.0)
    assert alive() and alive.stalls() == []
    clock.now += 10.0
    assert alive()  # at the limit, not past it
    clock.now += 0.5
    assert not alive()
    assert [str(s) for s in alive.stalls()] == ["claimer: no progress for 10 s (limit 10 s)"]
    beat()
    assert alive()
    clock.now += 31.0
    assert [s.name for s in alive.stalls()] == ["claimer", "maintain"]
    alive.forget("maintain")
    alive.beat("claimer")
    alive.beat("never registered")  # ignored: nothing is watched that was not registered
    assert alive() and alive.names() == ["claimer"]


def test_the_renewer_renews_every_lease_and_drops_a_lost_one() -> None:
    renewed: list[str] = []
    lost: list[str] = []

    def renew(name: str) -> None:
        renewed.append(name)
        if name == "taken":
            raise LeaseLostError("taken over")
        if name == "flaky" and renewed.count("flaky") == 1:
            raise ConnectionError("the store away")

    r = renewal.Renewer("test-leases", 60.0)
    for name in ("kept", "taken", "flaky"):
        r.hold(name, lambda name=name: renew(name), lambda name=name: lost.append(name))  # type: ignore[misc]
    r.renew_all()
    assert sorted(renewed) == ["flaky", "kept", "taken"] and lost == ["taken"] and r.held() == 2
    r.renew_all()  # a failure other than a lost lease is tried again at the next pass
    assert renewed.count("flaky") == 2 and renewed.count("taken") == 1 and lost == ["taken"]
    r.drop("kept")
    r.renew_all()
    assert renewed.count("kept") == 2 and r.held() == 1


def test_drop_waits_for_a_renewal_in_progress_and_the_thread_is_joined() -> None:
    entered, release = threading.Event(), threading.Event()
    beats: list[float] = []

    def slow() -> None:
        entered.set()
        release.wait(5)

    r = renewal.Renewer("test-leases", 0.01, beat=lambda: beats.append(time.monotonic()))
    r.hold("claim", slow)
    r.start()
    assert entered.wait(5)
    dropped = threading.Event()
    dropper = threading.Thread(target=lambda: (r.drop("claim"), dropped.set()))
    dropper.start()
    assert not dropped.wait(0.2)  # the renewal under way finishes first: no write after the drop
    release.set()
    assert dropped.wait(5)
    dropper.join()
    assert r.stop(5) and beats


def _get(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def test_the_probe_names_the_stalled_loops_and_the_server_is_joined_on_close() -> None:
    clock = Clock()
    alive = liveness.Liveness(clock=clock)
    alive.loop("quarantine-0", 5.0)
    server = metrics.serve(0, host="127.0.0.1", health=alive)
    try:
        port = server.server_address[1]
        assert _get(port) == (200, "ok\n")
        clock.now += 7.0
        assert _get(port) == (503, "stalled: quarantine-0: no progress for 7 s (limit 5 s)\n")
    finally:
        server.close()
    assert server.thread is not None and not server.thread.is_alive()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The webhook's server context and a client context that trusts it."""
    validity = Validity(dt.timedelta(days=100), dt.timedelta(days=30), dt.timedelta(days=10))
    bundle = plan(
        None, dt.datetime.now(dt.UTC), webhook_certs.service_hosts("wh", "ns", ["127.0.0.1"]), validity
    )
    assert bundle is not None
    (tmp_path / "ca.crt").write_bytes(bundle.trusted(dt.datetime.now(dt.UTC)))
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    return webhook.context_from_pem(bundle.cert, bundle.key), client


def _healthz(port: int, client: ssl.SSLContext) -> tuple[int, str]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=client, timeout=10)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_the_webhook_with_a_request_that_never_completes_fails_its_own_probe(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_context, client = tls
    server = webhook.WebhookServer(("127.0.0.1", 0), preflight_inject.InjectSettings(image="img"),
                                   lambda _ns: None, server_context, stall=0.5)  # fmt: skip
    server.threads = [threading.Thread(target=server.serve_forever, name="webhook", daemon=True)]
    server.threads[0].start()
    port = server.server_address[1]
    try:
        assert _healthz(port, client) == (200, "ok")
        hung = socket.create_connection(("127.0.0.1", port))  # connects, never says a word
        try:
            deadline = time.monotonic() + 5
            while (answer := _healthz(port, client))[0] == 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert answer[0] == 503 and answer[1].startswith("stalled: request-"), answer
            assert "no progress for" in answer[1]
        finally:
            hung.close()  # the request ends (the handshake fails): no longer watched
        deadline = time.monotonic() + 5
        while _healthz(port, client) != (200, "ok") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _healthz(port, client) == (200, "ok")
    finally:
        server.close()
    assert not server.threads[0].is_alive()
