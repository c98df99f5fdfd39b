"""Compiles loaded packs into the matcher used on the hot path (ARCHITECTURE §4).

Three stages, each cheaper than the next is expensive:

1. `scanner`: one RE2 search for every pattern's prefilter literals, run over whole byte chunks of a
   file (like grep), so the vast majority of lines are never split, decoded or parsed.
2. `re2.Set` over the patterns RE2 can express, run on each candidate message: which rules match.
   RE2 is linear-time, so a hostile line cannot make it backtrack.
3. The rule's own `regex` (with a timeout) only on messages the set confirmed, to extract named groups.

Results are cached per (source, message): floods of one identical message cost a dict look-up.

Origins: a pattern of origin `kernel` (the default) concludes nothing on a line that says it comes from
user space; `match_line` drops those hits and reports the line as untrusted. Record patterns (`record:`)
run only on assembled records (`match_line(..., records=True)`); the others only on single records.
"""

from __future__ import annotations

import fnmatch
import functools
import re as stdre
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import re2
import regex

from faultline.errors import PackError
from faultline.models import Action
from patterns import loader, redos
from patterns.loader import LoadedPattern, PackSet
from patterns.schema import (
    Classification,
    Flapping,
    Pattern,
    SetStep,
    SuppressedBy,
    TableStep,
    Then,
    Threshold,
)
from patterns.templates import Template

MATCH_TIMEOUT = 0.05  # seconds one rule's regex may spend on one message
CACHE_SIZE = 4096  # messages whose results are remembered (floods repeat one message)
CACHE_MAX_MESSAGE = 1024  # longer messages are not cached, so the cache stays under ~20 MB
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
# Raw-byte scanning: one byte is one character, so invalid UTF-8 cannot split a line.
_BYTE_OPTIONS = re2.Options()
_BYTE_OPTIONS.log_errors = False
_BYTE_OPTIONS.encoding = re2.Options.Encoding.LATIN1  # type: ignore[attr-defined]  # missing from the stub
_UNANCHORED = re2._re2.RE2.Anchor.UNANCHORED  # type: ignore[attr-defined]  # the compiled RE2 API


@dataclass(frozen=True, slots=True)
class Hit:
    """One rule's conclusion about one message; time and node are added by the caller."""

    pattern: int
    kind: str
    code: str
    entity_type: str
    entity_id: str
    fatal: bool
    action: str
    component: str
    description: str
    escalate: tuple[int, float, bool, str] | None = None
    amount: int = 1  # what the match counts for in a threshold with `amount` (a rate rule)


@dataclass(frozen=True)
class CompiledClears:
    codes: tuple[str, ...]
    actions: frozenset[str] | None
    scope: str
    same_code: bool = False

    def applies(self, code: str, action: str, clearing_code: str = "") -> bool:
        """Whether a clear whose own rendered code is `clearing_code` resolves a fault (code, action)."""
        if self.actions is not None and action not in self.actions:
            return False
        if self.same_code and code != clearing_code:
            return False
        return any(fnmatch.fnmatchcase(code, glob) for glob in self.codes)


@dataclass(frozen=True)
class Rules:
    boot_grace: float | None
    threshold: Threshold | None
    flapping: Flapping | None
    then: Then | None
    clears: CompiledClears | None
    suppressed_by: SuppressedBy | None


@dataclass(frozen=True)
class _Step:
    fixed: Classification | None
    table: dict[str, Classification] | None
    key: Template | None
    required: bool


