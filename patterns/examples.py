"""Runs every pattern's own examples: positive lines must match (with the expected fields) and be
caught by the prefilter; negative lines must not match.  Used at load and by `faultline patterns test`.
"""

from __future__ import annotations

from dataclasses import dataclass

from patterns.compiler import CompiledPacks, CompiledPattern, Hit

_HIT_FIELDS = {"code", "fatal", "action", "component", "description", "kind"}


@dataclass(frozen=True)
class Failure:
    file: str
    pattern_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: pattern {self.pattern_id!r}: {self.reason}"


def _field(hit: Hit, name: str) -> object:
    if name == "entity":
        return {"type": hit.entity_type, "id": hit.entity_id}
    if name == "entity_id":
        return hit.entity_id
    return getattr(hit, name)


def reclassified_by(compiled: CompiledPacks, p: CompiledPattern) -> list[str]:
    """Files other than the pattern's own that changed rows of the tables it classifies with."""
    files = compiled.packs.table_files
    return sorted({f for t in p.tables_used for f in files.get(t, []) if f != p.file})


def check_pattern(compiled: CompiledPacks, p: CompiledPattern) -> list[Failure]:
    """Positive examples must match (and, unless another pack re-classified the pattern's tables, give
    the expected fields); negative examples must not match."""
    failures: list[Failure] = []
    check_fields = not reclassified_by(compiled, p)

    def fail(reason: str) -> None:
        failures.append(Failure(p.file, p.id, reason))

    for example in p.spec.examples.match:
        line, expect = (example, {}) if isinstance(example, str) else (example.line, example.expect)
        if compiled.scanner.search(line.encode("utf-8")) is None:
            fail(f"prefilter {list(p.literals)} does not catch example {line!r}")
            continue
        if p not in compiled.candidates(line):
            fail(f"example does not match the regex: {line!r}")
            continue
        groups = compiled.extract(p, line)
        hit = p.conclude(groups) if groups is not None else None
        if hit is None:
            fail(f"example does not match the regex: {line!r}")
            continue
        for name, want in expect.items() if check_fields else ():
            if name.startswith("group."):
                got: object = (groups or {}).get(name[6:])
            elif name in _HIT_FIELDS or name in ("entity", "entity_id"):
                got = _field(hit, name)
            else:
                fail(f"example expects unknown field {name!r} (use code, entity, fatal, action, ...)")
                continue
            if got != want:
                fail(f"example {line!r}: expected {name}={want!r}, got {got!r}")
        if hit.kind != p.kind:
            fail(f"example {line!r} concluded kind {hit.kind!r}")
    for line in p.spec.examples.no_match:
        groups = compiled.extract(p, line) if p in compiled.candidates(line) else None
        if groups is not None and p.conclude(groups) is not None:
            fail(f"negative example matches: {line!r}")
    return failures


def run(compiled: CompiledPacks, *, builtin: bool = True) -> list[Failure]:
    """Every pattern's examples (without `builtin`, only those of user packs)."""
    failures: list[Failure] = []
    for p in compiled.patterns:
        if p.builtin and not builtin:
            continue
        failures.extend(check_pattern(compiled, p))
    return failures
