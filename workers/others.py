"""Other systems that repair or remove nodes (pure): the markers they put on a Node while they act on it.

Two systems must not repair one node twice: while a Node carries one of these markers (`yield_to`), the
remediation worker decides no round for it and waits; faultline keeps holding the node. A marker is
    taint:KEY                 a taint with this key (any value and effect)
    condition:TYPE=STATUS     a node condition of this type with this status
    label:KEY[=VALUE]         a label (with this value)
    annotation:KEY[=VALUE]    an annotation (with this value)
The defaults (`config.workers.YIELD_TO`) name what other remediators are documented to put on a node
they are taking away: Karpenter v1's `karpenter.sh/disrupted` taint (`karpenter.sh/disruption` before
v1) and the cluster autoscaler's `ToBeDeletedByClusterAutoscaler` taint. Managed auto-repairs mark
nothing before they act; they act on conditions (EKS node auto repair: `AcceleratedHardwareReady=False`
for 10 minutes), which whoever turns that repair on adds to `yield_to` (docs/install/other-remediators.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

KINDS = ("taint", "condition", "label", "annotation")
_KEY = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_VALUE = re.compile(r"[-A-Za-z0-9_.]{0,63}")


@dataclass(frozen=True)
class Marker:
    kind: str
    key: str
    value: str | None = None  # None: any value

    def __str__(self) -> str:
        return f"{self.kind}:{self.key}" + ("" if self.value is None else f"={self.value}")


def parse(text: str) -> Marker:
    """One marker; ValueError naming what is wrong."""
    kind, sep, rest = text.partition(":")
    if not sep or kind not in KINDS:
        raise ValueError(f"{text!r}: a marker is KIND:KEY[=VALUE] with KIND one of {', '.join(KINDS)}")
    key, eq, value = rest.partition("=")
    if not _KEY.fullmatch(key):
        raise ValueError(f"{text!r}: {key!r} is not a {kind} key")
    if kind == "taint" and eq:
        raise ValueError(f"{text!r}: a taint marker names its key only")
    if kind == "condition" and value not in ("True", "False", "Unknown"):
        raise ValueError(
            f"{text!r}: a condition marker needs its status, True, False or Unknown (condition:TYPE=STATUS)"
        )
    if eq and not _VALUE.fullmatch(value):
        raise ValueError(f"{text!r}: {value!r} is not a {kind} value")
    return Marker(kind, key, value if eq else None)


def present(node: Mapping[str, Any], markers: Iterable[Marker]) -> Marker | None:
    """The first marker the Node carries, if any."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    taints = {t.get("key") for t in spec.get("taints") or []}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    for m in markers:
        if m.kind == "taint" and m.key in taints:
            return m
        if m.kind == "condition" and conditions.get(m.key) == m.value:
            return m
        if m.kind in ("label", "annotation"):
            found = (meta.get(f"{m.kind}s") or {}).get(m.key)
            if found is not None and (m.value is None or found == m.value):
                return m
    return None