class CompiledPattern:
    def __init__(self, loaded: LoadedPattern, index: int, tables: dict[str, dict[str, Classification]]):
        p = loaded.pattern
        self.index = index
        self.id = p.id
        self.file = loaded.file
        self.spec: Pattern = p
        self.kind = p.kind
        self.sources = frozenset(p.sources)
        self.kernel_only = p.origin == "kernel"
        self.record = p.record
        flags = regex.IGNORECASE if p.ignore_case else 0
        self.builtin = loaded.builtin
        self._flags = flags | regex.VERSION0
        known = loader.builtin_facts().get(p.id) if loaded.builtin else None
        if known is None or (known.get("regex"), known.get("ignore_case")) != (p.regex, p.ignore_case):
            known = regex_facts(p.regex, p.ignore_case, loaded)
        if self.builtin and known["groups"] is not None:
            groups = set(known["groups"])
        else:
            groups = self._groups(loaded)
        re2_source = f"(?i){p.regex}" if p.ignore_case else p.regex
        self.re2_source: str | None = re2_source if known["re2"] else None
        self.literals = tuple(p.prefilter) if p.prefilter else tuple(known["literals"])
        # inline (?i) or (?i:...) makes the regex match other cases: so must its literals
        self.literal_ignore_case = p.ignore_case or _has_inline_ignore_case(p.regex)
        if not self.literals:
            raise PackError(
                loaded.file,
                "cannot derive a prefilter literal (>= 3 fixed characters every match contains); "
                "add `prefilter: [...]`",
                p.id,
            )
        self.code = self._template(p.code or p.id, groups, loaded, "code")
        self.entity_type = p.entity.type if p.entity else "NODE"
        self.entity_type_t = (
            self._template(p.entity.type, groups, loaded, "entity.type")
            if p.entity and "{" in p.entity.type
            else None
        )
        self.entity_id = self._template(p.entity.id, groups, loaded, "entity.id") if p.entity else None
        self.entity_fallback = tuple(
            self._template(t, groups, loaded, "entity.fallback")
            for t in (p.entity.fallback if p.entity else [])
        )
        self.message = self._template(p.message, groups, loaded, "message") if p.message else None
        self.steps: list[_Step] = []
        self.tables_used = [s.table for s in p.classify if isinstance(s, TableStep)]
        # descriptions may name groups (`GPC {gpc}`): compiled here, rendered in `conclude`
        self.described: dict[str, Template] = {}
        for step in p.classify:
            rows = [step.set] if isinstance(step, SetStep) else list(tables.get(step.table, {}).values())
            for row in rows:
                if row.description and "{" in row.description and row.description not in self.described:
                    self.described[row.description] = self._template(
                        row.description, groups, loaded, "classify description"
                    )
        for step in p.classify:
            if isinstance(step, SetStep):
                self.steps.append(_Step(step.set, None, None, False))
            elif isinstance(step, TableStep):
                if step.table not in tables:
                    raise PackError(loaded.file, f"classify uses unknown table {step.table!r}", p.id)
                key = self._template(step.key, groups, loaded, "classify.key")
                self.steps.append(_Step(None, tables[step.table], key, step.required))
        clears = (
            CompiledClears(
                tuple(p.clears.codes),
                frozenset(a.value for a in p.clears.actions) if p.clears.actions else None,
                p.clears.scope,
                p.clears.same_code,
            )
            if p.clears
            else None
        )
        self.rules = Rules(p.boot_grace, p.threshold, p.flapping, p.then, clears, p.suppressed_by)
        self.amount = self._amount(p, groups, loaded)
        self.escalate = p.escalate

    def _groups(self, loaded: LoadedPattern) -> set[str]:
        """The regex's group names, compiled now so a bad one fails the load. (A built-in regex is proven
        by the test suite: it is compiled by the slow pure-Python parser of `regex` only when a candidate
        line first needs it, so start-up pays only for the ones a log meets; its groups come from
        `regex_facts`.)"""
        try:
            self.regex = regex.compile(loaded.pattern.regex, self._flags)
        except regex.error as exc:
            raise PackError(loaded.file, f"invalid regex: {exc}", loaded.pattern.id) from exc
        return set(self.regex.groupindex)

    @functools.cached_property
    def regex(self) -> regex.Pattern[str]:
        """The pattern's own regex (set in `__init__` unless built-in; then compiled on first use)."""
        return regex.compile(self.spec.regex, self._flags)

    def _amount(self, p: Pattern, groups: set[str], loaded: LoadedPattern) -> Template | None:
        if p.threshold is None or p.threshold.amount is None:
            return None
        return self._template(p.threshold.amount, groups, loaded, "threshold.amount")

    def _template(self, source: str, groups: set[str], loaded: LoadedPattern, what: str) -> Template:
        try:
            template = Template(source)
        except ValueError as exc:
            raise PackError(loaded.file, f"{what}: {exc}", loaded.pattern.id) from exc
        missing = [f for f in template.fields if f not in groups]
        if missing:
            raise PackError(
                loaded.file, f"{what} uses group {missing[0]!r} that the regex does not define", self.id
            )
        return template

    def conclude(self, groups: dict[str, str | None]) -> Hit | None:
        """Turn a regex match's groups into a Hit, or None when a required table row is missing."""
        code = self.code.render(groups)
        if code is None:
            return None
        entity_id = self.entity_id.render(groups) if self.entity_id else ""
        for fallback in self.entity_fallback if entity_id is None else ():
            entity_id = fallback.render(groups)
            if entity_id is not None:
                break
        if entity_id is None:
            return None
        spec = self.spec
        fatal, action = False, Action.NONE.value
        component, description = spec.component.value, spec.description
        escalate = self.escalate
        ignore = False
        for step in self.steps:
            row = step.fixed
            if step.table is not None and step.key is not None:
                key = step.key.render(groups)
                row = step.table.get(key) if key is not None else None
                if row is None:
                    if step.required:
                        return None
                    continue
            assert row is not None
            fatal = row.fatal if row.fatal is not None else fatal
            action = row.action.value if row.action is not None else action
            component = row.component.value if row.component is not None else component
            if row.description is not None:
                template = self.described.get(row.description)
                rendered = template.render(groups) if template is not None else row.description
                description = rendered if rendered is not None else description
            escalate = row.escalate if row.escalate is not None else escalate
            ignore = row.ignore if row.ignore is not None else ignore
        if ignore:
            return None
        esc = (escalate.count, escalate.within, escalate.fatal, escalate.action.value) if escalate else None
        entity_type = self.entity_type
        if self.entity_type_t is not None:
            entity_type = self.entity_type_t.render(groups) or "NODE"
        amount = 1
        if self.amount is not None:
            # a line is untrusted text: at most 12 ASCII digits (int() refuses over 4300 digits, and the
            # detector counts no more than its threshold anyway)
            text = self.amount.render(groups)
            if text and len(text) <= 12 and text.isascii() and text.isdigit():
                amount = int(text)
        return Hit(
            self.index,
            self.kind,
            code,
            entity_type,
            entity_id or "",
            fatal,
            action,
            component,
            description,
            esc,
            max(amount, 1),
        )


