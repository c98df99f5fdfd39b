"""Gangs: the pods of one multi-pod job share one record of their preflight, so that one member's failure
stops the others' init containers at once, and a gang whose members all pass starts together.

Which gang a pod is in comes from its labels or annotations (`identify`, run by the webhook at admission
and handed to the init container): the first of the configured keys the pod carries names it (JobSet's
jobset-name, LeaderWorkerSet's group-key, Kubeflow's job-name, Kueue's pod-group-name, Volcano's
group-name or job-name, or faultline.io/gang), a round key makes each restart of a job a gang of its own
(JobSet's restart-attempt), and the first size key gives the expected number of members.

The record is a coordination.k8s.io Lease in the pod's namespace, `faultline-gang-<name>-<hash>`, not a
document in faultline's store: the init container runs in the user's pod, as the pod's ServiceAccount,
in the user's namespace, and must not hold the store's credentials (a Secret that lives in faultline's
namespace and opens every fault record). A Lease needs one narrow grant in the pod's own namespace
(leases get, create, patch: the chart's `<release>-preflight-gang` ClusterRole, bound per namespace),
is gone with the namespace, and is what Kubernetes itself uses for small coordination records. Members
write their own annotation keys with merge patches, so they never conflict with each other:

    faultline.io/gang          the gang's name (for people)
    faultline.io/gang-round    the round: a failed round is closed after `failure_hold`, and the next
                               member to arrive opens round n+1 (a patch guarded by resourceVersion)
    member.faultline.io/<h>    one member (h: a hash of its pod's name): {"pod", "node", "state":
                               checking|passed|failed, "round", "at", "reason"}

This module is the pure part (which gang, the record, the verdict); `workers.gang_lease` reads and writes
the Lease. `decide` is the verdict over a round: a failed member fails the gang, with its pod, node and
reason; `size` members passed: proceed; otherwise wait (the caller's deadline decides what a timeout
means).
Without a known size a member does not wait: it proceeds once it passed, and still fails fast when a
member failed before it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

NAME = "faultline.io/gang"
ROUND = "faultline.io/gang-round"
SIZE = "faultline.io/gang-size"
MEMBER = "member.faultline.io/"
LABEL = "app.kubernetes.io/managed-by"
LEASE_HASH = 10  # hex characters of the hash that makes a gang's Lease name unique
MEMBER_HASH = 16  # hex characters of the pod name's hash in a member's annotation key (a name may be long)
_UNSAFE = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class Gang:
    name: str  # "<key>=<value>[,<round key>=<value>]": which key named it, for people
    size: int | None


def identify(
    labels: Mapping[str, str], annotations: Mapping[str, str], *, keys: Sequence[str],
    size_keys: Sequence[str], round_keys: Sequence[str] = (),
) -> Gang | None:  # fmt: skip
    """The pod's gang (None: it is in none). A label wins over an annotation of the same key; a size that
    is not a positive integer is ValueError naming the key and the value."""

    def value(key: str) -> str | None:
        found = labels.get(key, annotations.get(key))
        return found.strip() if isinstance(found, str) and found.strip() else None

    named = next(((k, v) for k in keys if (v := value(k)) is not None), None)
    if named is None:
        return None
    name = f"{named[0]}={named[1]}"
    for key in round_keys:
        if (v := value(key)) is not None:
            name += f",{key}={v}"
    size = None
    for key in size_keys:
        if (v := value(key)) is not None:
            if not v.isdigit() or int(v) < 1:
                raise ValueError(f"{key}: {v!r} is not a gang size (a positive integer)")
            size = int(v)
            break
    return Gang(name, size)


def lease_name(gang: str) -> str:
    """A DNS-1123 name for the gang's Lease: readable where it can be, unique by a hash."""
    digest = hashlib.sha256(gang.encode()).hexdigest()[:LEASE_HASH]
    room = 63 - len("faultline-gang--") - len(digest)  # a Lease's name: at most 63 characters
    readable = _UNSAFE.sub("-", gang.split("=", 1)[-1].lower()).strip("-")[:room].strip("-")
    return f"faultline-gang-{readable}-{digest}" if readable else f"faultline-gang-{digest}"


def member_key(pod: str) -> str:
    return MEMBER + hashlib.sha256(pod.encode()).hexdigest()[:MEMBER_HASH]


@dataclass(frozen=True)
class Member:
    pod: str
    node: str
    state: Literal["checking", "passed", "failed"]
    round: int
    at: float  # epoch seconds of the state
    reason: str = ""


@dataclass(frozen=True)
class Record:
    round: int
    members: dict[str, Member]  # by annotation key
    resource_version: str


def parse(lease: Mapping[str, Any]) -> Record:
    """The record a Lease holds; entries that do not parse (written by hand) are ignored."""
    meta = lease.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    try:
        round_ = max(1, int(annotations.get(ROUND, "1")))
    except ValueError:
        round_ = 1
    members = {}
    for key, text in annotations.items():
        if not key.startswith(MEMBER):
            continue
        try:
            doc = json.loads(text)
            state = doc["state"]
            if state not in ("checking", "passed", "failed"):
                continue
            members[key] = Member(str(doc["pod"]), str(doc.get("node", "")), state, int(doc["round"]),
                                  float(doc["at"]), str(doc.get("reason", "")))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            continue
    return Record(round_, members, str(meta.get("resourceVersion", "")))


@dataclass(frozen=True)
class Verdict:
    state: Literal["wait", "proceed", "failed"]
    reason: str
    passed: int = 0


def decide(record: Record, gang: Gang, *, round_: int) -> Verdict:
    """The gang's verdict in round `round_`, for a member whose own checks passed (a member still checking
    acts only on `failed`)."""
    if record.round > round_:
        return Verdict("failed", f"gang {gang.name}: round {round_} was closed after a member failed")
    members = [m for m in record.members.values() if m.round == round_]
    failed = sorted((m for m in members if m.state == "failed"), key=lambda m: m.at)
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return Verdict("failed", f"gang {gang.name}: member {first.pod} on node {first.node} failed "
                                 f"preflight{more}: {first.reason}")  # fmt: skip
    passed = sum(1 for m in members if m.state == "passed")
    if gang.size is None or passed >= gang.size:
        return Verdict("proceed", f"gang {gang.name}: {passed} members passed", passed)
    return Verdict("wait", f"gang {gang.name}: {passed} of {gang.size} members passed", passed)


def round_to_join(record: Record, *, now: float, failure_hold: float) -> int:
    """The round a member arriving now joins: the current one, or the next when the current one failed
    and its last failure is older than `failure_hold`."""
    failures = [m.at for m in record.members.values() if m.round == record.round and m.state == "failed"]
    if failures and now - max(failures) >= failure_hold:
        return record.round + 1
    return record.round
