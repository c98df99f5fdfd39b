"""What the fuzz tests (`test_fuzz_*.py`) share: one reproducible settings profile, the seed inputs (the
corpus's log lines, the packs' example lines) and a strategy that mutates a seed into near-valid input.

Every fuzz test runs with `derandomize=True` and no example database, so CI runs the same examples every
time and a failure reproduces from the test alone; the examples that once failed are pinned with
`@example` next to the test. Sizes are chosen so the whole fuzz suite stays near a minute on two cores.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from patterns import loader
from patterns.schema import ExpectedMatch

CORPUS = Path(__file__).resolve().parent.parent / "corpus" / "logs"
F = TypeVar("F", bound=Callable[..., Any])


def fuzz(examples: int) -> Callable[[F], F]:
    """The settings of one fuzz target: `examples` generated inputs, reproducible, no time limit per
    example (the suite's time is measured as a whole)."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


@cache
def corpus_lines() -> tuple[str, ...]:
    """Every line of the text corpus files (every format faultline reads, every fault family)."""
    lines: list[str] = []
    for path in sorted(CORPUS.iterdir()):
        if path.suffix != ".export":
            lines += [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return tuple(lines)


@cache
def example_messages() -> tuple[str, ...]:
    """The positive and negative example lines of every built-in pattern (messages without a log head)."""
    out: list[str] = []
    for loaded in loader.load().patterns.values():
        ex = loaded.pattern.examples
        out += [e.line if isinstance(e, ExpectedMatch) else e for e in ex.match]
        out += ex.no_match
    return tuple(out)


# Pieces that break parsers: digits that are not ASCII, numbers too long for int() or a float, escapes
# the formats join records at, separators, NUL, byte-order marks, line and paragraph separators.
NASTY = (
    "\u00b2", "\u0663", "\uff11", "9" * 400, "1" * 5000, "-1", "+1", "0x1f", "1e400", "nan", "inf",
    "\x00", "\n", "\r", "\t", "\x0b", "\x85", "\u2028", "\ufeff", "\ufffd", "#012", "#011", "\\x0a",
    "\\x09", "[", "]", "<", ">", "<999>", ":", ": ", ";", ",", "=", "{", "}", '"', "\\", "${", "$",
    " " * 300, "T", "Z", "+99:99", ".", "..", "/", "%s", "\U0001f600",
)  # fmt: skip

pieces = st.one_of(st.sampled_from(NASTY), st.text(max_size=12), st.text(alphabet="0123456789", max_size=25))


@st.composite
def mutated(draw: st.DrawFn, seeds: st.SearchStrategy[str], max_edits: int = 4) -> str:
    """A seed with a few edits: a piece inserted, a span deleted or replaced, a span repeated, the line
    cut short, or one character swapped for a nasty piece."""
    text = draw(seeds)
    for _ in range(draw(st.integers(0, max_edits))):
        n = len(text)
        at = draw(st.integers(0, n))
        end = draw(st.integers(at, min(n, at + 40)))
        op = draw(st.sampled_from(("insert", "delete", "replace", "repeat", "cut", "swap")))
        if op == "insert":
            text = text[:at] + draw(pieces) + text[at:]
        elif op == "delete":
            text = text[:at] + text[end:]
        elif op == "replace":
            text = text[:at] + draw(pieces) + text[end:]
        elif op == "repeat":
            text = text[:at] + text[at:end] * draw(st.integers(2, 50)) + text[end:]
        elif op == "cut":
            text = text[:at]
        elif n:
            at = min(at, n - 1)
            text = text[:at] + draw(st.sampled_from(NASTY)) + text[at + 1 :]
    return text


def near(seeds: tuple[str, ...], max_edits: int = 4) -> st.SearchStrategy[str]:
    """Mutations of the seeds, and the seeds themselves."""
    return mutated(st.sampled_from(seeds), max_edits)


# Text of any kind: every Unicode category but lone surrogates (a str from decoded bytes has none)
any_text = st.text(max_size=300)


def yaml_values(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """YAML-shaped values (lists and mappings, nested) of these leaves."""
    return st.recursive(
        leaf,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4)
        ),
        max_leaves=12,
    )


def paths(node: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a YAML document, as the keys and indexes that reach it (the root first)."""
    yield at
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*at, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from paths(value, (*at, i))


@st.composite
def mutated_doc(
    draw: st.DrawFn, seeds: tuple[dict[str, Any], ...], leaf: st.SearchStrategy[Any], unknown: tuple[str, ...]
) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """One of the seed documents with one place changed: a value replaced by one of another shape (of
    `leaf`s), a key removed, or a key of `unknown` added. Returns the document and the changed path."""
    doc = copy.deepcopy(draw(st.sampled_from(seeds)))
    where = draw(st.sampled_from(list(paths(doc))[1:]))
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    op = draw(st.sampled_from(("replace", "replace", "replace", "remove", "add")))
    if op == "remove":
        del parent[where[-1]]
    elif op == "add" and isinstance(parent[where[-1]], dict):
        parent[where[-1]][draw(st.sampled_from(unknown))] = draw(leaf)
    else:
        parent[where[-1]] = draw(yaml_values(leaf))
    return doc, where
