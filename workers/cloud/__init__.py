"""Cloud provider interface for the janitor: reboot or replace the instance behind a Node.

A Node names its instance in `spec.providerID`; `instance()` reads it. Each provider module (`aws`, `gcp`,
`azure`, `oci`) implements `Provider` with plain HTTPS calls to the provider's documented REST API and its
own authentication, so nothing here needs the providers' SDKs (boto3's botocore and the OCI SDK pin
python-dateutil below 3, which the Kubernetes client 37 refuses; see the module docstrings).

    reboot(instance)   the provider's restart of the instance (the node keeps its name and disks)
    replace(instance)  new hardware for the node: what "replace" means differs per provider, so each
                       module says; the janitor then waits for the Node to come back or go away

Both return a short message for the repair record once the provider has accepted the request (and, for
providers that report operations, once the operation finished). Errors: `CloudError` (refused: bad
credentials, unknown instance; permanent) and `TransientError` (throttled, 5xx, unreachable).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import requests
import urllib3

from faultline.errors import PermanentError, TransientError

TIMEOUT_S = 30.0  # one HTTP call
ANSWER_TEXT = 400  # characters of a provider's refusing answer kept in the error (its JSON error, not a page)
ANSWER_MAX = 1 << 20  # bytes of a provider's answer read at most (tokens, instances, operations: a few KiB)
PROVIDERS = ("aws", "gcp", "azure", "oci")


class CloudError(PermanentError):
    """The provider refused the call (status and its own error text in the message)."""


@dataclass(frozen=True)
class Instance:
    """The instance behind a Node, as its providerID names it."""

    provider: str  # aws | gcp | azure | oci
    id: str  # aws: instance id; gcp: instance name; azure: ARM resource id; oci: instance OCID
    zone: str = ""  # aws availability zone, gcp zone
    project: str = ""  # gcp project
    provider_id: str = ""


_AWS = re.compile(r"^aws://(?:/(?P<zone>[a-z0-9-]+))?/(?P<id>i-[0-9a-f]+)$")
_GCE = re.compile(r"^gce://(?P<project>[^/]+)/(?P<zone>[^/]+)/(?P<name>[^/]+)$")
_AZURE = re.compile(
    r"^azure://(?P<id>/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/"
    r"(?:virtualMachines/[^/]+|virtualMachineScaleSets/[^/]+/virtualMachines/[^/]+))$",
    re.IGNORECASE,
)
_OCI = re.compile(r"^oci://(?P<id>ocid1\.instance\.[a-z0-9._-]+)$")


def instance(provider_id: str) -> Instance:
    """Parse a Node's spec.providerID; ValueError names what is wrong with it."""
    pid = provider_id.strip()
    if m := _AWS.match(pid):
        return Instance("aws", m["id"], zone=m["zone"] or "", provider_id=pid)
    if m := _GCE.match(pid):
        return Instance("gcp", m["name"], zone=m["zone"], project=m["project"], provider_id=pid)
    if m := _AZURE.match(pid):
        return Instance("azure", m["id"], provider_id=pid)
    if m := _OCI.match(pid):
        return Instance("oci", m["id"], provider_id=pid)
    if not pid:
        raise ValueError("the Node has no spec.providerID (bare metal?)")
    raise ValueError(f"providerID {pid!r} is not an AWS, GCE, Azure or OCI instance this janitor can repair")


class Provider(Protocol):
    name: str

    def reboot(self, inst: Instance) -> str: ...

    def replace(self, inst: Instance) -> str: ...


def call(
    session: requests.Session, method: str, url: str, *, what: str, ok: tuple[int, ...] = (200,), **kw: Any
) -> requests.Response:
    """One HTTP call, its failures sorted by what to do next: TransientError (unreachable, 429, 5xx)
    or CloudError (any other status outside `ok`, or an answer over ANSWER_MAX bytes: none of the calls
    made has a reason to be so large), naming `what` and the provider's answer."""
    try:
        response = session.request(method, url, timeout=TIMEOUT_S, stream=True, **kw)
        with response:
            body = response.raw.read(ANSWER_MAX + 1, decode_content=True)
    except requests.RequestException as exc:
        raise TransientError(f"{what}: {exc}", delay=5.0) from exc
    except (OSError, urllib3.exceptions.HTTPError) as exc:  # the connection broke while the answer was read
        raise TransientError(f"{what}: {exc}", delay=5.0) from exc
    if len(body) > ANSWER_MAX:
        raise CloudError(f"{what}: HTTP {response.status_code}: an answer larger than {ANSWER_MAX} bytes")
    response._content = body  # what .json() and .text read: the bounded body
    if response.status_code in ok:
        return response
    text = response.text.strip().replace("\n", " ")[:ANSWER_TEXT]
    if response.status_code == 429 or response.status_code >= 500:
        raise TransientError(f"{what}: HTTP {response.status_code}: {text}", delay=5.0)
    raise CloudError(f"{what}: HTTP {response.status_code}: {text}")


def wait_until(
    check: Callable[[], str | None], *, what: str, timeout: float, interval: float,
    sleep: Callable[[float], None] = time.sleep,
) -> str:  # fmt: skip
    """Call `check` until it returns a message (done); TransientError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        done = check()
        if done is not None:
            return done
        if time.monotonic() >= deadline:
            raise TransientError(f"{what}: not finished after {timeout:.0f} s", delay=interval)
        sleep(interval)


class TokenCache:
    """A bearer token kept until a minute before it expires."""

    def __init__(self, fetch: Callable[[], tuple[str, float]]) -> None:
        self.fetch = fetch  # -> (token, seconds it is valid)
        self.token = ""
        self.until = 0.0

    def get(self) -> str:
        if not self.token or time.monotonic() >= self.until:
            token, valid = self.fetch()
            self.token, self.until = token, time.monotonic() + max(0.0, valid - 60.0)
        return self.token
