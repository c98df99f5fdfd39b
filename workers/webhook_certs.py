"""The webhook's certificates: a CA of its own and a serving certificate it signs, kept in a Secret so that
every replica serves the same one, and the CA bundle the API server trusts (the caBundle of the webhook's
MutatingWebhookConfiguration).

    plan(bundle, now, hosts, validity) -> Bundle | None   pure: the bundle to write, None when current
    Keeper.sync()                                         read the Secret, write a new bundle when `plan`
                                                          says so, set the configuration's caBundle

Rotation, decided by `plan` at start and at every sync (each replica, every `check_interval`):
- the serving certificate is renewed (a new key, the same CA) once less than `rotate_before` of it is left,
  or when it does not name every host it must (the Service's DNS names, extra hosts);
- the CA is renewed once less than `rotate_before` of it is left; the old CA stays in the bundle (the
  Secret's `ca-previous.crt`) until it expires, so a replica still serving a certificate of the old CA is
  trusted while the others move over;
- the caBundle is set whenever it differs from the CAs in force (also after `helm upgrade` reset it).
Two replicas that renew at once both write with the Secret's resourceVersion: one wins, the other reads
the winner's certificates. A replica reloads the Secret at every sync, so all serve the same certificate
within one interval.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from faultline.errors import ConflictError
from faultline.kube import preflight as ops
from faultline.kube.lite import Client

log = logging.getLogger(__name__)

CA_CERT, CA_KEY, CA_PREVIOUS = "ca.crt", "ca.key", "ca-previous.crt"
TLS_CERT, TLS_KEY = "tls.crt", "tls.key"
BACKDATE = dt.timedelta(minutes=5)  # clocks differ a little between the webhook and the API server


@dataclass(frozen=True)
class Validity:
    ca: dt.timedelta = dt.timedelta(days=3650)
    serving: dt.timedelta = dt.timedelta(days=365)
    rotate_before: dt.timedelta = dt.timedelta(days=30)


@dataclass(frozen=True)
class Bundle:
    """PEM bytes as the Secret holds them."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes
    ca_previous: bytes = b""

    @classmethod
    def from_secret(cls, data: dict[str, bytes]) -> Bundle | None:
        """None when the Secret does not hold a complete, readable bundle (a new or emptied Secret)."""
        try:
            bundle = cls(
                data[CA_CERT], data[CA_KEY], data[TLS_CERT], data[TLS_KEY], data.get(CA_PREVIOUS, b"")
            )
            x509.load_pem_x509_certificate(bundle.ca_cert)
            x509.load_pem_x509_certificate(bundle.cert)
        except (KeyError, ValueError):
            return None
        return bundle

    def to_secret(self) -> dict[str, bytes]:
        data = {CA_CERT: self.ca_cert, CA_KEY: self.ca_key, TLS_CERT: self.cert, TLS_KEY: self.key}
        if self.ca_previous:
            data[CA_PREVIOUS] = self.ca_previous
        return data

    def trusted(self, now: dt.datetime) -> bytes:
        """The caBundle: the CA in force, and the previous one while it is still valid."""
        out = self.ca_cert
        if self.ca_previous and _not_after(self.ca_previous) > now:
            out += self.ca_previous
        return out


def _not_after(pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc


def _names(pem: bytes) -> set[str]:
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in san.get_values_for_type(x509.DNSName)} | {
        str(n) for n in san.get_values_for_type(x509.IPAddress)
    }


