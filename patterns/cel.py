"""CEL expressions of the object rules (`patterns.objects`): the Common Expression Language, the one
Kubernetes' own validation rules and admission policies are written in, through cel-python (`celpy`: pure
Python, Apache-2.0).

An expression is parsed once, at load, and checked for the names it reads: `object` (the Kubernetes
object, as its JSON), `params` (the rule's parameters), `now` (the evaluation's time, a timestamp) and the
variables its own macros bind (`c` in `conditions.exists(c, ...)`); any other name is a load error, not a
rule that silently never matches. An expression that reads `now` is marked (`uses_now`): the monitor
evaluates it again as time passes, the others only when their object changes.

Evaluation errors (a field the object lacks, `int("x")`, a wrong type) are `CelError`s with the library's
message, bounded; the caller decides what an error means (a predicate that errs is not true).

Measured (cel-python 0.5.0, interpreted, this 2-core machine): about 1.2-1.6 ms per evaluation of the
built-in rules on a Node, and 60 us to turn a Node's JSON into CEL values (done once per object change).
The library's transpiling runner (`CompiledRunner`) was not used: it failed on a conditional (`a ? b : c`)
inside `&&` with 'no such overload'.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import celpy
from celpy import adapter, celparser, celtypes, evaluation
from lark import Token, Tree

NAMES = frozenset({"object", "params", "now"})
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_ENV = celpy.Environment()
MAX_MESSAGE = 300
QUOTED_VALUE = 60  # characters of a value quoted in the error that refuses it
# The cost bound, checked at load (cel-python counts no cost while it evaluates, as Kubernetes' CEL does):
# an expression's work grows with its size and, for each macro nested in another, with one more factor of
# a list's length (a Node's conditions, a Pod's containers: tens). The built-in rules need at most 570
# nodes and two nested macros.
MAX_NODES = 2000  # of the parsed expression's tree
MAX_SOURCE = 4000  # characters of an expression
MAX_NESTING = 2  # macros (all, exists, map, filter, ...) inside one another

Value = celtypes.Value


class CelError(ValueError):
    """An expression that does not parse, names what it cannot read, or fails to evaluate."""


class Expression:
    """One compiled CEL expression: `source`, whether it reads `now`, and `evaluate`."""

    def __init__(self, source: str) -> None:
        self.source = source
        if len(source) > MAX_SOURCE:  # before the parser sees it (it recurses on deep input)
            raise CelError(f"is {len(source)} characters long; the limit is {MAX_SOURCE}")
        try:
            tree = _ENV.compile(source)
        except celparser.CELParseError as exc:
            raise CelError(f"does not parse{_where(source, exc.line, exc.column)}") from exc
        except Exception as exc:  # the parser raises lark's own errors too
            raise CelError(f"does not parse: {_short(exc)}") from exc
        nodes, nesting = _size(tree)
        if nodes > MAX_NODES:
            raise CelError(f"has {nodes} parts; the limit is {MAX_NODES} (a rule's cost is bounded at load)")
        if nesting > MAX_NESTING:
            raise CelError(f"nests {nesting} macros in one another; the limit is {MAX_NESTING} (each one "
                           "multiplies its cost by a list's length)")  # fmt: skip
        names = _free_names(tree)
        unknown = sorted(names - NAMES)
        if unknown:
            raise CelError(f"unknown name {unknown[0]!r} (an expression reads object, params and now)")
        self.uses_now = "now" in names
        self._program = _ENV.program(tree)

    def evaluate(self, activation: Mapping[str, Value]) -> Value:
        try:
            result = self._program.evaluate(dict(activation))
        except Exception as exc:  # celpy raises CELEvalError and, inside, plain Python errors
            raise CelError(_short(exc)) from exc
        if isinstance(result, evaluation.CELEvalError):  # an error value that was not raised
            raise CelError(_short(result))
        return result

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"


def value(doc: Any) -> Value:
    """A JSON document (a Kubernetes object, the rule's params) as CEL values."""
    return adapter.json_to_cel(doc)


def timestamp(when: dt.datetime) -> Value:
    return celtypes.TimestampType(when.astimezone(dt.UTC))


def as_bool(result: Value) -> bool:
    if not isinstance(result, celtypes.BoolType):
        raise CelError(f"gave {_type(result)}, not a bool")
    return bool(result)


def as_str(result: Value) -> str:
    """A string result; null is ''."""
    if result is None:
        return ""
    if not isinstance(result, str):  # a StringType, or the plain str that `+` makes
        raise CelError(f"gave {_type(result)}, not a string")
    return str(result)


def as_time(result: Value) -> dt.datetime:
    """A timestamp, or a string in RFC 3339 (as Kubernetes writes times: `2026-01-01T00:00:00Z`)."""
    if isinstance(result, celtypes.StringType):
        try:
            result = celtypes.TimestampType(str(result))
        except ValueError as exc:
            raise CelError(f"{str(result)[:QUOTED_VALUE]!r} is not an RFC 3339 time") from exc
    if not isinstance(result, dt.datetime):
        raise CelError(f"gave {_type(result)}, not a timestamp")
    return result.astimezone(dt.UTC) if result.tzinfo else result.replace(tzinfo=dt.UTC)


def _type(result: Value) -> str:
    return "null" if result is None else type(result).__name__.removesuffix("Type").lower()


def _free_names(tree: Tree[Token]) -> set[str]:
    """Names the expression reads that its own macros do not bind."""
    names, bound = set(), set()
    for sub in tree.iter_subtrees():
        if sub.data == "ident":
            names.add(str(sub.children[0]))
        elif sub.data == "member_dot_arg" and str(sub.children[1]) in _MACROS:
            args = sub.children[2]
            if isinstance(args, Tree) and args.children:
                variable = _bare_ident(args.children[0])
                if variable:
                    bound.add(variable)
    return names - bound


def _size(tree: Tree[Token]) -> tuple[int, int]:
    """The tree's node count and the deepest nesting of macros in one another: macros whose bodies hold
    one another (a chain `a.filter(...).exists(...)` adds, not multiplies: a receiver does not count as
    nested). Without recursion: a long `a + b + ...` is a tree as deep as it is long."""
    nodes = sum(1 for _ in tree.iter_subtrees())
    depth: dict[int, int] = {}
    for node in tree.iter_subtrees():  # bottom-up: every child before its parent
        kids = [c for c in node.children if isinstance(c, Tree)]
        if node.data == "member_dot_arg" and len(node.children) > 2 and str(node.children[1]) in _MACROS:
            receiver, args = node.children[0], node.children[2]
            inner = depth[id(args)] if isinstance(args, Tree) else 0
            outer = depth[id(receiver)] if isinstance(receiver, Tree) else 0
            depth[id(node)] = max(outer, 1 + inner)
        else:
            depth[id(node)] = max((depth[id(c)] for c in kids), default=0)
    return nodes, depth[id(tree)]


def _bare_ident(node: Tree[Token] | Token) -> str | None:
    """The name when `node` is nothing but an identifier (a macro's variable)."""
    while isinstance(node, Tree):
        if node.data == "ident":
            return str(node.children[0])
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return None


def _where(source: str, line: int | None, column: int | None) -> str:
    """` at line 1, column 10, near '= 1'` (the parser's message is only a caret under the source)."""
    if not line or not column:
        return ""
    lines = source.splitlines() or [""]
    rest = lines[min(line, len(lines)) - 1][column - 1 : column + 29]
    return f" at line {line}, column {column}" + (f", near {rest!r}" if rest.strip() else " (at its end)")


def _short(exc: BaseException | object) -> str:
    """The library's message, without the activation it may dump, on one bounded line."""
    args = getattr(exc, "args", ())
    text = str(args[0]) if args and isinstance(args[0], str) else str(exc)
    text = text.split(" (in activation", 1)[0]
    return " ".join(text.split())[:MAX_MESSAGE]
