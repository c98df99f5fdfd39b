"""One gang member's side of its gang's record: the Lease in the pod's namespace (`workers.gang` has the
record's shape, the rounds and the verdict), read and written on the light transport as the pod's
ServiceAccount: leases get, create and patch in its own namespace, nothing else."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Literal

from faultline.errors import AlreadyExistsError, ConflictError
from faultline.kube import preflight as ops
from faultline.kube.lite import Client
from workers.gang import (
    LABEL,
    NAME,
    ROUND,
    SIZE,
    Gang,
    Verdict,
    decide,
    lease_name,
    member_key,
    parse,
    round_to_join,
)

MAX_CONFLICTS = 20
REASON = 512  # characters of a member's reason in its Lease annotation (all members share 256 KiB of them)


class GangLink:
    """One member's view of its gang's Lease (the init container's side)."""

    def __init__(self, client: Client, namespace: str, gang: Gang, *, pod: str, node: str,
                 failure_hold: float = 120.0, clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.client = client
        self.namespace = namespace
        self.gang = gang
        self.pod = pod
        self.node = node
        self.failure_hold = failure_hold
        self.clock = clock
        self.lease = lease_name(gang.name)
        self.key = member_key(pod)
        self.round = 0

    def join(self) -> int:
        """Create the Lease when it is not there, open the next round when the current one failed long
        enough ago, and record this member as checking; the round it joined."""
        for _ in range(MAX_CONFLICTS):
            doc = ops.read_lease(self.client, self.namespace, self.lease)
            if doc is None:
                annotations = {NAME: self.gang.name, ROUND: "1"}
                if self.gang.size is not None:
                    annotations[SIZE] = str(self.gang.size)
                try:
                    doc = ops.create_lease(self.client, self.namespace, self.lease, annotations=annotations,
                                           labels={LABEL: "faultline"})  # fmt: skip
                except AlreadyExistsError:
                    continue  # another member created it: read theirs
            record = parse(doc)
            wanted = round_to_join(record, now=self.clock(), failure_hold=self.failure_hold)
            if wanted != record.round:
                try:
                    ops.annotate_lease(self.client, self.namespace, self.lease, {ROUND: str(wanted)},
                                       resource_version=record.resource_version)  # fmt: skip
                except ConflictError:
                    continue  # someone wrote meanwhile: decide again on what is there now
            self.round = wanted
            self.write("checking")
            return wanted
        raise ConflictError(
            "patch", f"Lease {self.namespace}/{self.lease}", f"still changing after {MAX_CONFLICTS} tries"
        )

    def write(self, state: Literal["checking", "passed", "failed"], reason: str = "") -> None:
        entry = {"pod": self.pod, "node": self.node, "state": state, "round": self.round,
                 "at": round(self.clock(), 3), "reason": reason[:REASON]}  # fmt: skip
        ops.annotate_lease(self.client, self.namespace, self.lease,
                           {self.key: json.dumps(entry, separators=(",", ":"))})  # fmt: skip

    def verdict(self) -> Verdict:
        doc = ops.read_lease(self.client, self.namespace, self.lease)
        if doc is None:  # deleted under us (by a person): nothing to wait for
            return Verdict("proceed", f"gang {self.gang.name}: its Lease {self.lease} is gone")
        return decide(parse(doc), self.gang, round_=self.round)
