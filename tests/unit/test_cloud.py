"""The janitor's cloud providers against local fakes of their HTTP APIs (tests/fakes/cloud.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from faultline.errors import ConfigError, TransientError
from tests.fakes import cloud as fakes
from workers import cloud
from workers.cloud import aws, azure, gcp, oci

AZ_VM = "/subscriptions/0000-1111/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachines/gpu-7"
AZ_VMSS = (
    "/subscriptions/0000-1111/resourceGroups/mc_rg/providers/Microsoft.Compute/"
    "virtualMachineScaleSets/aks-gpu-123-vmss/virtualMachines/3"
)
OCI_ID = "ocid1.instance.oc1.iad.anuwcljrexample"


@pytest.mark.parametrize(
    ("provider_id", "want"),
    [
        ("aws:///us-east-1a/i-0abc123def4567890", ("aws", "i-0abc123def4567890", "us-east-1a", "")),
        ("aws:///i-0abc123def4567890", ("aws", "i-0abc123def4567890", "", "")),
        (
            "gce://my-proj/us-central1-b/gke-pool-1-abcd",
            ("gcp", "gke-pool-1-abcd", "us-central1-b", "my-proj"),
        ),
        (f"azure://{AZ_VM}", ("azure", AZ_VM, "", "")),
        (f"azure://{AZ_VMSS}", ("azure", AZ_VMSS, "", "")),
        (f"oci://{OCI_ID}", ("oci", OCI_ID, "", "")),
    ],
)
def test_provider_ids(provider_id: str, want: tuple[str, str, str, str]) -> None:
    inst = cloud.instance(provider_id)
    assert (inst.provider, inst.id, inst.zone, inst.project) == want


@pytest.mark.parametrize(
    ("provider_id", "error"),
    [
        ("", "no spec.providerID"),
        ("kind://docker/kind/node", "not an AWS"),
        ("aws:///us-east-1a/vol-1", "not an AWS"),
    ],
)
def test_provider_ids_that_cannot_be_repaired(provider_id: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        cloud.instance(provider_id)


def test_sigv4_matches_the_published_example() -> None:
    """AWS's Signature V4 test suite, case get-vanilla."""
    creds = aws.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    got = aws.sign("GET", "https://example.amazonaws.com/", {}, b"", creds, "us-east-1", "service",
                   dt.datetime(2015, 8, 30, 12, 36, tzinfo=dt.UTC))  # fmt: skip
    assert got["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
    )


@pytest.fixture
def fake() -> Any:
    with fakes.FakeCloud() as f:
        yield f


def _aws(fake: fakes.FakeCloud, env: dict[str, str]) -> aws.AWS:
    return aws.AWS(
        aws.Settings(endpoint=f"{fake.url}/aws/ec2/", sts_endpoint=f"{fake.url}/aws/sts/", env=env)
    )


STATIC = {"AWS_ACCESS_KEY_ID": fakes.AWS_KEY, "AWS_SECRET_ACCESS_KEY": fakes.AWS_SECRET}


def test_aws_reboot_and_replace_with_static_keys(fake: fakes.FakeCloud) -> None:
    rebooted: list[str] = []
    fake.on_reboot = rebooted.append
    provider = _aws(fake, STATIC)
    inst = cloud.instance("aws:///eu-west-1c/i-0abc123def4567890")
    assert "accepted" in provider.reboot(inst)
    assert "shutting-down" in provider.replace(inst)
    assert fake.actions("aws") == [("RebootInstances", inst.id), ("TerminateInstances", inst.id)]
    assert rebooted == [inst.id]


