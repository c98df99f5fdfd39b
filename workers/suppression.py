"""Which of a node's open faults another of its faults suppresses (pure: the quarantine worker's filter).

A cluster pattern's derived fault may say that faults of some codes on its nodes are not the hardware's
(`fault.suppresses` in the pack; the built-in `workload-app-xid`: the same application XID on several
nodes of one job is the job's bug). The analyzer writes it with `metadata.suppresses` (comma-separated
code globs) and `metadata.suppress_for` (seconds). While it is open, a fault of such a code on the same
node whose last sighting falls within `suppress_for` before the derived fault's first record and after
its last one calls for no quarantine: the node agent's escalation of a repeated application XID (its
`escalate` rows: fatal, COMPONENT_RESET) is the job failing again, not the GPU. The fault itself stays as
the agent wrote it (one writer per fault); it is only left out of the quarantine rules' input, so a node
quarantined by it alone is released when the derived fault comes, and a burst after the suppression's
time escalates as before. A derived fault suppresses nothing of its own kind (no chains).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Iterable, Mapping
from typing import Protocol

SUPPRESSES = "suppresses"  # metadata keys the analyzer writes (`patterns.cluster.Derived.fault`)
SUPPRESS_FOR = "suppress_for"


class FaultView(Protocol):
    """What the filter reads of a stored fault (`faultline.store.FaultRecord`)."""

    @property
    def id(self) -> str: ...
    @property
    def code(self) -> str: ...
    @property
    def first_seen(self) -> dt.datetime: ...
    @property
    def last_seen(self) -> dt.datetime: ...
    @property
    def metadata(self) -> Mapping[str, str]: ...


def suppressed(open_faults: Iterable[FaultView]) -> dict[str, str]:
    """Of one node's open faults, those another suppresses: {fault id: the suppressing fault's id}."""
    faults = list(open_faults)
    rules = []
    for f in faults:
        codes = [c.strip().upper() for c in f.metadata.get(SUPPRESSES, "").split(",") if c.strip()]
        if not codes:
            continue
        try:
            margin = dt.timedelta(seconds=float(f.metadata.get(SUPPRESS_FOR, "0")))
        except ValueError:
            continue  # not written by the analyzer: suppresses nothing
        rules.append((f.id, codes, f.first_seen - margin, f.last_seen + margin))
    out: dict[str, str] = {}
    for f in faults:
        if SUPPRESSES in f.metadata:
            continue
        for by, codes, start, end in rules:
            if start <= f.last_seen <= end and any(fnmatch.fnmatchcase(f.code.upper(), c) for c in codes):
                out[f.id] = by
                break
    return out
