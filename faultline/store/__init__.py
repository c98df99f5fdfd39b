"""The MongoDB store (ARCHITECTURE §5): the only package that imports pymongo, and the owner of every
persisted shape. Callers write `from faultline import store` and use `store.connect(...)`, the
`store.Store` operations and the typed documents (`store.NodeHold`, `store.Drain`, `store.Repair`, ...);
no other module sees a collection.

Collections and their modules:
- `health_events`, `faults`, `queue` (`faults`): events by deterministic id; one fault per key, written
  by revision; the fault-level stages' work items (`quarantine/<fault key>`).
- `leases` (`claims`): numbered lease documents, inserted to claim, close or take back a work item.
- `nodes` (`holds`): what faultline holds on each node (`NodeHold`), dry-run records, the breaker.
- `drains` (`drains`): one per node, for its current quarantine episode (`Drain`).
- `gpu_pods` (`gpu_pods`): per node, which pods use which GPU, as its agent read it (`GpuPods`).
- `repairs` (`repairs`): one per quarantine episode that needs repair, with its rounds (`Repair`).
- `feed`, `feed_heads` (`feed`): every node's new events and fault changes, a gap-free numbered
  sequence per writer (its head in `feed_heads`), for the cluster analyzer (`record_batch` writes them,
  `feed_after` reads them, merged).
- `analyzer` (`analyzer`): the cluster analyzer's checkpoints, one per partition of its windows; its
  lease is the work item `analyzer/cluster` in `queue`.
- `gpus`, `episodes` (`fleet`): each GPU's identity as its agent read it (`GpuIdentity`), and each
  quarantine episode from cordon to release (`Episode`): what reports and RMA bundles read.
- `rma`, `bug_reports` (`rma`): the evidence bundle of each repair round that handed a node to a person or
  replaced it, and the `nvidia-bug-report` outputs the repair Jobs collected on the nodes.
- `exports` (`exports`): the exporter's position per sink (what it handled, up to when).
- `maintenance` (`maintenance`): Azure nodes' Scheduled Events, relayed by their agents for the cloud
  maintenance monitor, and the early starts it asks for (`ScheduledEvents`).

Hand-over between workers, through typed fields (`documents`) and named operations:
- quarantine -> drainer: `record_hold` makes a `NodeHold` with `quarantined`, `owned.cordoned` and the
  episode `quarantined_at`; the drainer's resync lists `held_nodes()` and calls `open_drain`.
- drainer -> remediation: `finish_drain(node, "drained", ...)`; remediation's resync reads
  `drained_episodes()` and calls `open_repair` (its `remediation` stage pending). A partial drain
  (`Drain.scope == "gpus"`) is widened to the whole node by remediation (`widen_drain`) before any
  repair but a reset of the drained GPUs.
- node agent -> drainer: `record_gpu_pods` (which pods use which GPU, read from the kubelet after the
  agent saw the episode's `NodeHold.quarantined_at`); the drainer reads `gpu_pods_of(node)`.
- remediation -> janitor: completing a claim with `store.Completion(then=store.HandOver.TO_JANITOR)`
  makes the janitor's stage pending in the same write; the janitor gives a round that failed back with
  `HandOver.TO_REMEDIATION`. Workers name no field: a hand-over, a back-off (`Completion`) and what a
  held claim's look found (`RoundLook`, `record_look`) are typed values the store turns into its update.
- quarantine reads `repair_in_progress(node)` (the janitor's stage pending or claimed) before release.
- node agent <-> maintenance monitor: `record_scheduled_events` (what only an Azure node can read);
  `request_start` once the node is drained, `record_started` once the agent posted the StartRequests.
- a person's RemediationRequest -> janitor: the janitor's adoption pass calls `adopt_request` (a
  `Repair` with `user` set and its janitor stage pending), then carries it out like any other.
- janitor -> node agent: `record_step_verified` marks a round's step done (reset Job succeeded, node
  back); the agent reads `repairs_to_confirm(node)` while the janitor validates that round.

Stages (`Stage`), their states (`State`) and the collections of work documents (`Work`) are enums
whose values are the strings stored (documents written before them read alike).

Work is taken by claims (`claims`): each work document carries a `StageStatus` per stage (`state`,
`attempts`, `seq`, `lease_owner`, `lease_until`, `updated_at`, `error`, `retry_after`). A failure gives
the item back `pending` with a `retry_after` (capped exponential back-off, `backoff.retry_delay`), or
`parked` with its reason once permanent or out of attempts; `parked()` lists them.

Time: aware UTC datetimes end to end (the client decodes dates as aware UTC, the clock is cut to
milliseconds). Portability: only features MongoDB >= 6, FerretDB 1.x and DocumentDB share: no
transactions, TTL indexes, change streams, update pipelines, positional operators or `$lookup`, and
equality filters on the hot path (FerretDB evaluates other filters after fetching every document).
"""

from faultline.store.analyzer import ANALYZER_ITEM
from faultline.store.backoff import retry_delay
from faultline.store.base import STAGES, Clock, Stage, State, Work, utc, utcnow
from faultline.store.claims import CLAIM_SCAN, Claim, Completion, HandOver
from faultline.store.connection import Store, connect, unreachable_is_transient
from faultline.store.documents import (
    Breaker,
    Drain,
    DryRun,
    Episode,
    FaultRecord,
    GpuAssignment,
    GpuIdentity,
    GpuPods,
    Lease,
    NodeHold,
    Owned,
    Parked,
    PodRecord,
    Repair,
    RepairNotice,
    RepairRound,
    ScheduledEvent,
    ScheduledEvents,
    StageStatus,
    UserRequest,
    WorkItem,
)
from faultline.store.drains import DRAINED
from faultline.store.faults import fault_doc
from faultline.store.feed import FeedBatch, FeedRead, Position, position_doc, position_from
from faultline.store.holds import BREAKER_ID
from faultline.store.maintenance import MAINTENANCE_PATTERN
from faultline.store.repairs import RepairInFlight, RoundLook, episode_label, repair_key, user_repair_key

__all__ = [
    "ANALYZER_ITEM",
    "BREAKER_ID",
    "CLAIM_SCAN",
    "DRAINED",
    "MAINTENANCE_PATTERN",
    "STAGES",
    "Breaker",
    "Claim",
    "Clock",
    "Completion",
    "Drain",
    "DryRun",
    "Episode",
    "FaultRecord",
    "FeedBatch",
    "FeedRead",
    "GpuAssignment",
    "GpuIdentity",
    "GpuPods",
    "HandOver",
    "Lease",
    "NodeHold",
    "Owned",
    "Parked",
    "PodRecord",
    "Position",
    "Repair",
    "RepairInFlight",
    "RepairNotice",
    "RepairRound",
    "RoundLook",
    "ScheduledEvent",
    "ScheduledEvents",
    "Stage",
    "StageStatus",
    "State",
    "Store",
    "UserRequest",
    "Work",
    "WorkItem",
    "connect",
    "episode_label",
    "fault_doc",
    "position_doc",
    "position_from",
    "repair_key",
    "retry_delay",
    "unreachable_is_transient",
    "user_repair_key",
    "utc",
    "utcnow",
]  # fmt: skip