_INLINE_FLAGS = regex.compile(r"\(\?[a-zA-Z]*i[a-zA-Z]*(?:-[a-zA-Z]*)?[:)]")


def regex_facts(source: str, ignore_case: bool, loaded: LoadedPattern | None = None) -> dict[str, Any]:
    """What the compiler needs of a regex besides compiling it: its group names and fixed-text literals
    (from the stdlib's parse; none for `regex`-only syntax) and whether RE2 takes it. A regex whose counted
    repetitions come to too many copies is refused. For the built-in packs these are kept in
    patterns/packs.json (`python -m devtools.builtin_packs`), so a start does not work them out again."""
    if redos.expansion(source) > redos.MAX_EXPANSION:
        raise PackError(
            loaded.file if loaded else "<regex>",
            f"regex repeats too much: its counted repetitions come to over {redos.MAX_EXPANSION} "
            "copies (the regex module compiles each copy); use * or + or smaller counts",
            loaded.pattern.id if loaded else None,
        )
    parsed = _stdlib_parse(source, regex.IGNORECASE if ignore_case else 0)
    try:
        re2.compile(f"(?i){source}" if ignore_case else source, _RE2_OPTIONS)
        takes = True
    except re2.error:
        takes = False
    groups = sorted(parsed.state.groupdict) if parsed is not None else None  # None: compile to know them
    literals = list(_literals(parsed))
    return {"regex": source, "ignore_case": ignore_case, "groups": groups, "literals": literals, "re2": takes}


def _has_inline_ignore_case(source: str) -> bool:
    """The regex turns on ignore-case inline, globally `(?i)` or for a group `(?i:...)` (a conservative
    reading: an escaped look-alike only costs the prefilter some precision)."""
    return _INLINE_FLAGS.search(source) is not None


def _stdlib_parse(source: str, flags: int) -> Any:
    """The stdlib's parse of the regex (its group names and literal runs), or None for `regex`-only
    syntax."""
    try:
        with warnings.catch_warnings():  # "possible nested set" (`[[`): the stdlib's future reading, not ours
            warnings.simplefilter("ignore", FutureWarning)
            return stdre._parser.parse(source, flags & stdre.IGNORECASE)  # type: ignore[attr-defined, unused-ignore]
    except Exception:  # noqa: BLE001 - `regex`-only syntax: the pack must declare `prefilter`
        return None


