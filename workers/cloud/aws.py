"""AWS: the EC2 Query API (version 2016-11-15), signed with Signature Version 4.

    reboot   RebootInstances (EC2 hard-reboots the instance if the OS does not restart within 4 minutes)
    replace  TerminateInstances: the node's Auto Scaling group (EKS managed or self-managed node group)
             launches a new instance on other hardware; the old Node is deleted by the cloud controller
    instance_events  DescribeInstanceStatus: the scheduled events of many instances at once, for the
             maintenance monitor (`workers.announcements.from_ec2`)

Credentials, in this order: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN); EKS Pod
Identity (AWS_CONTAINER_CREDENTIALS_FULL_URI with AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or _TOKEN); IRSA
(AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE, exchanged at STS by AssumeRoleWithWebIdentity).
Temporary credentials are refreshed five minutes before they expire. The IAM policy needs
ec2:RebootInstances and ec2:TerminateInstances (scope them with a tag condition on the cluster's nodes);
the maintenance monitor, ec2:DescribeInstanceStatus only.

Why no boto3: botocore requires python-dateutil < 3 and the Kubernetes client 37 requires >= 3.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import re
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import requests

from faultline import bounds
from faultline.errors import ConfigError, TransientError
from workers import cloud

EC2_VERSION = "2016-11-15"
STS_VERSION = "2011-06-15"
DESCRIBE_BATCH = 100  # instance ids per DescribeInstanceStatus call
THROTTLED_WITHIN = 500  # characters at an error answer's start searched for RequestLimitExceeded (its <Code>)


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None = None
    expires: float | None = None  # time.time() when they stop working; None: long-lived


@dataclass(frozen=True)
class Settings:
    region: str = ""  # "": from the node's availability zone
    endpoint: str = ""  # "": https://ec2.<region>.amazonaws.com (AWS_ENDPOINT_URL_EC2 also applies)
    sts_endpoint: str = ""  # "": https://sts.<region>.amazonaws.com (AWS_ENDPOINT_URL_STS also applies)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def _quote(s: str) -> str:
    return urllib.parse.quote(s, safe="-_.~")


def sign(
    method: str, url: str, headers: Mapping[str, str], body: bytes, creds: Credentials, region: str,
    service: str, now: dt.datetime,
) -> dict[str, str]:  # fmt: skip
    """Signature Version 4: the headers to add (X-Amz-Date, X-Amz-Security-Token, Authorization).
    Every header given, plus host, is signed."""
    parts = urllib.parse.urlsplit(url)
    amz_date = now.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    added = {"X-Amz-Date": amz_date}
    if creds.token:
        added["X-Amz-Security-Token"] = creds.token
    all_headers = {"host": parts.netloc, **{k.lower(): v for k, v in {**headers, **added}.items()}}
    names = sorted(all_headers)
    canonical_headers = "".join(f"{n}:{' '.join(all_headers[n].split())}\n" for n in names)
    signed = ";".join(names)
    query = sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in query)
    path = "/".join(_quote(urllib.parse.unquote(seg)) for seg in (parts.path or "/").split("/"))
    request = "\n".join(
        [method.upper(), path, canonical_query, canonical_headers, signed, hashlib.sha256(body).hexdigest()]
    )
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(request.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{creds.secret_key}".encode(), amz_date[:8]), region), service),
                "aws4_request")  # fmt: skip
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    added["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return added


def _xml(text: str, what: str) -> ET.Element:
    try:
        root = ET.fromstring(text)  # noqa: S314 - AWS's own response
    except ET.ParseError as exc:
        raise cloud.CloudError(
            f"{what}: the answer is not XML: {bounds.quote(text, bounds.EXCERPT)}"
        ) from exc
    for el in root.iter():  # drop namespaces: {http://ec2.amazonaws.com/doc/2016-11-15/}requestId
        el.tag = el.tag.rsplit("}", 1)[-1]
    return root


def _error(text: str) -> str:
    try:
        root = _xml(text, "error")
    except cloud.CloudError:
        return bounds.clip(text, bounds.ERROR_TEXT)
    errors = [f"{e.findtext('Code')}: {e.findtext('Message')}" for e in root.iter("Error")]
    return "; ".join(errors) or bounds.clip(text, bounds.ERROR_TEXT)


class AWS:
    name = "aws"

    def __init__(self, settings: Settings, *, session: requests.Session | None = None) -> None:
        self.settings = settings
        self.session = session or requests.Session()
        self._creds: Credentials | None = None

    # -- credentials -----------------------------------------------------------------------------------
    def credentials(self, region: str) -> Credentials:
        c = self._creds
        if c is None or (c.expires is not None and time.time() > c.expires - 300):
            c = self._creds = self._fetch_credentials(region)
        return c

    def _fetch_credentials(self, region: str) -> Credentials:
        env = self.settings.env
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
            return Credentials(
                env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], env.get("AWS_SESSION_TOKEN")
            )
        if uri := env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
            token = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN", "")
            if path := env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"):
                token = Path(path).read_text().strip()
            r = cloud.call(self.session, "GET", uri, what="EKS Pod Identity credentials",
                           headers={"Authorization": token})  # fmt: skip
            body = r.json()
            return Credentials(body["AccessKeyId"], body["SecretAccessKey"], body.get("Token"),
                               _epoch(body.get("Expiration")))  # fmt: skip
        if env.get("AWS_ROLE_ARN") and env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
            return self._assume_role(region, env["AWS_ROLE_ARN"], Path(env["AWS_WEB_IDENTITY_TOKEN_FILE"]))
        raise ConfigError(
            "AWS: no credentials: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, EKS Pod Identity or IRSA "
            "(AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE)"
        )

    def _assume_role(self, region: str, role: str, token_file: Path) -> Credentials:
        base = self.settings.sts_endpoint or self.settings.env.get("AWS_ENDPOINT_URL_STS", "")
        params = {
            "Action": "AssumeRoleWithWebIdentity", "Version": STS_VERSION, "RoleArn": role,
            "RoleSessionName": self.settings.env.get("AWS_ROLE_SESSION_NAME", "faultline-janitor"),
            "WebIdentityToken": token_file.read_text().strip(),
        }  # fmt: skip
        url = (base or f"https://sts.{region}.amazonaws.com").rstrip("/") + "/"
        r = self.session.post(url, data=params, timeout=cloud.TIMEOUT_S)
        if r.status_code != 200:
            raise cloud.CloudError(
                f"AWS STS AssumeRoleWithWebIdentity: HTTP {r.status_code}: {_error(r.text)}"
            )
        c = _xml(r.text, "STS").find(".//Credentials")
        if c is None:
            raise cloud.CloudError("AWS STS AssumeRoleWithWebIdentity: no Credentials in the answer")
        return Credentials(c.findtext("AccessKeyId", ""), c.findtext("SecretAccessKey", ""),
                           c.findtext("SessionToken"), _epoch(c.findtext("Expiration")))  # fmt: skip

    # -- EC2 -------------------------------------------------------------------------------------------
    def _region(self, inst: cloud.Instance) -> str:
        if self.settings.region:
            return self.settings.region
        m = re.match(r"^([a-z]{2}(?:-gov)?-[a-z]+-\d+)", inst.zone)
        if not m:
            raise ConfigError(f"AWS: no region set and none in the providerID {inst.provider_id!r}")
        return m[1]

    def ec2(self, inst: cloud.Instance, action: str, params: dict[str, str]) -> ET.Element:
        return self._ec2(self._region(inst), action, params, f"AWS EC2 {action} {inst.id}")

    def _ec2(self, region: str, action: str, params: dict[str, str], what: str) -> ET.Element:
        base = self.settings.endpoint or self.settings.env.get("AWS_ENDPOINT_URL_EC2", "")
        url = (base or f"https://ec2.{region}.amazonaws.com").rstrip("/") + "/"
        body = urllib.parse.urlencode({"Action": action, "Version": EC2_VERSION, **params}).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
        headers |= sign(
            "POST", url, headers, body, self.credentials(region), region, "ec2", dt.datetime.now(dt.UTC)
        )
        try:
            r = self.session.post(url, data=body, headers=headers, timeout=cloud.TIMEOUT_S)
        except requests.RequestException as exc:
            raise TransientError(f"{what}: {exc}", delay=5.0) from exc
        if (
            r.status_code == 503
            or r.status_code >= 500
            or "RequestLimitExceeded" in r.text[:THROTTLED_WITHIN]
        ):
            raise TransientError(f"{what}: HTTP {r.status_code}: {_error(r.text)}", delay=5.0)
        if r.status_code != 200:
            raise cloud.CloudError(f"{what}: HTTP {r.status_code}: {_error(r.text)}")
        return _xml(r.text, what)

    def reboot(self, inst: cloud.Instance) -> str:
        root = self.ec2(inst, "RebootInstances", {"InstanceId.1": inst.id})
        if root.findtext("return") != "true":
            raise cloud.CloudError(f"AWS EC2 RebootInstances {inst.id}: the answer was not true")
        return f"EC2 RebootInstances {inst.id} accepted (request {root.findtext('requestId')})"

    def replace(self, inst: cloud.Instance) -> str:
        root = self.ec2(inst, "TerminateInstances", {"InstanceId.1": inst.id})
        state = root.findtext(".//instancesSet/item/currentState/name") or "unknown"
        return f"EC2 TerminateInstances {inst.id}: {state}; its Auto Scaling group launches a replacement"

    def instance_events(self, instances: list[cloud.Instance]) -> dict[str, list[dict[str, str]]]:
        """The scheduled events of these instances, each event's fields as text (`code`, `description`,
        `notBefore`, `notAfter`, `instanceEventId`), by instance id: DescribeInstanceStatus with
        IncludeAllInstances (stopped ones too), DESCRIBE_BATCH ids a call per region. An instance EC2 no
        longer knows (terminated and gone) has no events: it is left out of the call and retried without."""
        by_region: dict[str, list[str]] = {}
        for inst in instances:
            by_region.setdefault(self._region(inst), []).append(inst.id)
        out: dict[str, list[dict[str, str]]] = {}
        for region, ids in sorted(by_region.items()):
            for start in range(0, len(ids), DESCRIBE_BATCH):
                out.update(self._describe(region, ids[start : start + DESCRIBE_BATCH]))
        return out

    def _describe(self, region: str, ids: list[str]) -> dict[str, list[dict[str, str]]]:
        out: dict[str, list[dict[str, str]]] = {i: [] for i in ids}
        token = ""
        while ids:
            params = {"IncludeAllInstances": "true", **{f"InstanceId.{n}": i for n, i in enumerate(ids, 1)}}
            if token:
                params["NextToken"] = token
            what = f"AWS EC2 DescribeInstanceStatus ({len(ids)} instances in {region})"
            try:
                root = self._ec2(region, "DescribeInstanceStatus", params, what)
            except cloud.CloudError as exc:
                gone = set(re.findall(r"i-[0-9a-f]+", str(exc))) & set(ids)
                if "InvalidInstanceID" not in str(exc) or not gone:
                    raise
                ids = [i for i in ids if i not in gone]
                continue
            statuses = root.find("instanceStatusSet")
            for item in list(statuses) if statuses is not None else []:
                events = item.find("eventsSet")
                listed = list(events) if events is not None else []
                found = [{field.tag: (field.text or "") for field in event} for event in listed]
                out.setdefault(item.findtext("instanceId", ""), []).extend(found)
            token = root.findtext("nextToken") or ""
            if not token:
                break
        return out


def _epoch(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
