"""Who wrote a fault: signatures on stored faults that the store's credential cannot forge.

Every component reaches the store with a credential that, on most servers, lets it write any document
(FerretDB has no roles; see the store page for the MongoDB roles). So a fault document alone does not
say who wrote it, and the workers must not act on one that root on some GPU node wrote for another node.
Each writer therefore signs what it stores, and the quarantine and remediation workers act only on
faults whose signature they can attribute (`Verifier`):

- **A node agent** signs with an Ed25519 key of its own (`NodeKey`: made on first start in its state
  directory, 0600) and publishes the public half on its own Node as the annotation `faultline.io/agent-key`
  (through `nodes/status`, the one right it has on Nodes). The chart's ValidatingAdmissionPolicy lets the
  agent's ServiceAccount change only the Node its own pod runs on (the `node-name` claim of its bound
  token), and there only faultline's conditions and this annotation. A fault for node A verifies only
  against node A's key: an agent on node B can sign nothing that counts for A, and cannot put its key on A.
- **The cluster components** (analyzer, object monitor, cloud maintenance monitor, janitor) sign with an
  HMAC key held in a Secret that only they and the verifying workers mount (`ClusterKey`); no agent
  mounts it.

What is signed (`payload`): every field a worker decides on (node, entity, code, component, count, times,
fatal, action, state, resolution, metadata) and the revision; a changed field or a signature moved to
another fault fails. A copy of an older genuine revision of the same fault does verify: the workers'
`max_fault_age` bounds that (a replayed opening older than it is never acted on).

A document that cannot be attributed never opens anything; the workers record why (`refusal`), count it
(`faultline_evidence_refused_total`) and keep a node they already hold while such a document says its fault
resolved (fail closed: only the node's agent resolves its faults).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultline import ed25519
from faultline.errors import ConfigError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

KEY_ANNOTATION = "faultline.io/agent-key"
ED25519 = "ed25519:"
CLUSTER_SIGNERS = frozenset({"analyzer", "object-monitor", "maintenance", "janitor"})
KEY_FILE = "agent-key.pem"  # under the agent's state directory
CLUSTER_KEY_BYTES = 32  # at least, in the cluster key file
NODE_KEY_TTL_S = 30.0  # a verifier reuses a Node's published key this long
NO_NODE = "<no such Node>"  # what a key reader says for a Node that does not exist
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)
SIGNED = ("node", "entity", "code", "component", "count", "first_seen", "last_seen", "fatal", "action",
          "state", "resolved_at", "resolved_by", "metadata", "revision")  # fmt: skip


def _canon(value: Any) -> Any:
    """A value as the store gives it back: times in whole milliseconds (BSON keeps no more), UTC."""
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return {"$ms": (aware - _EPOCH) // _MS}
    if isinstance(value, Mapping):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canon(v) for v in value]
    if hasattr(value, "value") and not isinstance(value, bool | int | float | str):
        return value.value  # an enum
    return value


def payload(key: str, fields: Mapping[str, Any]) -> bytes:
    """The bytes signed for fault `key` with these stored fields (a `faults` document, or the same fields)."""
    body = {"_id": key, **{name: _canon(fields.get(name)) for name in SIGNED}}
    entity = body.get("entity")
    if isinstance(entity, Mapping):
        body["entity"] = {"type": entity.get("type"), "id": entity.get("id")}
    body["revision"] = int(fields.get("revision") or 0)
    body["metadata"] = dict(body.get("metadata") or {})
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


# -- signers --------------------------------------------------------------------------------------------


class NodeKey:
    """A node agent's signing key (Ed25519), kept in its state directory across restarts. It signs through
    the interpreter's own libcrypto (`faultline.ed25519`): the agent never loads `cryptography`."""

    def __init__(self, seed: bytes, node: str) -> None:
        self._private = ed25519.private_key(seed)
        self.node = node
        self.public = ED25519 + base64.b64encode(self._private.public).decode()  # the Node's annotation

    @classmethod
    def load_or_create(cls, state_dir: Path, node: str) -> NodeKey:
        path = state_dir / KEY_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            seed = os.urandom(ed25519.SEED_BYTES)  # any 32 random bytes are an Ed25519 key (RFC 8032 5.1.5)
            state_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(ed25519.to_pem(seed))
            tmp.replace(path)
            return cls(seed, node)
        try:
            seed = ed25519.from_pem(data)
        except ed25519.KeyFormatError as exc:
            raise ConfigError(f"{path}: {exc}; remove it to make a new one") from exc
        return cls(seed, node)

    @property
    def signer(self) -> str:
        return f"node:{self.node}"

    def sign(self, key: str, fields: Mapping[str, Any]) -> dict[str, str]:
        sig = self._private.sign(payload(key, fields))
        return {"by": self.signer, "sig": base64.b64encode(sig).decode()}


