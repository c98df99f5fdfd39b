"""Fuzzing the pattern-pack loader and compiler (`patterns.loader`, `patterns.compiler`), the template
language (`patterns.templates`) and the compiled matcher on the hot path.

A pack is user input (`--pack DIR`): whatever its text, loading and compiling it ends in compiled packs
or in a PackError that names the file, the pattern where the problem is inside one, and the reason;
nothing else escapes and nothing hangs (every regex search runs with the `regex` module's timeout, and
the load-time backtracking lint runs with a short one). Packs are made from the built-in packs, one
pattern each, mutated as text and as YAML structure; regexes from the pieces of regex syntax."""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from faultline.errors import PackError
from faultline.models import Action, Component
from patterns import compiler, loader, schema, templates
from tests.unit.fuzzing import NASTY, any_text, example_messages, fuzz, mutated_doc, near


@cache
def one_pattern_packs() -> tuple[dict[str, Any], ...]:
    """Every built-in pattern as a pack of its own, with the tables it classifies by."""
    out = []
    for path in sorted(loader.BUILTIN_DIR.glob("*.yaml")):
        pack = yaml.safe_load(path.read_text(encoding="utf-8"))
        tables = pack.get("tables", {})
        for pattern in pack["patterns"]:
            if pattern.get("scope") == "cluster":  # the analyzer's (patterns.cluster): this loader skips them
                continue
            used = {s["table"] for s in pattern.get("classify", []) if "table" in s}
            # a big table (the XID catalogue) cut to a few rows: the packs stay small and quick to compile
            cut = {t: dict(list(tables[t].items())[:6]) for t in used}
            out.append({"pack": pack["pack"], "tables": cut, "patterns": [pattern]})
    return tuple(out)


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(pack: object) -> str:
    return yaml.dump(pack, Dumper=_DUMPER, allow_unicode=True, sort_keys=False, width=1 << 16)


@cache
def pack_texts() -> tuple[str, ...]:
    return tuple(dump(p) for p in one_pattern_packs())


@pytest.fixture(scope="module")
def pack_file() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name) / "fuzzed.yaml"


def load(path: Path, text: str) -> compiler.CompiledPacks | PackError:
    """The pack compiled (its examples checked), or the PackError that refused it."""
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        return compiler.compile_packs(loader.load([path], builtin=False))
    except PackError as exc:
        return exc


def check_refusal(exc: PackError, path: Path) -> None:
    assert exc.file == str(path), exc
    assert str(exc).startswith(f"{path}: ") and exc.reason.strip(), exc
    if exc.pattern_id is not None:
        assert str(exc).startswith(f"{path}: pattern {exc.pattern_id!r}: ")


def check_hits(hits: tuple[compiler.Hit, ...], compiled: compiler.CompiledPacks) -> None:
    for hit in hits:
        assert 0 <= hit.pattern < len(compiled.patterns)
        assert hit.kind in ("fault", "clear", "boot")
        assert isinstance(hit.code, str) and isinstance(hit.entity_id, str) and hit.entity_type
        assert hit.action in Action.__members__ and hit.component in Component.__members__
        assert isinstance(hit.fatal, bool)


def exercise(compiled: compiler.CompiledPacks, lines: list[str]) -> None:
    """Match lines from every source, as the kernel's and as user space's, and as records."""
    for line in lines:
        for source in ("syslog", "journal", "kmsg", "grpc", "dcgm"):
            hits, _ = compiled.match_line(source, line, kernel=False)
            check_hits(hits, compiled)
            check_hits(compiled.match(source, line, records=True), compiled)
        check_hits(compiled.match("syslog", line), compiled)
        compiled.prefilter(line)
        compiled.record_start(line)
        data = line.encode("utf-8", "surrogatepass")
        for start, end in compiled.candidate_lines(data):
            assert 0 <= start <= end <= len(data) and b"\n" not in data[start:end]


# -- text mutations ------------------------------------------------------------------------------------


