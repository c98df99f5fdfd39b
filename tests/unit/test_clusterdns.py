"""The real nodes' cluster DNS, asked over UDP in DNS wire format as a pod's resolver asks it, with the
API's answers given as a table (path -> JSON): Service names, headless Services and their pods' names,
what does not exist, other record types, names outside the cluster domain, and input that is not DNS."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest

from devtools import clusterdns

SLICES = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{svc}"
API: dict[str, dict[str, Any]] = {
    "/api/v1/namespaces/store/services/fl-ferretdb": {"spec": {"clusterIP": "10.0.0.57", "clusterIPs": ["10.0.0.57"]}},
    "/api/v1/namespaces/store/services/fl-postgres": {"spec": {"clusterIP": "None"}},
    "/api/v1/namespaces/store/services/away": {"spec": {"type": "ExternalName", "externalName": "example.org"}},
    SLICES.format(ns="store", svc="fl-postgres"): {
        "items": [
            {
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["10.89.1.7"], "hostname": "fl-postgres-0", "conditions": {"ready": True}},
                    {"addresses": ["10.89.1.9"], "hostname": "fl-postgres-1", "conditions": {"ready": False}},
                    {"addresses": ["10.89.1.8"]},  # no conditions: ready
                ],
            },
            {"addressType": "IPv6", "endpoints": [{"addresses": ["fd00::7"]}]},
        ]
    },
}  # fmt: skip
ASKED: list[str] = []


def _get(path: str) -> dict[str, Any] | None:
    ASKED.append(path)
    return API.get(path)


@pytest.fixture
def server() -> Iterator[clusterdns.ClusterDNS]:
    dns_server = clusterdns.ClusterDNS("127.0.0.1", _get, port=0, upstream=[]).start()
    ASKED.clear()
    try:
        yield dns_server
    finally:
        dns_server.stop()


def _ask(server: clusterdns.ClusterDNS, name: str, rdtype: str = "A") -> dns.message.Message:
    return dns.query.udp(dns.message.make_query(name, rdtype), "127.0.0.1", port=server.port, timeout=5)


def _addresses(reply: dns.message.Message) -> list[str]:
    return sorted(r.address for rrset in reply.answer for r in rrset)


def test_a_service_name_is_its_cluster_ip(server: clusterdns.ClusterDNS) -> None:
    reply = _ask(server, "fl-ferretdb.store.svc.cluster.local.")
    assert reply.rcode() == dns.rcode.NOERROR
    assert _addresses(reply) == ["10.0.0.57"]
    assert reply.answer[0].ttl == clusterdns.TTL
    assert ASKED == ["/api/v1/namespaces/store/services/fl-ferretdb"]


def test_names_are_case_insensitive(server: clusterdns.ClusterDNS) -> None:
    assert _addresses(_ask(server, "FL-FerretDB.Store.SVC.cluster.LOCAL.")) == ["10.0.0.57"]


def test_a_headless_service_is_its_ready_ipv4_endpoints_and_each_pod_its_own(
    server: clusterdns.ClusterDNS,
) -> None:
    assert _addresses(_ask(server, "fl-postgres.store.svc.cluster.local.")) == ["10.89.1.7", "10.89.1.8"]
    assert _addresses(_ask(server, "fl-postgres-0.fl-postgres.store.svc.cluster.local.")) == ["10.89.1.7"]
    not_ready = _ask(server, "fl-postgres-1.fl-postgres.store.svc.cluster.local.")
    assert not_ready.rcode() == dns.rcode.NXDOMAIN


@pytest.mark.parametrize(
    "name",
    [
        "missing.store.svc.cluster.local.",  # no such Service
        "fl-ferretdb.other.svc.cluster.local.",  # not in that namespace
        "fl-ferretdb.store.svc.store.svc.cluster.local.",  # a search-list expansion: too many labels
        "fl-ferretdb.store.cluster.local.",  # not under svc
        "x.fl-ferretdb.store.svc.cluster.local.",  # a pod name under a Service with a cluster IP
        "fl_ferretdb.store.svc.cluster.local.",  # not a Service name at all: the API is not asked
        "store.svc.cluster.local.",
    ],
)
def test_other_names_under_the_domain_do_not_exist(server: clusterdns.ClusterDNS, name: str) -> None:
    reply = _ask(server, name)
    assert reply.rcode() == dns.rcode.NXDOMAIN
    assert not reply.answer
    assert all("_" not in path for path in ASKED)


def test_another_type_for_a_name_that_exists_is_no_data(server: clusterdns.ClusterDNS) -> None:
    reply = _ask(server, "fl-ferretdb.store.svc.cluster.local.", "AAAA")
    assert reply.rcode() == dns.rcode.NOERROR  # not NXDOMAIN: the A answer stays good
    assert not reply.answer
    external = _ask(server, "away.store.svc.cluster.local.")
    assert external.rcode() == dns.rcode.NOERROR and not external.answer


def test_the_answer_is_authoritative_and_keeps_the_query_id(server: clusterdns.ClusterDNS) -> None:
    query = dns.message.make_query("fl-ferretdb.store.svc.cluster.local.", "A")
    reply = dns.query.udp(query, "127.0.0.1", port=server.port, timeout=5)
    assert reply.id == query.id
    assert reply.flags & dns.flags.AA


def test_names_outside_the_domain_go_to_the_upstream_servers_or_fail(server: clusterdns.ClusterDNS) -> None:
    assert _ask(server, "fl-ferretdb.store.svc.example.").rcode() == dns.rcode.SERVFAIL  # no upstream
    upstream = clusterdns.ClusterDNS("127.0.0.1", _get, domain="example", port=0, upstream=[]).start()
    try:
        server.upstream = [("127.0.0.1", upstream.port)]
        reply = _ask(server, "fl-ferretdb.store.svc.example.")  # the upstream's own name for the Service
        assert _addresses(reply) == ["10.0.0.57"]
    finally:
        upstream.stop()


def test_the_api_failing_is_a_server_failure(server: clusterdns.ClusterDNS) -> None:
    def broken(path: str) -> dict[str, Any] | None:
        raise OSError("connection refused")

    server.get = broken
    assert _ask(server, "fl-ferretdb.store.svc.cluster.local.").rcode() == dns.rcode.SERVFAIL


def test_what_is_not_dns_gets_no_reply(server: clusterdns.ClusterDNS) -> None:
    assert server.answer(b"\x00\x01not dns") is None
    query = dns.message.make_query("fl-ferretdb.store.svc.cluster.local.", "A")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(b"garbage", ("127.0.0.1", server.port))
        s.sendto(query.to_wire(), ("127.0.0.1", server.port))
        first = dns.message.from_wire(s.recv(512))  # the garbage got nothing: the query's reply comes first
    assert first.id == query.id


def test_the_host_name_servers_come_from_resolv_conf(tmp_path: Any) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "# comment\nsearch example.org\nnameserver 10.255.255.53\nnameserver 1.1.1.1\noptions ndots:1\n"
    )
    assert clusterdns.host_nameservers(conf) == [("10.255.255.53", 53), ("1.1.1.1", 53)]
    assert clusterdns.host_nameservers(tmp_path / "missing") == []
