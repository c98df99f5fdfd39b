"""The webhook's certificates, pure (`plan`) and served: a first bundle, a bundle that serves on, the
serving certificate renewed before it expires (same CA), the CA renewed with the old one trusted until it
expires, new hosts, a Secret that holds garbage; and a TLS client that trusts the bundle reaching the
webhook server. Writing the Secret and the caBundle on the real API server is
tests/integration/test_preflight_webhook.py."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import ssl
import threading
from pathlib import Path
from typing import Any

from cryptography import x509

from workers import preflight_inject, webhook, webhook_certs
from workers.webhook_certs import Bundle, Validity, plan

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
HOSTS = webhook_certs.service_hosts("fl-webhook", "faultline", ["127.0.0.1"])
V = Validity(ca=dt.timedelta(days=100), serving=dt.timedelta(days=30), rotate_before=dt.timedelta(days=10))


# a Pod asking for a GPU, as the API server asks the webhook about it
ADMISSION_REVIEW: dict[str, Any] = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "u",
        "kind": {"group": "", "kind": "Pod"},
        "operation": "CREATE",
        "namespace": "n",
        "object": {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
    },
}


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def first() -> Bundle:
    bundle = plan(None, NOW, HOSTS, V)
    assert bundle is not None
    return bundle


def test_a_first_bundle_names_the_service_and_is_signed_by_its_ca() -> None:
    b = first()
    serving, ca = cert(b.cert), cert(b.ca_cert)
    serving.verify_directly_issued_by(ca)
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {
        "fl-webhook",
        "fl-webhook.faultline",
        "fl-webhook.faultline.svc",
        "fl-webhook.faultline.svc.cluster.local",
    }
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert serving.not_valid_after_utc == NOW + V.serving
    assert b.trusted(NOW) == b.ca_cert
    assert Bundle.from_secret(b.to_secret()) == b


def test_a_current_bundle_serves_on() -> None:
    b = first()
    assert plan(b, NOW + dt.timedelta(days=19), HOSTS, V) is None


def test_the_serving_certificate_is_renewed_before_it_expires() -> None:
    b = first()
    later = NOW + dt.timedelta(days=20, seconds=1)  # less than 10 days left of 30
    renewed = plan(b, later, HOSTS, V)
    assert renewed is not None
    assert renewed.ca_cert == b.ca_cert and renewed.cert != b.cert and renewed.key != b.key
    assert cert(renewed.cert).not_valid_after_utc == later + V.serving
    assert plan(renewed, later, HOSTS, V) is None


def test_the_ca_is_renewed_and_the_old_one_trusted_until_it_expires() -> None:
    b = first()
    later = NOW + dt.timedelta(days=91)  # 9 days left of the CA's 100
    renewed = plan(b, later, HOSTS, V)
    assert renewed is not None and renewed.ca_cert != b.ca_cert
    cert(renewed.cert).verify_directly_issued_by(cert(renewed.ca_cert))
    assert renewed.ca_previous == b.ca_cert
    assert renewed.trusted(later) == renewed.ca_cert + b.ca_cert  # both while the old one is valid
    gone = NOW + dt.timedelta(days=100, seconds=1)
    assert renewed.trusted(gone) == renewed.ca_cert
    dropped = plan(renewed, gone, HOSTS, V)
    assert dropped is not None and dropped.ca_previous == b"" and dropped.cert == renewed.cert


def test_new_hosts_and_a_broken_secret() -> None:
    b = first()
    wider = plan(b, NOW, [*HOSTS, "webhook.example"], V)
    assert wider is not None and wider.ca_cert == b.ca_cert
    assert Bundle.from_secret({}) is None
    assert Bundle.from_secret({**b.to_secret(), "tls.crt": b"garbage"}) is None


def test_a_client_trusting_the_bundle_gets_an_answer(tmp_path: Path) -> None:
    b = plan(None, dt.datetime.now(dt.UTC), HOSTS, V)
    assert b is not None
    settings = preflight_inject.InjectSettings(image="img")
    server = webhook.WebhookServer(
        ("127.0.0.1", 0),
        settings,
        lambda ns: {"faultline.io/preflight": "enabled"},
        webhook.context_from_pem(b.cert, b.key),
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        (tmp_path / "ca.crt").write_bytes(b.trusted(dt.datetime.now(dt.UTC)))
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        conn = http.client.HTTPSConnection("127.0.0.1", server.server_address[1], context=context, timeout=10)
        body = ADMISSION_REVIEW
        conn.request("POST", "/mutate", json.dumps(body), {"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
        assert answer["response"]["allowed"] is True and answer["response"]["patchType"] == "JSONPatch"
        for bad, message in (
            (b"{", "body: not JSON"),
            (b"[]", "body: not an AdmissionReview"),
            (
                json.dumps({**body, "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
                "apiVersion 'admission.k8s.io/v1beta1': only admission.k8s.io/v1 is served",
            ),
        ):
            conn.request("POST", "/mutate", bad, {"Content-Type": "application/json"})
            response = conn.getresponse()
            assert (response.status, response.read().decode()[: len(message)]) == (400, message)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok"
        conn.close()
        stranger = ssl.create_default_context()  # trusts the system's CAs only: refused
        try:
            http.client.HTTPSConnection(
                "127.0.0.1", server.server_address[1], context=stranger, timeout=10
            ).request("GET", "/healthz")
        except ssl.SSLCertVerificationError:
            pass
        else:
            raise AssertionError("a client that does not trust the webhook's CA got through")
    finally:
        server.shutdown()
        server.server_close()
