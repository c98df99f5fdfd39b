"""A throw-away PKI for the local control plane: a CA, the API server's serving certificate, client
certificates for the admin and the control-plane components, and the service-account signing key."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devtools import kubeconfig

VALID_FOR = dt.timedelta(days=2)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


class LocalPKI:
    """Creates everything under `directory` at construction."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        self._ca_key = _key()
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("faultline-local-ca"))
            .issuer_name(_name("faultline-local-ca"))
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._now)
            .not_valid_after(self._now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = directory / "ca.crt"
        self.ca.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))
        self.apiserver = self._issue(
            "apiserver",
            "kube-apiserver",
            None,
            server=True,
            dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            ips=["127.0.0.1", "10.0.0.1"],
        )
        self.admin = self._issue("admin", "faultline-admin", "system:masters")
        self.controller_manager = self._issue("controller-manager", "system:kube-controller-manager", None)
        self.scheduler = self._issue("scheduler", "system:kube-scheduler", None)
        # kube-proxy on the real nodes: the bootstrap ClusterRoleBinding system:node-proxier names this user
        self.proxy = self._issue("kube-proxy", "system:kube-proxy", None)
        # the API server's client certificate towards kubelets (logs, exec), which authorize it by webhook
        self.kubelet_client = self._issue("kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
        sa = _key()
        self.sa_key = directory / "sa.key"
        self.sa_pub = directory / "sa.pub"
        _write_key(sa, self.sa_key)
        self.sa_pub.write_bytes(
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def _issue(
        self,
        stem: str,
        cn: str,
        org: str | None,
        *,
        server: bool = False,
        dns: list[str] | None = None,
        ips: list[str] | None = None,
    ) -> Pair:
        key = _key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._now)
            .not_valid_after(self._now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if dns or ips:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns or []]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips or []]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        pair = Pair(self.dir / f"{stem}.crt", self.dir / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair

    def node(self, name: str) -> Pair:
        """A kubelet's client certificate: the Node authorizer knows it as system:node:<name>."""
        return self._issue(f"node-{name}", f"system:node:{name}", "system:nodes")

    def kubeconfig(self, path: Path, server: str, client: Pair, user: str) -> Path:
        """A kubeconfig that authenticates with the client certificate `client`."""
        creds = {"client-certificate": str(client.cert), "client-key": str(client.key)}
        return kubeconfig.write(path, server, self.ca, user, creds)
