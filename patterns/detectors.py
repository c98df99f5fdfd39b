"""Per-node detection state: turns timed hits into deduplicated faults (pure logic, no I/O).

`NodeDetector.observe(ts, hit, message)` applies, in this order: boot markers, boot grace, cancellation
(clear patterns), cross-code suppression, count-in-window thresholds, deduplication into one fault per
(entity, code) with a count, escalation (count >= N in T), A-then-B sequences and flapping (down/up
cycles).  Time is always the event time passed in, never the wall clock.

Windows keep a bounded, sorted list of the latest timestamps per fault, so memory stays flat however
long a flood lasts, and a moderately out-of-order event still lands in the right window.
"""

from __future__ import annotations

import bisect
import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import Any

from faultline.models import Action, Component, Entity, Fault, FaultState, fault_id, utc_from_epoch
from patterns.compiler import CompiledPacks, Hit
from patterns.schema import SuppressedBy

RECENT_CAP = 128  # timestamps kept per fault for window rules
FAULT_MESSAGE = 512  # characters of a fault's message (its latest matching line) in its record
BOOT_JITTER = 5.0  # boot times derived from (wall clock - uptime) that differ by less are one boot
_SEVERITY = {a.value: i for i, a in enumerate(Action)}

FaultKey = tuple[str, str, str]  # (entity type, entity id, code)


@dataclass(slots=True)
class OpenFault:
    pattern: int
    code: str
    entity_type: str
    entity_id: str
    component: str
    description: str
    fatal: bool
    action: str
    count: int
    first_seen: float
    last_seen: float
    message: str
    resolved_at: float | None = None
    escalated: bool = False
    recent: list[float] = field(default_factory=list)
    cycles: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Counters:
    hits: int = 0
    boot_grace: int = 0
    suppressed: int = 0
    below_threshold: int = 0
    cleared: int = 0


def _remember(times: list[float], ts: float, cap: int = RECENT_CAP) -> int:
    """Insert `ts` in the sorted, capped list; return its index (the usual in-order case is an append)."""
    if not times or ts >= times[-1]:
        times.append(ts)
        index = len(times) - 1
    else:
        index = bisect.bisect_right(times, ts)
        times.insert(index, ts)
    if len(times) > cap:
        drop = len(times) - cap
        del times[:drop]
        index -= drop
    return index


def _window(times: list[float], index: int, count: int, within: float) -> int:
    """Start index of a window of `within` seconds that holds times[index] and `count` of the sorted
    timestamps, or -1 when there is none."""
    if index < 0:
        return -1
    for j in range(max(0, index - count + 1), min(index, len(times) - count) + 1):
        if times[j + count - 1] - times[j] <= within:
            return j
    return -1


def _reached(times: list[float], index: int, count: int, within: float) -> bool:
    return _window(times, index, count, within) >= 0


def _near(times: list[float], ts: float, within: float, *, before_only: bool = False) -> bool:
    i = bisect.bisect_left(times, ts - within)
    if i >= len(times):
        return False
    return times[i] <= ts if before_only else times[i] <= ts + within