def _literals(parsed: Any) -> tuple[str, ...]:
    """The longest run of fixed characters that every match must contain, if the stdlib could parse the
    regex."""
    if parsed is None:
        return ()
    best = ""
    run: list[str] = []

    def walk(items: Iterable[Any]) -> None:
        nonlocal best, run
        for op, arg in items:
            name = str(op)
            if name == "LITERAL":
                run.append(chr(arg))
                continue
            if name == "SUBPATTERN":
                walk(arg[-1])
                continue
            if len("".join(run)) > len(best):
                best = "".join(run)
            run = []

    walk(parsed)
    if len("".join(run)) > len(best):
        best = "".join(run)
    return (best,) if len(best) >= 3 else ()


class CompiledPacks:
    """The matcher for one set of loaded packs."""

    def __init__(self, packs: PackSet, *, check_backtracking: bool = True) -> None:
        self.packs = packs
        self.patterns = [CompiledPattern(lp, i, packs.tables) for i, lp in enumerate(packs.patterns.values())]
        if not self.patterns:
            raise PackError(", ".join(packs.files) or "(no packs)", "no patterns loaded")
        if check_backtracking:
            self._probe(p for p in self.patterns if not p.builtin)
        self.horizons = _horizons(self.patterns, packs.tables)
        self.timeouts = 0
        self._cache: dict[tuple[str, str], tuple[Hit, ...]] = {}
        self._kernel_only = [p.kernel_only for p in self.patterns]
        records = [p.record for p in self.patterns if p.record is not None]
        self.record_starts = tuple(sorted({lit for r in records for lit in r.start}))
        self.record_lines = max((r.lines for r in records), default=1)
        self.record_within = max((r.within for r in records), default=0.0)
        self._set = re2.Set.SearchSet(_RE2_OPTIONS)
        self._set_index: list[int] = []
        self._unset: list[CompiledPattern] = []
        for p in self.patterns:
            if p.re2_source is not None and self._set.Add(p.re2_source) >= 0:
                self._set_index.append(p.index)
            else:
                self._unset.append(p)
        self._set.Compile()
        literal_parts = {_byte_literal(lit) for lit in self.record_starts}
        for p in self.patterns:
            for lit in p.literals:
                part = _byte_literal(lit)
                literal_parts.add(b"(?i:" + part + b")" if p.literal_ignore_case else part)
        alternation = b"|".join(sorted(literal_parts))
        self.scanner = re2.compile(alternation, _BYTE_OPTIONS)
        # The same search widened to whole lines, so a match's span is the candidate line itself.
        self._line_scanner = re2.compile(b"[^\n]*(?:" + alternation + b")[^\n]*", _BYTE_OPTIONS)
        self.literals = sorted({lit for p in self.patterns for lit in p.literals} | set(self.record_starts))
        self._record_scanner = (
            re2.compile(b"|".join(_byte_literal(lit) for lit in self.record_starts), _BYTE_OPTIONS)
            if self.record_starts
            else None
        )

    def record_start(self, message: str) -> bool:
        """Whether a record pattern's record could begin with this message."""
        return any(lit in message for lit in self.record_starts)

    def record_start_bytes(self, line: bytes) -> bool:
        return self._record_scanner is not None and self._record_scanner.search(line) is not None

    def candidate_lines(self, data: bytes) -> Iterator[tuple[int, int]]:
        """(start, end) of every line in `data` that holds a prefilter literal, end excluding the newline."""
        raw = getattr(self._line_scanner, "_regexp", None)
        if raw is None:  # the binding changed shape: fall back to its public iterator
            for m in self._line_scanner.finditer(data):
                yield m.start(), m.end()
            return
        # google-re2's finditer wraps every match in Python objects; calling the compiled RE2 directly
        # is the same search without that per-match overhead.
        match, pos, end = raw.Match, 0, len(data)
        while pos < end:
            span = match(_UNANCHORED, data, pos, end)[0]
            if span[0] < 0:
                return
            yield span
            pos = span[1] + 1

    def _probe(self, patterns: Iterable[CompiledPattern]) -> None:
        for p in patterns:
            bad = redos.catastrophic_probe(p.regex, _positive_lines(p.spec))
            if bad is not None:
                raise PackError(p.file, f"regex backtracks catastrophically (timed out on probe {bad})", p.id)

    def prefilter(self, message: str) -> bool:
        return self.scanner.search(message.encode("utf-8", "replace")) is not None

    def candidates(self, message: str) -> list[CompiledPattern]:
        matched = cast("list[int] | None", self._set.Match(message)) or []  # the stub says bool
        found = [self.patterns[self._set_index[i]] for i in matched]
        folded = message.casefold()
        for p in self._unset:
            if p.literal_ignore_case:
                if any(lit.casefold() in folded for lit in p.literals):
                    found.append(p)
            elif any(lit in message for lit in p.literals):
                found.append(p)
        return found

    def match_line(
        self, source: str, message: str, kernel: bool = True, *, records: bool = False
    ) -> tuple[tuple[Hit, ...], bool]:
        """`match`, less the conclusions of kernel-origin patterns when the line is not the kernel's;
        the flag says some were dropped (an untrusted kernel-looking line)."""
        hits = self.match(source, message, records=records)
        if kernel or not hits:
            return hits, False
        kept = tuple(h for h in hits if not self._kernel_only[h.pattern])
        return kept, len(kept) != len(hits)

    def match(self, source: str, message: str, *, records: bool = False) -> tuple[Hit, ...]:
        """Every rule's conclusion about one message from `source` (cached): the single-record rules,
        or with `records` the rules that match assembled multi-line records."""
        key = (source if not records else source + "\x00record", message)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        hits: list[Hit] = []
        for p in self.candidates(message):
            if source not in p.sources or (p.record is not None) != records:
                continue
            groups = self.extract(p, message)
            if groups is not None:
                hit = p.conclude(groups)
                if hit is not None:
                    hits.append(hit)
        result = tuple(hits)
        if len(message) <= CACHE_MAX_MESSAGE:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            self._cache[key] = result
        return result

    def extract(self, p: CompiledPattern, message: str) -> dict[str, str | None] | None:
        try:
            m = p.regex.search(message, timeout=MATCH_TIMEOUT)
        except TimeoutError:
            self.timeouts += 1
            return None
        return m.groupdict() if m else None


