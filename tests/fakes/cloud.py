"""Local fakes of the four providers' HTTP APIs, in one threaded HTTP server, for the janitor's cloud
calls. Each checks what the real API checks first: the authentication (AWS Signature V4 recomputed with
the secret key, OCI's RSA signature verified with the public key, bearer tokens the fake itself issued
from its metadata / token endpoints), the method and path, and answers in the provider's format (EC2
XML, GCE operations, ARM asynchronous operations, OCI JSON). `on_reboot` / `on_replace` are called with
the instance id, so a test can reboot or remove the simulated node.

What the maintenance monitor reads, set by a test: `ec2_events` (DescribeInstanceStatus's events by
instance id; an id in `ec2_gone` is refused as EC2 refuses a terminated one), `gce_instances` (a zone's
instances.list by (project, zone)), `oci_instances` (GetInstance by OCID), and, for a node agent, Azure's
instance metadata service: `azure_vm` (the compute name) and `azure_events` (the Scheduled Events
document's events; each answer raises its DocumentIncarnation when they changed). A StartRequests post
marks its events Started, records them in `azure_started` and calls `on_start` with each id."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import itertools
import json
import re
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from workers.cloud import aws

AWS_KEY, AWS_SECRET = "AKIDFAULTLINETEST", "c2VjcmV0LWZvci10aGUtZmFrZQ"
WEB_IDENTITY_TOKEN = "eyJ.fake.web-identity"  # what IRSA / Azure workload identity mount
POD_IDENTITY_TOKEN = "pod-identity-token"
OCI_KEY_ID = "ocid1.tenancy.oc1..t/ocid1.user.oc1..u/20:3b:97:13:55:1c:5b:0d"
EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"


class FakeCloud:
    def __init__(self, *, oci_public_key: rsa.RSAPublicKey | None = None) -> None:
        self.calls: list[tuple[str, str, str]] = []  # (provider, action, instance)
        self.on_reboot: Callable[[str], None] = lambda _: None
        self.on_replace: Callable[[str], None] = lambda _: None
        self.fail: dict[str, list[tuple[int, str]]] = {}  # provider -> answers to give first
        self.gce_groups: dict[str, str] = {}  # instance name -> created-by (a managed instance group)
        self.oci_public_key = oci_public_key
        self.tokens: set[str] = set()
        self.sessions: dict[str, str] = {}  # AWS session token -> secret issued with it
        self.ec2_events: dict[str, list[dict[str, str]]] = {}
        self.ec2_gone: set[str] = set()
        self.gce_instances: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self.oci_instances: dict[str, dict[str, Any]] = {}
        self.azure_vm = "aks-gpu-00000000-vmss_0"
        self.azure_events: list[dict[str, Any]] = []
        self.azure_started: list[str] = []
        self.on_start: Callable[[str], None] = lambda _: None
        self._incarnation: tuple[int, str] = (1, "[]")
        self._ops: dict[str, int] = {}  # operation -> polls left before it is done
        self._n = itertools.count(1)
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._serve(self, "GET")

            def do_POST(self) -> None:
                fake._serve(self, "POST")

            def do_DELETE(self) -> None:
                fake._serve(self, "DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeCloud:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def actions(self, provider: str) -> list[tuple[str, str]]:
        return [(a, i) for p, a, i in self.calls if p == provider]

    # -- plumbing ----------------------------------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        parts = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        try:
            status, headers, out = self._route(h, method, parts.path, query, body)
        except Exception as exc:  # noqa: BLE001 - a fake's bug shows as a 599 in the test
            status, headers, out = 599, {}, f"fake failed: {type(exc).__name__}: {exc}".encode()
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(out)))
        h.end_headers()
        h.wfile.write(out)

    def _injected(self, provider: str) -> tuple[int, dict[str, str], bytes] | None:
        with self._lock:
            queue = self.fail.get(provider) or []
            if queue:
                status, text = queue.pop(0)
                return status, {}, text.encode()
        return None

    def _token(self, prefix: str) -> str:
        token = f"{prefix}-{next(self._n)}"
        self.tokens.add(token)
        return token

    def _bearer(self, h: BaseHTTPRequestHandler) -> bool:
        auth = h.headers.get("Authorization", "")
        return auth.startswith("Bearer ") and auth[7:] in self.tokens

    def _route(
        self, h: BaseHTTPRequestHandler, method: str, path: str, query: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if path.startswith("/aws/"):
            return self._aws(h, method, path, body)
        if path in ("/metadata/scheduledevents", "/metadata/instance/compute"):
            return self._imds(h, method, path, query, body)
        if path == "/pod-identity":
            if h.headers.get("Authorization") != POD_IDENTITY_TOKEN:
                return 401, {}, b"bad token"
            token = self._token("aws-session")
            self.sessions[token] = "pod-identity-secret"
            expires = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
            creds = {"AccessKeyId": "ASIAPOD", "SecretAccessKey": "pod-identity-secret", "Token": token,
                     "Expiration": expires}  # fmt: skip
            return 200, {}, json.dumps(creds).encode()
        if path.startswith("/computeMetadata/") or path.startswith("/compute/v1/"):
            return self._gcp(h, method, path, body)
        if (
            path.startswith("/metadata/identity/")
            or "/oauth2/v2.0/token" in path
            or "/subscriptions/" in path
        ):
            return self._azure(h, method, path, query, body)
        if path.startswith("/azure-operations/"):
            return self._azure_operation(h, path)
        if path.startswith("/20160918/"):
            return self._oci(h, method, path, body)
        return 404, {}, f"no route {method} {path}".encode()

    # -- AWS ---------------------------------------------------------------------------------------------
    def _aws(
        self, h: BaseHTTPRequestHandler, method: str, path: str, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        params = dict(urllib.parse.parse_qsl(body.decode()))
        if path == "/aws/sts/":
            if (
                params.get("Action") != "AssumeRoleWithWebIdentity"
                or params.get("WebIdentityToken") != WEB_IDENTITY_TOKEN
            ):
                return 403, {}, _aws_error("AccessDenied", "bad web identity token")
            token = self._token("aws-session")
            self.sessions[token] = "irsa-secret"
            return (
                200,
                {},
                (
                    '<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
                    "<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIAIRSA</AccessKeyId>"
                    f"<SecretAccessKey>irsa-secret</SecretAccessKey><SessionToken>{token}</SessionToken>"
                    "<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials>"
                    "</AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"
                ).encode(),
            )
        error = self._aws_check_signature(h, method, path, body)
        if error:
            return 403, {}, _aws_error("SignatureDoesNotMatch", error)
        if injected := self._injected("aws"):
            return injected
        action, instance = params.get("Action", ""), params.get("InstanceId.1", "")
        if action == "DescribeInstanceStatus" and params.get("Version") == aws.EC2_VERSION:
            return self._ec2_status(params)
        if params.get("Version") != aws.EC2_VERSION or not instance.startswith("i-"):
            return 400, {}, _aws_error("InvalidParameterValue", f"bad request {params}")
        if instance == "i-00000000000000404":
            return (
                400,
                {},
                _aws_error("InvalidInstanceID.NotFound", f"The instance ID '{instance}' does not exist"),
            )
        self.calls.append(("aws", action, instance))
        if action == "RebootInstances":
            self.on_reboot(instance)
            return (
                200,
                {},
                f'<RebootInstancesResponse xmlns="{EC2_NS}"><requestId>r-1</requestId><return>true</return></RebootInstancesResponse>'.encode(),
            )
        if action == "TerminateInstances":
            self.on_replace(instance)
            return (
                200,
                {},
                (
                    f'<TerminateInstancesResponse xmlns="{EC2_NS}"><requestId>r-2</requestId><instancesSet><item>'
                    f"<instanceId>{instance}</instanceId><currentState><code>32</code><name>shutting-down</name>"
                    "</currentState></item></instancesSet></TerminateInstancesResponse>"
                ).encode(),
            )
        return 400, {}, _aws_error("InvalidAction", action)

    def _ec2_status(self, params: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        ids = [v for k, v in sorted(params.items()) if k.startswith("InstanceId.")]
        if params.get("IncludeAllInstances") != "true" or not 0 < len(ids) <= aws.DESCRIBE_BATCH:
            return 400, {}, _aws_error("InvalidParameterValue", f"bad DescribeInstanceStatus {params}")
        gone = [i for i in ids if i in self.ec2_gone]
        if gone:
            message = f"The instance IDs '{', '.join(gone)}' do not exist"
            return 400, {}, _aws_error("InvalidInstanceID.NotFound", message)
        self.calls.append(("aws", "DescribeInstanceStatus", ",".join(ids)))
        items = []
        for i in ids:
            events = "".join(
                "<item>" + "".join(f"<{k}>{v}</{k}>" for k, v in e.items()) + "</item>"
                for e in self.ec2_events.get(i, [])
            )
            items.append(f"<item><instanceId>{i}</instanceId><availabilityZone>us-east-1a</availabilityZone>"
                         f"<eventsSet>{events}</eventsSet><instanceState><code>16</code><name>running</name>"
                         "</instanceState></item>")  # fmt: skip
        body = (f'<DescribeInstanceStatusResponse xmlns="{EC2_NS}"><requestId>r-3</requestId>'
                f"<instanceStatusSet>{''.join(items)}</instanceStatusSet></DescribeInstanceStatusResponse>")  # fmt: skip
        return 200, {}, body.encode()

    def _aws_check_signature(
        self, h: BaseHTTPRequestHandler, method: str, path: str, body: bytes
    ) -> str | None:
        auth = h.headers.get("Authorization", "")
        m = re.match(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/ec2/aws4_request, "
                     r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$", auth)  # fmt: skip
        if not m:
            return f"malformed Authorization {auth!r}"
        key, _, region, signed, _signature = m.groups()
        token = h.headers.get("X-Amz-Security-Token")
        secret = AWS_SECRET if key == AWS_KEY else self.sessions.get(token or "")
        if secret is None:
            return f"unknown access key {key}"
        when = dt.datetime.strptime(h.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        given = {
            n: h.headers[n]
            for n in signed.split(";")
            if n not in ("host", "x-amz-date", "x-amz-security-token")
        }
        expected = aws.sign(method, f"http://{h.headers['Host']}{path}", given, body,
                            aws.Credentials(key, secret, token), region, "ec2", when)["Authorization"]  # fmt: skip
        return None if expected == auth else "signature does not match"

    # -- GCP ---------------------------------------------------------------------------------------------
    def _gcp(
        self, h: BaseHTTPRequestHandler, method: str, path: str, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if path.startswith("/computeMetadata/"):
            if h.headers.get("Metadata-Flavor") != "Google":
                return 403, {}, b"Missing Metadata-Flavor:Google header."
            return 200, {}, json.dumps({"access_token": self._token("gcp"), "expires_in": 3599,
                                        "token_type": "Bearer"}).encode()  # fmt: skip
        if not self._bearer(h):
            return (
                401,
                {},
                json.dumps({"error": {"code": 401, "message": "Request had invalid credentials."}}).encode(),
            )
        if injected := self._injected("gcp"):
            return injected
        m = re.match(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/(.*)$", path)
        if not m:
            return 404, {}, b"not found"
        project, zone, rest = m.groups()
        if op := re.match(r"^operations/([^/]+)$", rest):
            name = op[1]
            with self._lock:
                left = self._ops.get(name)
                if left is None:
                    return 404, {}, b"no such operation"
                self._ops[name] = max(0, left - 1)
            return 200, {}, json.dumps(_gce_op(name, "RUNNING" if left else "DONE")).encode()
        if rest == "instances" and method == "GET":
            listed = self.gce_instances.get((project, zone), {})
            self.calls.append(("gcp", "list", f"{project}/{zone}"))
            items = [{"name": n, **i} for n, i in sorted(listed.items())]
            return 200, {}, json.dumps({"items": items}).encode()
        if grp := re.match(r"^instanceGroupManagers/([^/]+)/recreateInstances$", rest):
            for url in json.loads(body)["instances"]:
                instance = url.rsplit("/", 1)[-1]
                self.calls.append(("gcp", f"recreate:{grp[1]}", instance))
                self.on_replace(instance)
            return 200, {}, self._gce_start()
        vm = re.match(r"^instances/([^/]+)(/reset)?$", rest)
        if not vm:
            return 404, {}, b"not found"
        instance = vm[1]
        if instance == "missing":
            return (
                404,
                {},
                json.dumps(
                    {
                        "error": {
                            "code": 404,
                            "message": f"The resource 'projects/{project}/zones/{zone}/instances/missing' was not found",
                        }
                    }
                ).encode(),
            )
        if method == "GET":
            items = (
                [{"key": "created-by", "value": self.gce_groups[instance]}]
                if instance in self.gce_groups
                else []
            )
            return (
                200,
                {},
                json.dumps({"name": instance, "status": "RUNNING", "metadata": {"items": items}}).encode(),
            )
        if method == "POST" and vm[2]:
            self.calls.append(("gcp", "reset", instance))
            self.on_reboot(instance)
            return 200, {}, self._gce_start()
        if method == "DELETE":
            self.calls.append(("gcp", "delete", instance))
            self.on_replace(instance)
            return 200, {}, self._gce_start()
        return 405, {}, b"method not allowed"

    def _gce_start(self) -> bytes:
        name = f"operation-{next(self._n)}"
        with self._lock:
            self._ops[name] = 2  # done at the third look
        return json.dumps(_gce_op(name, "RUNNING")).encode()

    # -- Azure -------------------------------------------------------------------------------------------
    def _azure(
        self, h: BaseHTTPRequestHandler, method: str, path: str, query: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if path.startswith("/metadata/identity/"):
            if (
                h.headers.get("Metadata") != "true"
                or query.get("resource") != "https://management.azure.com/"
            ):
                return (
                    400,
                    {},
                    b'{"error":"invalid_request","error_description":"Required metadata header not specified"}',
                )
            return (
                200,
                {},
                json.dumps({"access_token": self._token("azure-msi"), "expires_in": "3599"}).encode(),
            )
        if path.endswith("/oauth2/v2.0/token"):
            form = dict(urllib.parse.parse_qsl(body.decode()))
            if (
                form.get("client_assertion") != WEB_IDENTITY_TOKEN
                or form.get("scope") != "https://management.azure.com/.default"
            ):
                return 401, {}, b'{"error":"invalid_client"}'
            return 200, {}, json.dumps({"access_token": self._token("azure-wi"), "expires_in": 3599}).encode()
        if not self._bearer(h):
            return (
                401,
                {},
                b'{"error":{"code":"InvalidAuthenticationToken","message":"The access token is invalid."}}',
            )
        if injected := self._injected("azure"):
            return injected
        m = re.match(r"^(/subscriptions/.+/virtualMachines/[^/]+)/(restart|redeploy)$", path)
        if method != "POST" or not m or query.get("api-version") != "2024-07-01":
            return 404, {}, json.dumps({"error": {"code": "ResourceNotFound", "message": path}}).encode()
        resource, action = m.groups()
        self.calls.append(("azure", action, resource))
        (self.on_reboot if action == "restart" else self.on_replace)(resource)
        name = f"op-{next(self._n)}"
        with self._lock:
            self._ops[name] = 1
        return 202, {"Azure-AsyncOperation": f"{self.url}/azure-operations/{name}", "Retry-After": "0"}, b""

    def _azure_operation(self, h: BaseHTTPRequestHandler, path: str) -> tuple[int, dict[str, str], bytes]:
        if not self._bearer(h):
            return 401, {}, b""
        name = path.rsplit("/", 1)[-1]
        with self._lock:
            left = self._ops[name]
            self._ops[name] = max(0, left - 1)
        return 200, {}, json.dumps({"status": "InProgress" if left else "Succeeded"}).encode()

    # -- Azure's instance metadata service (on the node) ----------------------------------------------------
    def _imds(
        self, h: BaseHTTPRequestHandler, method: str, path: str, query: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if h.headers.get("Metadata") != "true" or not query.get("api-version"):
            return 400, {}, b'{"error":"Bad request. Required metadata header not specified"}'
        if path == "/metadata/instance/compute":
            return 200, {}, json.dumps({"name": self.azure_vm, "vmId": "00000000-1111"}).encode()
        if method == "POST":
            wanted = [r.get("EventId") for r in json.loads(body or b"{}").get("StartRequests", [])]
            with self._lock:
                for event in self.azure_events:
                    if event.get("EventId") in wanted:
                        event["EventStatus"] = "Started"
                self.azure_started.extend(str(w) for w in wanted)
            for w in wanted:
                self.on_start(str(w))
            return 200, {}, b""
        with self._lock:
            events = json.dumps(self.azure_events, sort_keys=True)
            if events != self._incarnation[1]:
                self._incarnation = (self._incarnation[0] + 1, events)
            incarnation = self._incarnation[0]
        document = {"DocumentIncarnation": incarnation, "Events": json.loads(events)}
        return 200, {}, json.dumps(document).encode()

    # -- OCI ---------------------------------------------------------------------------------------------
    def _oci(
        self, h: BaseHTTPRequestHandler, method: str, path: str, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        error = self._oci_check_signature(h, method, body)
        if error:
            return 401, {}, json.dumps({"code": "NotAuthenticated", "message": error}).encode()
        if injected := self._injected("oci"):
            return injected
        parts = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        m = re.match(r"^/20160918/instances/(ocid1\.instance\.[^/]+)$", path)
        if not m:
            return 404, {}, b'{"code":"NotAuthorizedOrNotFound"}'
        instance = m[1]
        if method == "GET":
            if instance not in self.oci_instances:
                return 404, {}, b'{"code":"NotAuthorizedOrNotFound","message":"not found"}'
            self.calls.append(("oci", "GET", instance))
            return 200, {}, json.dumps({"id": instance, **self.oci_instances[instance]}).encode()
        if method == "POST" and query.get("action") == "RESET":
            self.calls.append(("oci", "RESET", instance))
            self.on_reboot(instance)
            return 200, {}, json.dumps({"id": instance, "lifecycleState": "STOPPING"}).encode()
        if method == "DELETE":
            self.calls.append(("oci", "TERMINATE", instance))
            self.on_replace(instance)
            return 204, {}, b""
        return 400, {}, b'{"code":"InvalidParameter"}'

    def _oci_check_signature(self, h: BaseHTTPRequestHandler, method: str, body: bytes) -> str | None:
        auth = h.headers.get("Authorization", "")
        fields = dict(re.findall(r'(\w+)="([^"]*)"', auth))
        if not auth.startswith("Signature ") or fields.get("algorithm") != "rsa-sha256":
            return f"malformed Authorization {auth!r}"
        if fields.get("keyId") != OCI_KEY_ID:
            return f"unknown keyId {fields.get('keyId')}"
        names = fields.get("headers", "").split()
        required = {"date", "(request-target)", "host"}
        if method in ("POST", "PUT"):
            required |= {"x-content-sha256", "content-type", "content-length"}
            if h.headers.get("x-content-sha256") != base64.b64encode(hashlib.sha256(body).digest()).decode():
                return "x-content-sha256 does not match the body"
        if not required <= set(names):
            return f"headers {names} do not cover {sorted(required)}"
        lines = [f"(request-target): {method.lower()} {h.path}" if n == "(request-target)" else f"{n}: {h.headers[n]}"
                 for n in names]  # fmt: skip
        assert self.oci_public_key is not None
        try:
            self.oci_public_key.verify(base64.b64decode(fields["signature"]), "\n".join(lines).encode(),
                                       padding.PKCS1v15(), hashes.SHA256())  # fmt: skip
        except Exception:  # noqa: BLE001 - any failure is a bad signature
            return "the signature does not verify"
        return None


def _aws_error(code: str, message: str) -> bytes:
    return (f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
            "<RequestID>req-1</RequestID></Response>").encode()  # fmt: skip


def _gce_op(name: str, status: str) -> dict[str, Any]:
    return {"kind": "compute#operation", "name": name, "status": status}


def oci_config(directory: Path, key: rsa.RSAPrivateKey, *, passphrase: str | None = None) -> Path:
    """An OCI config file and PEM key in `directory`, for the key id the fake accepts."""
    encryption = (
        serialization.BestAvailableEncryption(passphrase.encode())
        if passphrase
        else serialization.NoEncryption()
    )
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    (directory / "key.pem").write_bytes(pem)
    tenancy, user, fingerprint = OCI_KEY_ID.split("/")
    lines = ["[DEFAULT]", f"user={user}", f"fingerprint={fingerprint}", f"tenancy={tenancy}", "region=us-ashburn-1",
             "key_file=key.pem"] + ([f"pass_phrase={passphrase}"] if passphrase else [])  # fmt: skip
    (directory / "config").write_text("\n".join(lines) + "\n")
    return directory / "config"