class NodeDetector:
    """All detection state of one node."""

    def __init__(self, node: str, compiled: CompiledPacks) -> None:
        self.node = node
        self.compiled = compiled
        self.faults: dict[FaultKey, OpenFault] = {}
        self.by_entity: dict[tuple[str, str], dict[str, OpenFault]] = {}
        self.pending: dict[FaultKey, list[float]] = {}
        self.boots: list[float] = []
        self.counters = Counters()
        self._roles: dict[str, tuple[bool, bool]] = {}

    # -- entry point -------------------------------------------------------------------------------
    def observe(self, ts: float, hit: Hit, message: str, boot: float | None = None) -> None:
        self.counters.hits += 1
        if boot is not None:
            self._note_boot(boot)
        pattern = self.compiled.patterns[hit.pattern]
        rules = pattern.rules
        if hit.kind == "boot":
            self._note_boot(ts)
            if rules.clears is not None:
                self._clear(ts, hit, rules.clears.scope)
            return
        if rules.boot_grace is not None and self._in_boot_grace(ts, rules.boot_grace):
            self.counters.boot_grace += 1
            return
        if hit.kind == "clear":
            self._clear(ts, hit, rules.clears.scope if rules.clears else "entity")
            return
        if rules.suppressed_by is not None and self._suppressed(ts, hit, rules.suppressed_by):
            self.counters.suppressed += 1
            return
        key = (hit.entity_type, hit.entity_id, hit.code)
        fault = self.faults.get(key)
        if fault is None and rules.threshold is not None:
            times = self.pending.setdefault(key, [])
            need = rules.threshold.count
            for _ in range(min(hit.amount, need) - 1):  # a rate rule: the match counts its amount
                _remember(times, ts, max(RECENT_CAP, need))
            at = _remember(times, ts, max(RECENT_CAP, need))
            start = _window(times, at, need, rules.threshold.within)
            if start < 0:
                self.counters.below_threshold += 1
                return
            del self.pending[key]
            # these now belong to the fault (a rate rule counted fewer matches than units)
            self.counters.below_threshold = max(0, self.counters.below_threshold - (need - 1))
            window = times[start : start + need]
            window.remove(ts)  # the current hit is counted below, like any other
            fault = self._open(key, hit, window[0] if window else ts, message)
            fault.count = need - 1
            fault.recent = window
        elif fault is None:
            fault = self._open(key, hit, ts, message)
        at = self._count(fault, ts, message, hit)
        if hit.escalate is not None and not fault.escalated:
            self._escalate(fault, hit.escalate, at)
        then_target, suppressor = self._code_roles(hit.code)
        if then_target:
            self._sequences(ts, hit, message)
        if suppressor:
            self._supersede(ts, hit)

    # -- helpers -----------------------------------------------------------------------------------
    def _open(self, key: FaultKey, hit: Hit, ts: float, message: str) -> OpenFault:
        fault = OpenFault(
            hit.pattern, hit.code, hit.entity_type, hit.entity_id, hit.component, hit.description,
            hit.fatal, hit.action, 0, ts, ts, message,
        )  # fmt: skip
        self._register(key, fault)
        return fault

    def _register(self, key: FaultKey, fault: OpenFault) -> None:
        self.faults[key] = fault
        self.by_entity.setdefault((key[0], key[1]), {})[key[2]] = fault

    def _entity_faults(self, entity_type: str, entity_id: str) -> list[OpenFault]:
        return list(self.by_entity.get((entity_type, entity_id), {}).values())

    def _code_roles(self, code: str) -> tuple[bool, bool]:
        """(can this code complete an A-then-B rule, can it suppress another pattern's faults), cached."""
        roles = self._roles.get(code)
        if roles is None:
            rules = [p.rules for p in self.compiled.patterns]
            roles = (
                any(
                    r.then is not None and any(fnmatch.fnmatchcase(code, c) for c in r.then.codes)
                    for r in rules
                ),
                any(
                    r.suppressed_by is not None
                    and any(fnmatch.fnmatchcase(code, c) for c in r.suppressed_by.codes)
                    for r in rules
                ),
            )
            self._roles[code] = roles
        return roles

    def _count(self, fault: OpenFault, ts: float, message: str, hit: Hit) -> int:
        fault.count += 1
        fault.first_seen = min(fault.first_seen, ts)
        if ts >= fault.last_seen:
            fault.last_seen = ts
            fault.message = message
        if fault.resolved_at is not None and ts > fault.resolved_at:
            fault.resolved_at = None  # a new occurrence after the fault was cleared reopens it
        if hit.fatal and not fault.fatal:
            fault.fatal = True
        if _SEVERITY[hit.action] > _SEVERITY[fault.action]:
            fault.action = hit.action
        at = _remember(fault.recent, ts)
        # keep only what a window rule can still use: memory stays flat however long a flood lasts
        cut = bisect.bisect_left(fault.recent, fault.last_seen - self.compiled.horizons[fault.pattern])
        if cut:
            del fault.recent[:cut]
        return at - cut

    def _escalate(self, fault: OpenFault, escalate: tuple[int, float, bool, str], at: int) -> None:
        count, within, fatal, action = escalate
        if _reached(fault.recent, at, count, within):
            fault.escalated = True
            fault.fatal = fault.fatal or fatal
            if _SEVERITY[action] > _SEVERITY[fault.action]:
                fault.action = action
            fault.description = f"{fault.description} (escalated: {count} in {within:g}s)"

    def _note_boot(self, ts: float) -> None:
        i = bisect.bisect_left(self.boots, ts - BOOT_JITTER)
        if i < len(self.boots) and abs(self.boots[i] - ts) <= BOOT_JITTER:
            return  # the same boot seen again: every dmesg line carries it, give or take a second
        bisect.insort(self.boots, ts)

    def _in_boot_grace(self, ts: float, grace: float) -> bool:
        i = bisect.bisect_right(self.boots, ts)
        return i > 0 and ts - self.boots[i - 1] < grace

    def _clear(self, ts: float, hit: Hit, scope: str) -> None:
        clears = self.compiled.patterns[hit.pattern].rules.clears
        if clears is None:
            return
        targets = (
            self._entity_faults(hit.entity_type, hit.entity_id)
            if scope == "entity"
            else list(self.faults.values())
        )
        for fault in targets:
            if fault.resolved_at is not None or fault.last_seen > ts:
                continue
            if not clears.applies(fault.code, fault.action, hit.code):
                continue
            fault.resolved_at = ts
            self.counters.cleared += 1
            flapping = self.compiled.patterns[fault.pattern].rules.flapping
            if flapping is not None:
                at = _remember(fault.cycles, ts, max(RECENT_CAP, flapping.count))
                if _reached(fault.cycles, at, flapping.count, flapping.within):
                    self._derived(
                        ts, fault, flapping.code, flapping.fatal, flapping.action.value,
                        flapping.description or f"{fault.code} flapping", fault.message,
                    )  # fmt: skip

    def _derived(
        self, ts: float, origin: OpenFault | Hit, code: str, fatal: bool, action: str, description: str,
        message: str,
    ) -> None:  # fmt: skip
        key = (origin.entity_type, origin.entity_id, code)
        fault = self.faults.get(key)
        if fault is None:
            fault = OpenFault(
                origin.pattern, code, origin.entity_type, origin.entity_id, origin.component, description,
                fatal, action, 0, ts, ts, message,
            )  # fmt: skip
            self._register(key, fault)
        fault.count += 1
        fault.first_seen = min(fault.first_seen, ts)
        fault.last_seen = max(fault.last_seen, ts)
        if fault.resolved_at is not None and ts > fault.resolved_at:
            fault.resolved_at = None

    def _sequences(self, ts: float, hit: Hit, message: str) -> None:
        for first in self._entity_faults(hit.entity_type, hit.entity_id):
            then = self.compiled.patterns[first.pattern].rules.then
            if then is None:
                continue
            if first.code == hit.code or not any(fnmatch.fnmatchcase(hit.code, c) for c in then.codes):
                continue
            if not any(fnmatch.fnmatchcase(first.code, c) for c in then.first):
                continue
            if _near(first.recent, ts, then.within, before_only=True):
                self._derived(
                    ts, hit, then.code, then.fatal, then.action.value,
                    then.description or f"{first.code} then {hit.code}", message,
                )  # fmt: skip
                return

    def _suppressed(self, ts: float, hit: Hit, rule: SuppressedBy) -> bool:
        for fault in self._entity_faults(hit.entity_type, hit.entity_id):
            if any(fnmatch.fnmatchcase(fault.code, c) for c in rule.codes) and _near(
                fault.recent, ts, rule.within
            ):
                return True
        return False

    def _supersede(self, ts: float, hit: Hit) -> None:
        """This hit suppresses faults opened just before it whose pattern says `suppressed_by` it."""
        doomed = []
        for fault in self._entity_faults(hit.entity_type, hit.entity_id):
            rule = self.compiled.patterns[fault.pattern].rules.suppressed_by
            if rule is None or fault.code == hit.code:
                continue
            if fault.first_seen >= ts - rule.within and any(
                fnmatch.fnmatchcase(hit.code, c) for c in rule.codes
            ):
                doomed.append(fault)
        for fault in doomed:
            del self.faults[(fault.entity_type, fault.entity_id, fault.code)]
            del self.by_entity[(fault.entity_type, fault.entity_id)][fault.code]
            self.counters.suppressed += fault.count

    # -- persistence -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Plain data (patterns named by id, not by index) from which `restore` rebuilds this detector,
        for the dataflow's recovery snapshots."""
        faults = []
        for f in self.faults.values():
            record = dataclasses.asdict(f)
            record["pattern"] = self.compiled.patterns[f.pattern].id
            faults.append(record)
        pending = [[*key, list(times)] for key, times in self.pending.items()]
        return {"faults": faults, "pending": pending, "boots": list(self.boots)}

    @classmethod
    def restore(cls, node: str, compiled: CompiledPacks, state: dict[str, Any]) -> NodeDetector:
        """A detector continuing from `state`; faults of patterns no longer loaded are dropped (their
        rule was removed, so nothing should keep them open)."""
        detector = cls(node, compiled)
        index = {p.id: i for i, p in enumerate(compiled.patterns)}
        for record in state.get("faults", []):
            pattern = index.get(record["pattern"])
            if pattern is None:
                continue
            fault = OpenFault(**{**record, "pattern": pattern})
            key = (fault.entity_type, fault.entity_id, fault.code)
            detector.faults[key] = fault
            detector.by_entity.setdefault((key[0], key[1]), {})[key[2]] = fault
        for entity_type, entity_id, code, times in state.get("pending", []):
            detector.pending[(entity_type, entity_id, code)] = list(times)
        detector.boots = sorted(state.get("boots", []))
        return detector

    # -- output ------------------------------------------------------------------------------------
    def snapshot_faults(self) -> list[Fault]:
        out = []
        for f in self.faults.values():
            out.append(
                Fault(
                    id=fault_id(self.node, f.entity_type, f.entity_id, f.code),
                    node=self.node,
                    entity=Entity(type=f.entity_type, id=f.entity_id),
                    code=f.code,
                    component=Component(f.component),
                    count=f.count,
                    first_seen=utc_from_epoch(f.first_seen),
                    last_seen=utc_from_epoch(f.last_seen),
                    fatal=f.fatal,
                    action=Action(f.action),
                    state=FaultState.RESOLVED if f.resolved_at is not None else FaultState.OPEN,
                    resolved_at=utc_from_epoch(f.resolved_at) if f.resolved_at is not None else None,
                    description=f.description,
                    message=f.message[:FAULT_MESSAGE],
                    pattern=self.compiled.patterns[f.pattern].id,
                )
            )
        return out