@fuzz(800)
@given(near(pack_texts(), max_edits=3))
@example("pack: x\npatterns: [" + "[" * 3000)  # nested deeper than the YAML parser goes
@example("pack: x\nx: " + "".join(" " * i + "- \n" for i in range(1, 2000)))
@example("pack: x\nversion: " + "1" * 5000)  # PyYAML's int() refuses it: ValueError, not a YAMLError
@example("pack: x\nversion: 2026-13-01")  # no such date: ValueError
def test_mutated_pack_text_compiles_or_is_refused_by_name(pack_file: Path, text: str) -> None:
    result = load(pack_file, text)
    if isinstance(result, PackError):
        check_refusal(result, pack_file)
    else:
        exercise(result, [*example_messages()[:20], text[:300]])


# -- structure mutations -------------------------------------------------------------------------------

leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.sampled_from(NASTY), any_text,
    st.sampled_from(("", "{", "}", "{x}", "{x|nope}", "(?P<x>", "10m", "-1s", "0", "fault", "kernel", "GPU")),
)  # fmt: skip


def mutated_pack() -> st.SearchStrategy[tuple[dict[str, Any], tuple[Any, ...]]]:
    """A one-pattern pack with one place changed (`fuzzing.mutated_doc`); the pack and the changed path."""
    return mutated_doc(one_pattern_packs(), leaf, ("colour", "regexp", "Code", ""))


@fuzz(700)
@given(mutated_pack())
def test_each_field_of_a_pack_replaced_compiles_or_is_refused_naming_the_pattern(
    pack_file: Path, mutation: tuple[dict[str, Any], tuple[Any, ...]]
) -> None:
    pack, where = mutation
    result = load(pack_file, dump(pack))
    if not isinstance(result, PackError):
        exercise(result, list(example_messages()[:10]))
        return
    check_refusal(result, pack_file)
    pid = pack["patterns"][0].get("id") if where[:2] == ("patterns", 0) and len(where) > 2 else None
    if isinstance(pid, str) and re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", pid):
        assert result.pattern_id == pid, result  # a problem inside a pattern names it


# An alias "bomb": 9**6 strings by reference, where the schema wants a list of strings.
BOMB = "\n".join(
    [
        "pack: x",
        "a: &a [x, x, x, x, x, x, x, x, x]",
        *(f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip("abcde", "bcdef", strict=True)),
        "patterns: [{id: p, description: d, code: C, regex: 'abc', examples: {match: [abc], no_match: *f}}]",
    ]
)


def test_an_alias_bomb_is_refused_without_expanding(pack_file: Path) -> None:
    result = load(pack_file, BOMB)
    assert isinstance(result, PackError)
    check_refusal(result, pack_file)
    assert result.pattern_id == "p" and result.reason.startswith("examples.no_match.0: ")


# -- regexes -------------------------------------------------------------------------------------------

REGEX_PIECES = (
    "(?P<x>", "(?P<y>", ")", "(", "(?:", "[", "]", "[^", "a", "abc", "NVRM: ", "\\d", "\\w", "\\s", "\\S",
    ".", "*", "+", "?", "*?", "{2}", "{1,3}", "{999999999}", "{0,99999}", "|", "^", "$", "\\", "\\b",
    "(?i)", "(?i:", "(?=", "(?!", "(?<=", "(?<!", "(?R)", "(?1)", "(?|", "(?>", "\\p{L}", "\\N{", "\\x",
    "\\1", "(?P=x)", "(?#", "\\Q", "\\E", "[[:alpha:]]", "(?P<x>a)(?P<x>b)", "(a+)+", "(a|a)*", "\x00",
)  # fmt: skip
regexes = st.lists(st.sampled_from(REGEX_PIECES) | st.text(max_size=3), min_size=1, max_size=12).map("".join)
PACK = """pack: fuzz
patterns:
  - id: fuzz-pattern
    description: a fuzzed regex
    regex: {regex}
    code: {code}
    examples:
      match: [{line}]
      no_match: ["nothing here"]
"""