def test_aws_pod_identity_and_irsa(fake: fakes.FakeCloud, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(fakes.POD_IDENTITY_TOKEN + "\n")
    inst = cloud.instance("aws:///us-east-2a/i-0abc123def4567890")
    pod = _aws(fake, {"AWS_CONTAINER_CREDENTIALS_FULL_URI": f"{fake.url}/pod-identity",
                      "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token_file)})  # fmt: skip
    pod.reboot(inst)
    pod.reboot(inst)  # the temporary credentials are reused until they near expiry
    (tmp_path / "web").write_text(fakes.WEB_IDENTITY_TOKEN)
    irsa = _aws(
        fake,
        {"AWS_ROLE_ARN": "arn:aws:iam::1:role/janitor", "AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "web")},
    )
    irsa.replace(inst)
    assert len(fake.actions("aws")) == 3
    assert len([t for t in fake.sessions if t.startswith("aws-session")]) == 2  # one per provider


def test_aws_errors(fake: fakes.FakeCloud, tmp_path: Path) -> None:
    inst = cloud.instance("aws:///us-east-1a/i-0abc123def4567890")
    bad = _aws(fake, {**STATIC, "AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    with pytest.raises(cloud.CloudError, match="SignatureDoesNotMatch"):
        bad.reboot(inst)
    good = _aws(fake, STATIC)
    with pytest.raises(
        cloud.CloudError, match=r"InvalidInstanceID.NotFound: The instance ID 'i-00000000000000404'"
    ):
        good.reboot(cloud.instance("aws:///us-east-1a/i-00000000000000404"))
    fake.fail["aws"] = [
        (
            503,
            "<Response><Errors><Error><Code>Unavailable</Code><Message>x</Message></Error></Errors></Response>",
        )
    ]
    with pytest.raises(TransientError, match="HTTP 503"):
        good.reboot(inst)
    with pytest.raises(ConfigError, match="no credentials"):
        _aws(fake, {}).reboot(inst)
    with pytest.raises(ConfigError, match="no region"):
        _aws(fake, STATIC).reboot(cloud.instance("aws:///i-0abc123def4567890"))
    assert fake.actions("aws") == []  # nothing was done by a refused call
    (tmp_path / "web").write_text("wrong")
    irsa = _aws(
        fake, {"AWS_ROLE_ARN": "arn:aws:iam::1:role/j", "AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "web")}
    )
    with pytest.raises(cloud.CloudError, match="AccessDenied"):
        irsa.reboot(inst)


def _gcp(fake: fakes.FakeCloud) -> gcp.GCP:
    host = fake.url.removeprefix("http://")
    return gcp.GCP(
        gcp.Settings(endpoint=f"{fake.url}/compute/v1", poll=0.01, env={"GCE_METADATA_HOST": host})
    )


def test_gcp_reset_recreate_and_delete(fake: fakes.FakeCloud) -> None:
    provider = _gcp(fake)
    in_group = cloud.instance("gce://proj/us-central1-b/gke-gpu-pool-1-abcd")
    alone = cloud.instance("gce://proj/us-central1-b/lonely-vm")
    fake.gce_groups[in_group.id] = (
        "projects/1234/zones/us-central1-b/instanceGroupManagers/gke-gpu-pool-1-grp"
    )
    assert "done" in provider.reboot(in_group)  # waited for the zone operation (RUNNING twice, then DONE)
    provider.replace(in_group)
    provider.replace(alone)
    assert fake.actions("gcp") == [
        ("reset", in_group.id), ("recreate:gke-gpu-pool-1-grp", in_group.id), ("delete", alone.id),
    ]  # fmt: skip
    assert len(fake.tokens) == 1  # one metadata token for every call
    with pytest.raises(cloud.CloudError, match=r"HTTP 404.*was not found"):
        provider.reboot(cloud.instance("gce://proj/us-central1-b/missing"))


def test_gcp_without_metadata_server_is_transient() -> None:
    provider = gcp.GCP(gcp.Settings(env={"GCE_METADATA_HOST": "127.0.0.1:9"}))
    with pytest.raises(TransientError, match="metadata server"):
        provider.reboot(cloud.instance("gce://p/z/n"))


def _azure(fake: fakes.FakeCloud, env: dict[str, str]) -> azure.Azure:
    return azure.Azure(
        azure.Settings(endpoint=fake.url, authority=fake.url, imds=fake.url, poll=0.01, env=env)
    )


def test_azure_restart_and_redeploy(fake: fakes.FakeCloud, tmp_path: Path) -> None:
    msi = _azure(fake, {})
    assert "Succeeded" in msi.reboot(cloud.instance(f"azure://{AZ_VMSS}"))
    (tmp_path / "token").write_text(fakes.WEB_IDENTITY_TOKEN)
    workload = _azure(fake, {"AZURE_FEDERATED_TOKEN_FILE": str(tmp_path / "token"), "AZURE_CLIENT_ID": "c",
                             "AZURE_TENANT_ID": "t"})  # fmt: skip
    assert "Succeeded" in workload.replace(cloud.instance(f"azure://{AZ_VM}"))
    assert fake.actions("azure") == [("restart", AZ_VMSS), ("redeploy", AZ_VM)]
    assert {t.split("-")[1] for t in fake.tokens} == {"msi", "wi"}
    fake.fail["azure"] = [(409, '{"error":{"code":"OperationNotAllowed","message":"VM is deallocated"}}')]
    with pytest.raises(cloud.CloudError, match="OperationNotAllowed"):
        msi.reboot(cloud.instance(f"azure://{AZ_VM}"))


@pytest.fixture(scope="module")
def oci_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def test_oci_reset_and_terminate_signed(oci_key: rsa.RSAPrivateKey, tmp_path: Path) -> None:
    config = fakes.oci_config(tmp_path, oci_key, passphrase="s3cret")
    inst = cloud.instance(f"oci://{OCI_ID}")
    with fakes.FakeCloud(oci_public_key=oci_key.public_key()) as fake:
        provider = oci.OCI(oci.Settings(config_file=config, endpoint=fake.url))
        assert "STOPPING" in provider.reboot(inst)
        provider.replace(inst)
        assert fake.actions("oci") == [("RESET", OCI_ID), ("TERMINATE", OCI_ID)]
        (tmp_path / "other").mkdir()
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        impostor = oci.OCI(
            oci.Settings(config_file=fakes.oci_config(tmp_path / "other", other), endpoint=fake.url)
        )
        with pytest.raises(cloud.CloudError, match=r"NotAuthenticated.*does not verify"):
            impostor.reboot(inst)
        assert len(fake.actions("oci")) == 2


def test_oci_config_errors_name_the_file_and_field(oci_key: rsa.RSAPrivateKey, tmp_path: Path) -> None:
    config = fakes.oci_config(tmp_path, oci_key)
    with pytest.raises(ConfigError, match=r"no profile \[PROD\]"):
        oci.OCI(oci.Settings(config_file=config, profile="PROD"))
    config.write_text(config.read_text().replace("fingerprint=", "#fingerprint="))
    with pytest.raises(ConfigError, match=r"config \[DEFAULT\]: missing fingerprint"):
        oci.OCI(oci.Settings(config_file=config))
    with pytest.raises(ConfigError, match="cannot be read"):
        oci.OCI(oci.Settings(config_file=tmp_path / "absent"))


@pytest.mark.redteam
def test_an_oversized_answer_is_refused_unread(tmp_path: Path) -> None:
    """A metadata service or endpoint that answers without end (a token of 2 MiB) is read up to ANSWER_MAX
    bytes and refused naming the call; an answer within the bound is read whole."""
    import http.server  # noqa: PLC0415
    import threading  # noqa: PLC0415

    import requests  # noqa: PLC0415

    sizes = {"/big": cloud.ANSWER_MAX * 2, "/small": 1000}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            size = sizes[self.path]
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.wfile.write(b"x" * size)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(
            cloud.CloudError, match=r"Azure managed identity token \(IMDS\): HTTP 200: an answer larger"
        ):
            cloud.call(requests.Session(), "GET", f"{url}/big", what="Azure managed identity token (IMDS)")
        assert len(cloud.call(requests.Session(), "GET", f"{url}/small", what="small").content) == 1000
    finally:
        server.shutdown()
        server.server_close()
