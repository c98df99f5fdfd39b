"""The Secrets the chart needs and must not render (`faultline chart-secrets`, its pre-install and
pre-upgrade hook): made once, never overwritten.

A value the chart generated itself (`randAlphaNum`, kept by `lookup`) is new on every `helm template`, which
is how Argo CD and Flux render: each sync would overwrite the store's password and the evidence key, and
the components would lose the store. The chart therefore renders no such Secret. This hook creates each
one that is missing, with its `random` keys drawn here (letters and digits, from `secrets`), its `fixed`
keys, and its `derived` keys (`${key}` of the others, e.g. the store's URI from its password). On a Secret
that exists it adds the keys that are missing and rewrites the derived ones from the stored values; a
random or fixed key already there is never changed. Every run is idempotent.

A Secret an earlier chart version rendered belongs to its Helm release, and `helm upgrade` deletes
resources the new manifest no longer has; the hook marks such a Secret `helm.sh/resource-policy: keep`
first (the upgrade then leaves it, and it is never the release's to delete again).
"""

from __future__ import annotations

import logging
import secrets as random
import string
from collections.abc import Iterable
from dataclasses import dataclass, field

from faultline.errors import AlreadyExistsError, ConflictError
from faultline.kube import lite
from faultline.kube import preflight as kp

log = logging.getLogger(__name__)
ALPHABET = string.ascii_letters + string.digits
HELM_RELEASE = "meta.helm.sh/release-name"
KEEP = {"helm.sh/resource-policy": "keep"}
TRIES = 5  # conflicting writes in a row before giving up (another run at the same moment)


@dataclass(frozen=True)
class SecretSpec:
    name: str
    random: dict[str, int] = field(default_factory=dict)  # key: length
    fixed: dict[str, str] = field(default_factory=dict)
    derived: dict[str, str] = field(default_factory=dict)  # key: template of ${other keys}
    labels: dict[str, str] = field(default_factory=dict)


def _draw(length: int) -> bytes:
    return "".join(random.choice(ALPHABET) for _ in range(length)).encode()


def wanted(spec: SecretSpec, have: dict[str, bytes]) -> dict[str, bytes]:
    """The Secret's data: what it has, the keys it lacks added, the derived keys from the rest."""
    data = dict(have)
    for key, length in spec.random.items():
        data.setdefault(key, _draw(length))
    for key, value in spec.fixed.items():
        data.setdefault(key, value.encode())
    values = {k: v.decode(errors="replace") for k, v in data.items() if k not in spec.derived}
    for key, template in spec.derived.items():
        try:
            data[key] = string.Template(template).substitute(values).encode()
        except (KeyError, ValueError) as exc:
            raise ValueError(f"Secret {spec.name}: derived key {key!r}: {template!r} names {exc}") from None
    return data


def ensure(client: lite.Client, namespace: str, specs: Iterable[SecretSpec]) -> dict[str, str]:
    """Each Secret made or completed; what was done to each ("created", "completed", "kept")."""
    done: dict[str, str] = {}
    for spec in specs:
        done[spec.name] = _ensure_one(client, namespace, spec)
        log.info("chart secret", extra={"item": spec.name, "outcome": done[spec.name]})
    return done


def label_namespaces(client: lite.Client, wanted: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """Set each label a namespace does not have yet (the Pod Security level the release's pods need); one
    it has, whatever its value, is left alone (someone chose it). The keys set, by namespace."""
    done: dict[str, list[str]] = {}
    for namespace, labels in wanted.items():
        path = f"/api/v1/namespaces/{namespace}"
        doc = client.request("GET", path, what=f"Namespace {namespace}")
        have = (doc.get("metadata") or {}).get("labels") or {}
        missing = {k: v for k, v in labels.items() if k not in have}
        if missing:
            client.request("PATCH", path, {"metadata": {"labels": missing}}, content_type=kp.MERGE_PATCH,
                           what=f"Namespace {namespace}")  # fmt: skip
        done[namespace] = sorted(missing)
        log.info(
            "namespace labels", extra={"item": namespace, "outcome": ",".join(sorted(missing)) or "kept"}
        )
    return done


def _ensure_one(client: lite.Client, namespace: str, spec: SecretSpec) -> str:
    for _ in range(TRIES):
        found = kp.read_secret(client, namespace, spec.name)
        if found is None:
            try:
                kp.write_secret(
                    client, namespace, spec.name, wanted(spec, {}), found=None, labels=spec.labels
                )
            except AlreadyExistsError:
                continue  # made meanwhile (another run): completed on the next look
            return "created"
        data = wanted(spec, found.data)
        annotations = dict(found.metadata.get("annotations") or {})
        release_owned = HELM_RELEASE in annotations and annotations.get("helm.sh/resource-policy") != "keep"
        if data == found.data and not release_owned:
            return "kept"
        if release_owned:
            meta = {**found.metadata, "annotations": {**annotations, **KEEP}}
            found = found._replace(metadata=meta)
        try:
            kp.write_secret(client, namespace, spec.name, data, found=found)
        except ConflictError:
            continue  # changed since it was read: read it again
        return "completed"
    raise ConflictError("write", f"Secret {namespace}/{spec.name}", f"{TRIES} conflicting writes in a row")
