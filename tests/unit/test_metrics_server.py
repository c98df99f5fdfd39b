"""The metrics and health server listens where a kubelet's probe arrives: the pod IP, not loopback."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from faultline import config, metrics


def _ipv4_addresses() -> list[str]:
    """This machine's IPv4 addresses, one per interface (SIOCGIFADDR; Linux)."""
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):  # an interface without an IPv4 address
                out.append(socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, request)[20:24]))
    return out


def _ipv6_addresses() -> list[str]:
    """Global-scope IPv6 addresses (/proc/net/if_inet6: address, index, prefix, scope 00 = global, ...)."""
    lines = Path("/proc/net/if_inet6").read_text().splitlines() if Path("/proc/net/if_inet6").exists() else []
    return [str(ipaddress.IPv6Address(bytes.fromhex(f[0]))) for f in map(str.split, lines) if f[3] == "00"]


def _non_loopback(addresses: list[str]) -> str:
    usable = [a for a in addresses if not ipaddress.ip_address(a).is_loopback]
    if not usable:
        pytest.skip("no non-loopback address on this machine to reach the server on")
    return usable[0]


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("faultline_test_probe", "a counter for this test", registry=reg).inc()
    return reg


@pytest.fixture
def stop() -> Iterator[list[metrics.ThreadingHTTPServer]]:
    servers: list[metrics.ThreadingHTTPServer] = []
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def test_default_address_answers_on_a_non_loopback_address(
    registry: CollectorRegistry, stop: list[metrics.ThreadingHTTPServer]
) -> None:
    server = metrics.serve(0, registry=registry, health=lambda: True)
    stop.append(server)
    port = server.server_address[1]
    address = _non_loopback(_ipv4_addresses())
    assert _get(f"http://{address}:{port}/healthz") == (200, "ok\n")
    status, body = _get(f"http://{address}:{port}/metrics")
    assert status == 200
    assert "faultline_test_probe_total 1.0" in body


def test_ipv6_any_address(registry: CollectorRegistry, stop: list[metrics.ThreadingHTTPServer]) -> None:
    address = _non_loopback(_ipv6_addresses())
    server = metrics.serve(0, host="::", registry=registry, health=lambda: False)
    stop.append(server)
    port = server.server_address[1]
    with pytest.raises(urllib.request.HTTPError) as stalled:
        _get(f"http://[{address}]:{port}/healthz")
    assert stalled.value.code == 503
    stalled.value.close()


def test_loopback_only_when_asked(
    registry: CollectorRegistry, stop: list[metrics.ThreadingHTTPServer]
) -> None:
    server = metrics.serve(0, host="127.0.0.1", registry=registry, health=lambda: True)
    stop.append(server)
    port = server.server_address[1]
    address = _non_loopback(_ipv4_addresses())
    with pytest.raises(OSError, match="refused"):
        _get(f"http://{address}:{port}/healthz")


@pytest.mark.parametrize("component", ["agent", "quarantine", "drain", "remediation", "janitor"])
def test_every_component_listens_on_all_interfaces_by_default(component: str) -> None:
    model = config.COMPONENTS[component]
    assert model.model_fields["metrics_address"].default == "0.0.0.0"
