"""Which faults the object rules hold open (pure): the object monitor's state, objects in, faults out.

The monitor hands over what its watches deliver (`replace` after a list, `upsert`, `delete`) and asks
`wanted(now, open_faults)` for the faults that should be open now; it writes the difference to the store.
Level-triggered: whatever was missed (a broken watch, a restart) is right again after the next list.

- A rule is read again for an object whenever the object changes; a rule whose predicate or node reads
  `now` also at every `tick` (a periodic re-read of the cached objects, never of the API server).
- `for`: a holding verdict counts once it has held that long, from its `since` (the object's own time of
  the change, where the rule says) or else from when the monitor first saw it hold. A fault already open
  in the store counts at once, so a restarted monitor never resolves and re-raises what it held.
- Objects of one rule (or of several rules of one code) that name the same node and entity share a fault.
- Open faults of a watch that has not listed yet (the monitor just started, the kind is not served or not
  allowed) are kept as they are: nothing is resolved on what the monitor has not seen.
- A rule that fails to evaluate on an object does not hold; `errors` counts it per rule and remembers the
  last message (the monitor logs and exports them).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from faultline.models import Entity
from patterns import cel
from patterns.object_rules import CompiledRule, Verdict, Watch, describe


@dataclass(frozen=True)
class Wanted:
    """A fault the rules hold open now, with the first of the objects behind it."""

    id: str
    rule: CompiledRule
    node: str
    entity: Entity
    message: str
    object: str
    since: dt.datetime


@dataclass(frozen=True)
class _Holding:
    verdict: Verdict
    seen: dt.datetime  # when the monitor first saw this rule hold for this object
    object: str


def object_key(doc: Mapping[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    name = str(meta.get("name", ""))
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


class ObjectFaults:
    def __init__(self, rules: Iterable[CompiledRule]) -> None:
        self.rules: dict[Watch, list[CompiledRule]] = {}
        for rule in rules:
            self.rules.setdefault(rule.watch, []).append(rule)
        self.rule_ids = {r.id for rs in self.rules.values() for r in rs}
        self.objects: dict[Watch, dict[str, cel.Value]] = {w: {} for w in self.rules}
        self.synced: set[Watch] = set()
        self.holding: dict[tuple[str, str], _Holding] = {}  # (rule id, object key) -> its verdict
        self.errors: dict[str, int] = {}
        self.last_error: dict[str, str] = {}

    # -- what the watches deliver -----------------------------------------------------------------------
    def replace(self, watch: Watch, docs: Iterable[Mapping[str, Any]], now: dt.datetime) -> None:
        """A complete list of the watch's objects: those not in it are gone."""
        fresh = {object_key(d): d for d in docs}
        for key in set(self.objects[watch]) - set(fresh):
            self.delete(watch, key)
        for doc in fresh.values():
            self.upsert(watch, doc, now)
        self.synced.add(watch)

    def upsert(self, watch: Watch, doc: Mapping[str, Any], now: dt.datetime) -> None:
        key = object_key(doc)
        value = cel.value(dict(doc))
        self.objects[watch][key] = value
        for rule in self.rules[watch]:
            self._read(rule, key, value, now)

    def delete(self, watch: Watch, key: str) -> None:
        self.objects[watch].pop(key, None)
        for rule in self.rules[watch]:
            self.holding.pop((rule.id, key), None)

    def tick(self, now: dt.datetime) -> None:
        """Read the time-dependent rules again on every cached object."""
        for watch, rules in self.rules.items():
            timed = [r for r in rules if r.uses_now]
            for key, value in self.objects[watch].items() if timed else ():
                for rule in timed:
                    self._read(rule, key, value, now)

    def _read(self, rule: CompiledRule, key: str, value: cel.Value, now: dt.datetime) -> None:
        verdict = rule.evaluate(value, now)
        if verdict.error:
            self.errors[rule.id] = self.errors.get(rule.id, 0) + 1
            self.last_error[rule.id] = f"{describe(value)}: {verdict.error}"
        if not verdict.holds:
            self.holding.pop((rule.id, key), None)
            return
        before = self.holding.get((rule.id, key))
        seen = before.seen if before is not None else now
        self.holding[(rule.id, key)] = _Holding(verdict, seen, describe(value))

    # -- what should be open ------------------------------------------------------------------------------
    def wanted(self, now: dt.datetime, open_faults: Mapping[str, str] | None = None) -> dict[str, Wanted]:
        """The faults to hold open at `now`; `open_faults`: the ids open in the store, each with the rule
        that opened it (an open one counts without waiting for `for`)."""
        open_faults = open_faults or {}
        out: dict[str, Wanted] = {}
        rules = {r.id: r for rs in self.rules.values() for r in rs}
        for (rule_id, _key), held in sorted(self.holding.items(), key=lambda item: item[0]):
            rule = rules[rule_id]
            verdict = held.verdict
            fid = rule.fault_id(verdict)
            since = verdict.since or held.seen
            due = since + dt.timedelta(seconds=rule.for_s or 0)
            if fid in out or (due > now and fid not in open_faults):
                continue
            out[fid] = Wanted(fid, rule, verdict.node, verdict.entity, verdict.message, held.object, since)
        return out

    def unknown(self, open_faults: Mapping[str, str]) -> set[str]:
        """Of the open faults (id -> rule id), those whose rule's watch has not listed yet: left as they
        are, neither held nor resolved."""
        watches = {r.id: w for w, rs in self.rules.items() for r in rs}
        return {fid for fid, rule_id in open_faults.items()
                if rule_id in watches and watches[rule_id] not in self.synced}  # fmt: skip

    def next_due(self, now: dt.datetime) -> dt.datetime | None:
        """The earliest time a holding verdict comes due (the monitor wakes then)."""
        rules = {r.id: r for rs in self.rules.values() for r in rs}
        dues = [
            (h.verdict.since or h.seen) + dt.timedelta(seconds=rules[rid].for_s or 0)
            for (rid, _key), h in self.holding.items()
        ]
        later = [d for d in dues if d > now]
        return min(later) if later else None

    def unsynced(self) -> list[Watch]:
        return [w for w in self.rules if w not in self.synced]
