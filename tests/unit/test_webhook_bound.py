"""The admission webhook's bounded pool (`workers.webhook.WebhookServer`): clients that connect and never
speak hold at most `max_concurrent` request threads; one more connection is closed unanswered and counted,
and once they leave a real AdmissionReview is answered again."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.test_webhook_certs import ADMISSION_REVIEW
from workers import preflight_inject, webhook, webhook_certs
from workers.webhook_certs import Validity, plan

BOUND = 3


def _refused() -> float:
    return webhook.REGISTRY.get_sample_value("faultline_webhook_refused_total") or 0.0


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition(), what


@pytest.mark.redteam
def test_a_flood_of_silent_clients_is_bounded_and_counted(tmp_path: Path) -> None:
    validity = Validity(dt.timedelta(days=100), dt.timedelta(days=30), dt.timedelta(days=10))
    now = dt.datetime.now(dt.UTC)
    bundle = plan(None, now, webhook_certs.service_hosts("wh", "ns", ["127.0.0.1"]), validity)
    assert bundle is not None
    (tmp_path / "ca.crt").write_bytes(bundle.trusted(now))
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    server = webhook.WebhookServer(
        ("127.0.0.1", 0),
        preflight_inject.InjectSettings(image="img"),
        lambda _ns: {"faultline.io/preflight": "enabled"},
        webhook.context_from_pem(bundle.cert, bundle.key),
        max_concurrent=BOUND,
    )
    server.threads = [threading.Thread(target=server.serve_forever, name="webhook", daemon=True)]
    server.threads[0].start()
    port = server.server_address[1]
    silent: list[socket.socket] = []
    try:
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(BOUND)]  # never say a word
        _wait(lambda: server.in_flight == BOUND, f"{BOUND} requests in flight")
        before = _refused()
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            assert extra.recv(1) == b""  # closed at once, no TLS handshake offered
        finally:
            extra.close()
        _wait(lambda: _refused() == before + 1, "the refused connection counted")
        assert server.in_flight == BOUND
        for sock in silent:
            sock.close()  # their handshakes fail: the threads end
        _wait(lambda: server.in_flight == 0, "no request in flight")
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=client, timeout=10)
        body = ADMISSION_REVIEW
        try:
            conn.request("POST", "/mutate", json.dumps(body), {"Content-Type": "application/json"})
            answer = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        assert answer["response"]["uid"] == "u" and answer["response"]["allowed"] is True
        assert _refused() == before + 1
    finally:
        for sock in silent:
            sock.close()
        server.close()
    assert not server.threads[0].is_alive()