@fuzz(1000)
@given(regexes, st.sampled_from(("FUZZ", "F-{x}", "F-{y|int}", "{x|bus}")), near(example_messages(), 2))
@example("(a+)+$", "FUZZ", "a" * 30 + "!")  # backtracks catastrophically: refused at load
@example("a{999999999}{999999999}", "FUZZ", "aaa")
# Found by this fuzzing: the regex module's compiler copies counted repetitions out, holding the GIL:
@example("a{999999999}", "FUZZ", "aaa")  # never returned (no timeout can stop it)
@example("(?:ab|cd){1000000}", "FUZZ", "ab")  # crashed the process (segmentation fault)
@example("\\N{{999999999}", "FUZZ", "N{")  # not a named character: a count of '{'
@example("(?x)a{9999 9999}", "FUZZ", "aaa")  # verbose mode: blanks inside the count are dropped
def test_any_regex_compiles_or_is_refused_by_name(pack_file: Path, regex: str, code: str, line: str) -> None:
    text = PACK.format(regex=yaml.safe_dump(regex).removesuffix("\n...\n").strip(),
                       code=yaml.safe_dump(code).removesuffix("\n...\n").strip(),
                       line=yaml.safe_dump(line, width=1 << 16).removesuffix("\n...\n").strip())  # fmt: skip
    result = load(pack_file, text)
    if isinstance(result, PackError):
        check_refusal(result, pack_file)
        assert result.pattern_id in ("fuzz-pattern", None), result
        return
    exercise(result, [line, line * 30, "a" * 3000 + "!", *NASTY])


def test_a_set_opening_with_a_bracket_derives_its_literal_without_a_warning(pack_file: Path) -> None:
    """Found by this fuzzing: the stdlib parser that derives prefilter literals warned "possible nested
    set" (a FutureWarning: printed by the agent, an error under warnings-as-errors, where the literal was
    then not derived and the pack refused)."""
    result = load(pack_file, PACK.format(regex="'abcd[[a]efgh'", code="FUZZ", line="abcdaefgh"))
    assert isinstance(result, compiler.CompiledPacks), result
    assert result.patterns[0].literals == ("abcd",)


# -- the built-in packs on the hot path ----------------------------------------------------------------


@fuzz(2000)
@given(
    st.one_of(near(example_messages()), any_text, st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
)
def test_builtin_packs_match_any_line(builtin: compiler.CompiledPacks, line: str) -> None:
    exercise(builtin, [line, line + "\n" + line])


# -- templates -----------------------------------------------------------------------------------------

template_sources = st.lists(
    st.sampled_from(
        (
            "{",
            "}",
            "{x}",
            "{y}",
            "{x|bus}",
            "{x|int}",
            "{x|xid74}",
            "{x|func|upper}",
            "{x|nope}",
            "{1x}",
            "{x|}",
            "XID-",
            "-",
            "{x|code}",
            "{x|present}",
        )
    )
    | st.text(max_size=3),
    max_size=6,
).map("".join)


def compiled_or_error(source: str) -> templates.Template | ValueError:
    try:
        return templates.Template(source)
    except ValueError as exc:
        return exc


def duration_or_error(value: object) -> float | ValueError:
    try:
        return schema.parse_duration(value)
    except ValueError as exc:
        return exc


@fuzz(1500)
@given(
    template_sources,
    st.dictionaries(
        st.sampled_from(("x", "y", "z")), st.none() | near(("0000:3b:00.0", "0x1f", "79", "0x100000, 0x0"))
    ),
)
@example("{x|int}", {"x": "0x" + "f" * 5000})  # int() refuses over 4300 digits: the value stays as it is
@example("{x|xid74}", {"x": "1" * 5000})
def test_templates_compile_or_name_the_problem_and_render_any_value(
    source: str, groups: dict[str, str | None]
) -> None:
    template = compiled_or_error(source)
    if isinstance(template, ValueError):
        assert repr(source) in str(template)
        return
    rendered = template.render(groups)
    if rendered is not None:
        assert isinstance(rendered, str)
    assert (rendered is None) == any(groups.get(f) is None for f in template.fields)


@fuzz(1000)
@given(leaf | st.from_regex(r"\s*[0-9]{0,400}(\.[0-9]*)?\s*(ms|s|m|h|d|x)?\s*", fullmatch=True))
@example(float("nan"))
@example(float("inf"))
@example("9" * 400 + "s")
@example(10**400)  # float() of it raised OverflowError, out of the pack's validation
def test_durations_are_positive_finite_seconds_or_a_value_error(value: object) -> None:
    seconds = duration_or_error(value)
    if isinstance(seconds, ValueError):
        assert str(seconds)
        return
    assert isinstance(seconds, float) and math.isfinite(seconds) and seconds > 0, value
