"""Cluster DNS for the real nodes' pods: the names a pod looks up for a Service, answered from the API
server's Services and EndpointSlices (what CoreDNS's `kubernetes` plugin answers in a real cluster). The
kubelet gives it to pods as `clusterDNS`; it listens on the pods' bridge address, port 53, UDP.

- `<service>.<namespace>.svc.<domain>` A: the Service's cluster IP (kube-proxy routes it); for a headless
  Service (clusterIP None), the addresses of its ready endpoints (the chart's PostgreSQL);
- `<hostname>.<service>.<namespace>.svc.<domain>` A: a headless Service's endpoint with that hostname (a
  StatefulSet's pod);
- any other name under the domain: NXDOMAIN; another type (AAAA, ...) for a name that exists: no data
  (NOERROR, no answer), so a resolver asking for both families keeps the A answer;
- names outside the domain: forwarded to the machine's own name servers (/etc/resolv.conf); SERVFAIL when
  none answers.

Not served: SRV records, ExternalName Services (no data), IPv6, PTR, TCP (the answers are a few records).
Every query reads the API (no cache): a lookup costs one or two GETs on loopback, and no answer is staler
than the API. The DNS wire format is dnspython's (a dependency of pymongo, already in the lock and the
image): parsing and writing messages is that library's job, not this module's.

    dns = ClusterDNS("10.89.1.1", api_reader(server, ssl_context)).start()
    dns.resolve("fl-ferretdb.ns.svc.cluster.local")    # ["10.0.0.57"]
    dns.stop()
"""

from __future__ import annotations

import json
import re
import socketserver
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.query
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

TTL = 5  # seconds: resolvers that cache keep an answer no longer than a Service change takes to matter
FORWARD_TIMEOUT = 2.0
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # an RFC 1123 label: Service and namespace names

Get = Callable[[str], dict[str, Any] | None]  # an API path -> its JSON, None when 404


def api_reader(server: str, context: ssl.SSLContext) -> Get:
    """GETs on the API server at `server` with the client certificate in `context`."""

    def get(path: str) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(server + path, context=context, timeout=5) as resp:  # noqa: S310
                return dict(json.load(resp))
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404:
                return None
            raise

    return get


def host_nameservers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[tuple[str, int]]:
    """The machine's name servers (address, port), where out-of-cluster names are forwarded."""
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return []
    words = [line.split() for line in lines]
    return [(w[1], 53) for w in words if len(w) > 1 and w[0] == "nameserver"]


class ClusterDNS:
    def __init__(
        self,
        address: str,
        get: Get,
        *,
        domain: str = "cluster.local",
        port: int = 53,
        upstream: list[tuple[str, int]] | None = None,
    ) -> None:
        self.address = address
        self.port = port
        self.zone = dns.name.from_text(domain)
        self.get = get
        self.upstream = host_nameservers() if upstream is None else upstream
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ClusterDNS:
        self._server = _Server((self.address, self.port), _Handler)
        self._server.dns = self
        self.port = int(self._server.server_address[1])  # port 0: the one the system chose
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="cluster-dns", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    # -- answering -----------------------------------------------------------------------------------
    def answer(self, wire: bytes) -> bytes | None:
        """The reply to one query in wire format (None: not a DNS message, nothing to reply to)."""
        try:
            query = dns.message.from_wire(wire)
        except dns.exception.DNSException:
            return None
        if query.opcode() != dns.opcode.QUERY or len(query.question) != 1:
            refused = dns.message.make_response(query, recursion_available=False)
            refused.set_rcode(dns.rcode.NOTIMP)
            return refused.to_wire()
        question = query.question[0]
        if not question.name.is_subdomain(self.zone):
            return self._forward(query)
        response = dns.message.make_response(query, recursion_available=False)
        response.flags |= dns.flags.AA
        try:
            addresses = self.resolve(question.name.to_text())
        except Exception:  # noqa: BLE001 - the API did not answer: the resolver may try again
            response.set_rcode(dns.rcode.SERVFAIL)
            return response.to_wire()
        if addresses is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif addresses and question.rdtype in (dns.rdatatype.A, dns.rdatatype.ANY):
            rrset = dns.rrset.from_text_list(
                question.name, TTL, dns.rdataclass.IN, dns.rdatatype.A, addresses
            )
            response.answer.append(rrset)
        return response.to_wire()

    def resolve(self, name: str) -> list[str] | None:
        """The IPv4 addresses of a name under the cluster domain; None when there is no such name."""
        qname = dns.name.from_text(name)
        if not qname.is_subdomain(self.zone):
            return None
        labels = [label.decode("ascii", "replace").lower() for label in qname.relativize(self.zone).labels]
        if (
            len(labels) not in (3, 4)
            or labels[-1] != "svc"
            or not all(LABEL.fullmatch(x) for x in labels[:-1])
        ):
            return None
        *host, service, namespace, _ = labels
        found = self.get(f"/api/v1/namespaces/{namespace}/services/{service}")
        if found is None:
            return None
        spec = found.get("spec") or {}
        headless = spec.get("clusterIP") == "None"
        if not host:
            if spec.get("type") == "ExternalName":
                return []
            if not headless:
                return [
                    ip for ip in spec.get("clusterIPs") or [spec.get("clusterIP")] if ip and ":" not in ip
                ]
            return [address for _, address in self._endpoints(namespace, service)]
        if not headless:
            return None
        addresses = [
            address for hostname, address in self._endpoints(namespace, service) if hostname == host[0]
        ]
        return addresses or None

    def _endpoints(self, namespace: str, service: str) -> list[tuple[str, str]]:
        """(hostname, address) of the Service's ready IPv4 endpoints."""
        selector = urllib.parse.quote(f"kubernetes.io/service-name={service}", safe="")
        path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?labelSelector={selector}"
        slices = (self.get(path) or {}).get("items") or []
        found = []
        for piece in slices:
            if piece.get("addressType") != "IPv4":
                continue
            for endpoint in piece.get("endpoints") or []:
                if (endpoint.get("conditions") or {}).get("ready") is False:
                    continue
                found += [(endpoint.get("hostname") or "", a) for a in endpoint.get("addresses") or []]
        return sorted(set(found))

    def _forward(self, query: dns.message.Message) -> bytes:
        for server, port in self.upstream:
            try:
                return dns.query.udp(query, server, port=port, timeout=FORWARD_TIMEOUT).to_wire()
            except (dns.exception.DNSException, OSError):
                continue
        failed = dns.message.make_response(query)
        failed.set_rcode(dns.rcode.SERVFAIL)
        return failed.to_wire()


class _Server(socketserver.ThreadingUDPServer):
    daemon_threads = True
    dns: ClusterDNS


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        wire, sock = self.request
        reply = self.server.dns.answer(wire)
        if reply is not None:
            sock.sendto(reply, self.client_address)
