"""What the analyzer's feed source (`sources.feed`) hands on, made from records for the dataflow's tests:
each record as a feed document of its own (its place in the reading: its position >> 16), a read's
documents cut into chunks, then the read's tick."""

from __future__ import annotations

import datetime as dt

from faultline import store
from patterns.cluster import Record
from sources.feed import Doc, Item, handed_on


def document(r: Record) -> store.FeedBatch:
    """A feed document holding `r` as the store holds an event or a fault write."""
    t = dt.datetime.fromtimestamp(r.t, dt.UTC)
    entity = {"type": r.entity_type, "id": r.entity_id}
    common = {
        "node": r.node,
        "code": r.code,
        "component": r.component,
        "fatal": r.fatal,
        "metadata": r.metadata,
    }
    if r.kind == "events":
        events = [{"_id": r.id, "observed_at": t, "entities": [entity], "healthy": r.healthy, **common}]
        return store.FeedBatch(r.position >> 16, t, {"events": events, "faults": []}, r.node)
    fault_id, _, revision = r.id.rpartition("@")
    opened = dt.datetime.fromtimestamp(r.opened, dt.UTC) if r.opened else None
    faults = [{"_id": fault_id, "revision": int(revision), "last_seen": t, "first_seen": opened,
               "entity": entity, "state": r.state, **common}]  # fmt: skip
    return store.FeedBatch(r.position >> 16, t, {"events": [], "faults": faults}, r.node)


def feed_items(records: list[Record], per_read: int = 2, chunks: int = 1) -> list[Item]:
    """Reads of `per_read` records, each cut into at most `chunks` chunks, then its tick."""
    out: list[Item] = []
    watermark = float("-inf")
    ceiling = float("inf")
    for read, start in enumerate(range(0, len(records), per_read)):
        docs: list[Doc] = []
        for r in records[start : start + per_read]:
            docs.append((r.position >> 16, watermark, ceiling, document(r)))
            watermark = max(watermark, r.t)
        out += handed_on(read, docs, chunks, docs[-1][0], watermark, [])
    return out