def _horizons(patterns: list[CompiledPattern], tables: dict[str, dict[str, Classification]]) -> list[float]:
    """Per pattern, how far back its faults' timestamps can matter to a window rule (seconds)."""
    suppress = max((p.rules.suppressed_by.within for p in patterns if p.rules.suppressed_by), default=0.0)
    out = []
    for p in patterns:
        r = p.rules
        windows = [suppress, r.threshold.within if r.threshold else 0.0, r.then.within if r.then else 0.0]
        windows.append(p.escalate.within if p.escalate else 0.0)
        windows += [row.escalate.within for t in p.tables_used for row in tables[t].values() if row.escalate]
        out.append(max(windows))
    return out


def verify_builtin(compiled: CompiledPacks) -> None:
    """What loading takes on trust for the built-in patterns, checked: each regex compiles with `regex`,
    names the groups the stdlib's parse gave the templates, and does not backtrack catastrophically
    (`faultline patterns lint` and `test`, and the test suite)."""
    for p in compiled.patterns:
        if not p.builtin:
            continue
        try:
            groups = set(p.regex.groupindex)
        except regex.error as exc:
            raise PackError(p.file, f"invalid regex: {exc}", p.id) from exc
        parsed = _stdlib_parse(p.spec.regex, p._flags & regex.IGNORECASE)
        if parsed is None or set(parsed.state.groupdict) != groups:
            raise PackError(p.file, "the stdlib and `regex` read the regex's groups differently", p.id)
    compiled._probe(p for p in compiled.patterns if p.builtin)


def _byte_literal(literal: str) -> bytes:
    """A literal as a Latin-1 RE2 pattern matching its UTF-8 bytes one by one."""
    return b"".join(b"\\x%02x" % b if not chr(b).isalnum() else bytes([b]) for b in literal.encode("utf-8"))


def _positive_lines(p: Pattern) -> list[str]:
    return [e if isinstance(e, str) else e.line for e in p.examples.match]


def compile_packs(packs: PackSet, *, check_examples: bool = True) -> CompiledPacks:
    """Compile and, by default, insist that every user pattern's examples behave (the first failure
    raises). The built-in patterns' examples are run by the test suite and by `faultline patterns test`."""
    compiled = CompiledPacks(packs)
    if check_examples:
        from patterns import examples  # noqa: PLC0415 - examples imports this module

        failures = examples.run(compiled, builtin=False)
        if failures:
            first = failures[0]
            raise PackError(first.file, first.reason, first.pattern_id)
    return compiled