def service_hosts(service: str, namespace: str, extra: Sequence[str] = ()) -> list[str]:
    """The names the API server may use for the webhook's Service, and any extra hosts (e.g. 127.0.0.1)."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        *extra,
    ]


def plan(
    current: Bundle | None,
    now: dt.datetime,
    hosts: Sequence[str],
    validity: Validity,
    *,
    new_key: Callable[[], ec.EllipticCurvePrivateKey] | None = None,
) -> Bundle | None:
    """The bundle to write now, or None when `current` serves on (see the module doc)."""
    keygen = new_key or (lambda: ec.generate_private_key(ec.SECP256R1()))
    if current is None:
        ca_cert, ca_key = _ca(keygen(), now, validity.ca)
        cert, key = _serving(ca_cert, ca_key, keygen(), now, validity.serving, hosts)
        return Bundle(ca_cert, ca_key, cert, key)
    ca_cert, ca_key, previous = current.ca_cert, current.ca_key, current.ca_previous
    renew_ca = _not_after(ca_cert) - now <= validity.rotate_before
    if renew_ca:
        previous = ca_cert
        ca_cert, ca_key = _ca(keygen(), now, validity.ca)
    elif previous and _not_after(previous) <= now:
        previous = b""  # expired: out of the bundle
    cert_left = _not_after(current.cert) - now
    stale = renew_ca or cert_left <= validity.rotate_before or not set(hosts) <= _names(current.cert)
    if not stale and previous == current.ca_previous:
        return None
    if stale:
        cert, key = _serving(
            ca_cert, ca_key, keygen(), now, min(validity.serving, _not_after(ca_cert) - now), hosts
        )
    else:
        cert, key = current.cert, current.key
    return Bundle(ca_cert, ca_key, cert, key, previous)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _ca(key: ec.EllipticCurvePrivateKey, now: dt.datetime, valid: dt.timedelta) -> tuple[bytes, bytes]:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"faultline-webhook-ca-{now:%Y%m%d%H%M%S}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + valid)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _serving(
    ca_pem: bytes,
    ca_key_pem: bytes,
    key: ec.EllipticCurvePrivateKey,
    now: dt.datetime,
    valid: dt.timedelta,
    hosts: Sequence[str],
) -> tuple[bytes, bytes]:
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the webhook CA's key is not an EC key")
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + valid)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


class Keeper:
    """Keeps the Secret's bundle current and the webhook configuration's caBundle in step with it (see the
    module doc); `sync` is called at start and every check interval by each replica."""

    def __init__(
        self,
        client: Client,
        *,
        namespace: str,
        secret: str,
        webhook_config: str | None,
        hosts: Sequence[str],
        validity: Validity,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.secret = secret
        self.webhook_config = webhook_config
        self.hosts = list(hosts)
        self.validity = validity
        self.clock = clock

    def sync(self) -> Bundle:
        bundle = self._bundle()
        if self.webhook_config:
            self._trust(bundle.trusted(self.clock()))
        return bundle

    def _bundle(self) -> Bundle:
        for _ in range(5):
            found = ops.read_secret(self.client, self.namespace, self.secret)
            current = Bundle.from_secret(found.data) if found is not None else None
            new = plan(current, self.clock(), self.hosts, self.validity)
            if new is None:
                assert current is not None  # plan returns a bundle when there is none
                return current
            try:
                ops.write_secret(
                    self.client,
                    self.namespace,
                    self.secret,
                    new.to_secret(),
                    found=found,  # the chart's Secret stays Helm's (its labels and annotations kept)
                    labels={"app.kubernetes.io/managed-by": "faultline"},  # one it makes itself
                )
            except ConflictError:  # another replica wrote first (AlreadyExistsError is one): take theirs
                continue
            log.info(
                "webhook certificates written",
                extra={
                    "secret": f"{self.namespace}/{self.secret}",
                    "not_after": _not_after(new.cert).isoformat(),
                    "outcome": "new" if current is None else "rotated",
                },
            )
            return new
        raise ConflictError("write", f"Secret {self.namespace}/{self.secret}", "still changing after 5 tries")

    def _trust(self, trusted: bytes) -> None:
        assert self.webhook_config is not None
        bundles, version = ops.webhook_ca_bundles(self.client, self.webhook_config)
        if all(b == trusted for b in bundles):
            return
        try:
            ops.set_webhook_ca_bundle(
                self.client, self.webhook_config, trusted, count=len(bundles), resource_version=version
            )
        except ConflictError:
            return  # changed meanwhile (an upgrade, another replica): the next sync looks again
        log.info(
            "webhook CA bundle set", extra={"webhook_config": self.webhook_config, "webhooks": len(bundles)}
        )
