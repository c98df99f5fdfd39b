"""Oracle Cloud Infrastructure: the Core Services API (20160918), with API key request signatures.

    reboot   InstanceAction RESET (a power cycle: GPU hangs often ignore the soft ACPI shutdown)
    replace  TerminateInstance (boot volume not kept): the node's instance pool (an OKE node pool)
             launches a replacement; the old Node is deleted by the cloud controller
    instance GetInstance, for the maintenance monitor (`timeMaintenanceRebootDue`)

Credentials: an API key in the usual config file (`user`, `fingerprint`, `tenancy`, `region`, `key_file`,
optional `pass_phrase`; profile DEFAULT unless set), mounted from a Secret. Every request is signed as OCI
documents it: RSA-SHA256 over `date (request-target) host`, plus `x-content-sha256 content-type
content-length` for bodies. The policy needs `manage instance-family` in the nodes' compartment (the
maintenance monitor: `read instances`).

Why no OCI SDK: it requires python-dateutil < 3 and the Kubernetes client 37 requires >= 3.
"""

from __future__ import annotations

import base64
import configparser
import email.utils
import hashlib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from faultline.errors import ConfigError
from workers import cloud

API_VERSION = "20160918"


@dataclass(frozen=True)
class Settings:
    config_file: Path = Path("~/.oci/config")
    profile: str = "DEFAULT"
    endpoint: str = ""  # "": https://iaas.<region>.oraclecloud.com


@dataclass(frozen=True)
class ApiKey:
    key_id: str  # tenancy/user/fingerprint
    region: str
    private_key: rsa.RSAPrivateKey


def load_key(settings: Settings) -> ApiKey:
    """The API key of the profile; ConfigError names the file, profile and what is missing."""
    path = settings.config_file.expanduser()
    parser = configparser.ConfigParser()
    if not parser.read(path):
        raise ConfigError(f"OCI config {path}: cannot be read")
    if settings.profile != "DEFAULT" and not parser.has_section(settings.profile):
        raise ConfigError(f"OCI config {path}: no profile [{settings.profile}]")
    section: Mapping[str, str] = parser[settings.profile]
    missing = [k for k in ("user", "fingerprint", "tenancy", "region", "key_file") if not section.get(k)]
    if missing:
        raise ConfigError(f"OCI config {path} [{settings.profile}]: missing {', '.join(missing)}")
    key_path = Path(section["key_file"]).expanduser()
    if not key_path.is_absolute():
        key_path = path.parent / key_path
    passphrase = section.get("pass_phrase")
    try:
        key = serialization.load_pem_private_key(
            key_path.read_bytes(), passphrase.encode() if passphrase else None
        )
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"OCI config {path} [{settings.profile}]: key_file {key_path}: {exc}") from exc
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ConfigError(f"OCI config {path} [{settings.profile}]: key_file {key_path} is not an RSA key")
    return ApiKey(f"{section['tenancy']}/{section['user']}/{section['fingerprint']}", section["region"], key)


def sign(method: str, url: str, body: bytes, key: ApiKey, date: str) -> dict[str, str]:
    """The headers of a signed request (date, host, body headers when there is one, authorization)."""
    parts = urllib.parse.urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = {"date": date, "(request-target)": f"{method.lower()} {target}", "host": parts.netloc}
    names = ["date", "(request-target)", "host"]
    if method.upper() in ("POST", "PUT", "PATCH"):
        headers |= {
            "x-content-sha256": base64.b64encode(hashlib.sha256(body).digest()).decode(),
            "content-type": "application/json",
            "content-length": str(len(body)),
        }
        names += ["x-content-sha256", "content-type", "content-length"]
    signing = "\n".join(f"{n}: {headers[n]}" for n in names)
    signature = key.private_key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
    headers["authorization"] = (
        f'Signature version="1",keyId="{key.key_id}",algorithm="rsa-sha256",'
        f'headers="{" ".join(names)}",signature="{base64.b64encode(signature).decode()}"'
    )
    del headers["(request-target)"]
    return headers


class OCI:
    name = "oci"

    def __init__(self, settings: Settings, *, session: requests.Session | None = None) -> None:
        self.settings = settings
        self.session = session or requests.Session()
        self.key = load_key(settings)

    def _call(self, method: str, path: str, what: str, ok: tuple[int, ...]) -> requests.Response:
        base = self.settings.endpoint or f"https://iaas.{self.key.region}.oraclecloud.com"
        url = f"{base.rstrip('/')}/{API_VERSION}{path}"
        body = b""
        headers = sign(method, url, body, self.key, email.utils.formatdate(usegmt=True))
        return cloud.call(self.session, method, url, what=what, ok=ok, headers=headers, data=body)

    def reboot(self, inst: cloud.Instance) -> str:
        what = f"OCI InstanceAction RESET {inst.id}"
        r = self._call("POST", f"/instances/{inst.id}?action=RESET", what, (200,))
        return f"{what}: {r.json().get('lifecycleState', 'accepted')}"

    def replace(self, inst: cloud.Instance) -> str:
        what = f"OCI TerminateInstance {inst.id}"
        self._call("DELETE", f"/instances/{inst.id}?preserveBootVolume=false", what, (200, 204))
        return f"{what}: terminating; its instance pool launches a replacement"

    def instance(self, inst: cloud.Instance) -> dict[str, Any]:
        """The instance as GetInstance answers it. OCI answers 404 NotAuthorizedOrNotFound both for an
        instance that is gone and for one the policy does not let it read: a CloudError either way."""
        r = self._call("GET", f"/instances/{inst.id}", f"OCI GetInstance {inst.id}", (200,))
        body: dict[str, Any] = r.json()
        return body
