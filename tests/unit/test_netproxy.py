"""The chaos suite's fault-injecting TCP proxy against a loopback echo server: bytes pass both ways in
order, a delay holds each chunk back, a partition lets nothing through (the client's own timeout
fires), a rejection closes every connection (the server gone), and healing resets the connections that
lived through either while new ones pass."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from devtools.netproxy import NetProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[NetProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with NetProxy(server.server_address[1]) as p:
        yield p
    server.shutdown()
    server.server_close()


def _connect(p: NetProxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", p.port), timeout=timeout)


def _echo(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_bytes_pass_both_ways_in_order(proxy: NetProxy) -> None:
    data = bytes(range(256)) * 2000  # 512 KB: many chunks
    with _connect(proxy) as sock:
        assert _echo(sock, data) == data
    assert proxy.connections == 1


def test_a_delay_holds_each_direction_back(proxy: NetProxy) -> None:
    proxy.set_delay(0.2)
    with _connect(proxy) as sock:
        started = time.monotonic()
        assert _echo(sock, b"ping") == b"ping"
        assert time.monotonic() - started >= 0.4  # 0.2 s there and 0.2 s back, never less
        proxy.set_delay(0.0)
        assert _echo(sock, b"pong") == b"pong"


def test_a_partition_lets_nothing_through_and_healing_resets_its_connections(proxy: NetProxy) -> None:
    with _connect(proxy) as before:
        assert _echo(before, b"a") == b"a"
        proxy.partition()
        with _connect(proxy, timeout=0.5) as during:  # the proxy accepts it, but nothing passes:
            during.sendall(b"b")
            with pytest.raises(TimeoutError):  # the client's own timeout fires
                during.recv(1)
        before.settimeout(0.5)
        before.sendall(b"c")
        with pytest.raises(TimeoutError):
            before.recv(1)
        proxy.heal()
        assert _closed(before)  # the connection that lived through the partition is gone
    with _connect(proxy) as after:
        assert _echo(after, b"d") == b"d"


def test_a_negative_delay_is_refused(proxy: NetProxy) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        proxy.set_delay(-1)


def test_reject_closes_every_connection_until_healed(proxy: NetProxy) -> None:
    with _connect(proxy) as before:
        assert _echo(before, b"a") == b"a"
        proxy.reject()
        assert _closed(before)
    with _connect(proxy) as during:
        assert _closed(during)
    assert proxy.rejected >= 1
    proxy.heal()
    with _connect(proxy) as after:
        assert _echo(after, b"b") == b"b"


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