class ClusterKey:
    """The cluster components' shared HMAC key (a Secret mounted only by them and the verifying workers)."""

    def __init__(self, secret: bytes, component: str = "") -> None:
        if len(secret) < CLUSTER_KEY_BYTES:
            raise ConfigError(
                f"the evidence key has {len(secret)} bytes; it needs at least {CLUSTER_KEY_BYTES}"
            )
        if component and component not in CLUSTER_SIGNERS:
            signers = ", ".join(sorted(CLUSTER_SIGNERS))
            raise ConfigError(f"{component!r} does not sign faults (signers: {signers})")
        self._secret = secret
        self.component = component

    @classmethod
    def from_file(cls, path: Path, component: str = "") -> ClusterKey:
        try:
            text = path.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"evidence key {path}: {exc.strerror or exc}") from exc
        return cls(text, component)

    @property
    def signer(self) -> str:
        return f"cluster:{self.component}"

    def _mac(self, who: str, key: str, fields: Mapping[str, Any]) -> bytes:
        return hmac.new(self._secret, who.encode() + b"\n" + payload(key, fields), hashlib.sha256).digest()

    def sign(self, key: str, fields: Mapping[str, Any]) -> dict[str, str]:
        if not self.component:
            raise ConfigError("this evidence key verifies only (no component named to sign as)")
        return {"by": self.signer, "sig": base64.b64encode(self._mac(self.signer, key, fields)).decode()}

    def check(self, who: str, key: str, fields: Mapping[str, Any], sig: bytes) -> bool:
        return hmac.compare_digest(self._mac(who, key, fields), sig)


# -- verification ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    ok: bool
    signer: str = ""
    reason: str = ""  # why not, for a person (empty when ok)
    retry: bool = False  # the node's key is not readable yet: ask again later


def public_key(annotation: str | None) -> Ed25519PublicKey | None:
    """The key a Node's `faultline.io/agent-key` annotation publishes (None: none, or not one)."""
    if not annotation or not annotation.startswith(ED25519):
        return None
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey  # noqa: PLC0415 - not in the agent

    try:
        raw = base64.b64decode(annotation[len(ED25519) :], validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        return None


class Verifier:
    """Attributes stored faults: a node's agent's signature checked against the key its Node publishes, a
    cluster component's against the cluster key. `node_key(node)` reads a Node's annotation (None: no
    such Node or no key); results per (fault, revision, signature) are kept, keys for NODE_KEY_TTL_S."""

    def __init__(
        self, node_key: Callable[[str], str | None], cluster: ClusterKey | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._node_key = node_key
        self._cluster = cluster
        self._clock = clock
        self._keys: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def learn(self, node: str, annotation: str | None) -> None:
        """A Node's annotation as just read elsewhere (saves a read)."""
        with self._lock:
            self._keys[node] = (self._clock(), annotation)

    def _annotation(self, node: str) -> str | None:
        with self._lock:
            seen = self._keys.get(node)
        if seen is not None and self._clock() - seen[0] < NODE_KEY_TTL_S:
            return seen[1]
        found = self._node_key(node)
        self.learn(node, found)
        return found

    def verify(self, key: str, doc: Mapping[str, Any]) -> Verdict:
        """Whether `doc` (a fault's stored fields, with its `evidence`) was written by its node's agent or
        a cluster component."""
        evidence = doc.get("evidence")
        node = str(doc.get("node") or "")
        if not isinstance(evidence, Mapping) or not evidence.get("by") or not evidence.get("sig"):
            return Verdict(False, reason="not signed")
        who, sig_text = str(evidence["by"]), str(evidence["sig"])
        try:
            sig = base64.b64decode(sig_text, validate=True)
        except (binascii.Error, ValueError):
            return Verdict(False, who, "a signature that is not base64")
        kind, _, name = who.partition(":")
        if kind == "node":
            from cryptography.exceptions import InvalidSignature  # noqa: PLC0415 - the agent only signs

            if name != node:
                return Verdict(False, who, f"written for node {node} by node {name}'s agent")
            annotation = self._annotation(node)
            public = public_key(annotation)
            if public is None:
                if annotation == NO_NODE:
                    return Verdict(False, who, "no such Node")
                why = "its Node's agent key is not one" if annotation else "its Node publishes no agent key"
                return Verdict(False, who, why, retry=not annotation)
            try:
                public.verify(sig, payload(key, doc))
            except InvalidSignature:
                return Verdict(False, who, "the signature does not match the node agent's key")
            return Verdict(True, who)
        if kind == "cluster" and name in CLUSTER_SIGNERS:
            if self._cluster is None:
                return Verdict(False, who, "signed by a cluster component, and no evidence key is mounted")
            if not self._cluster.check(who, key, doc, sig):
                return Verdict(False, who, "the signature does not match the cluster key")
            return Verdict(True, who)
        return Verdict(False, who, f"an unknown signer {who!r}")
