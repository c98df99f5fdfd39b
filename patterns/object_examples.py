"""Runs every object rule's own examples: the rule must raise its fault for each `match` object (on the
expected node, entity, message, since) and not for any `no_match` object; an expression that fails to
evaluate on an example fails the example, so rules guard what an object may lack. Used at load and by
`faultline patterns test`.

"Raise at `now`": `when` is true and `node` names a node; with `for`, the condition is also due: `since`
(where the rule has one) lies at least `for` before `now` (without `since` the example stands for an
object seen that long). A rule that reads `now`, or times its condition with `since` and `for`, needs
each example's `now`. Examples test the rule as its file wrote it: its own params and `for`, whatever
a later file's `overrides` changed.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from patterns import cel
from patterns.object_rules import CompiledRule, Example, RuleSet, Verdict, describe

ANY_TIME = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)  # `now` of examples of rules that never read it


@dataclass(frozen=True)
class Failure:
    file: str
    rule_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: rule {self.rule_id!r}: {self.reason}"


def needs_now(rule: CompiledRule) -> bool:
    return rule.uses_now or (rule.spec.for_ is not None and "since" in rule.exprs)


def check_rule(rule: CompiledRule) -> list[Failure]:
    failures: list[Failure] = []

    def fail(reason: str) -> None:
        failures.append(Failure(rule.file, rule.id, reason))

    for kind, examples in (("match", rule.spec.examples.match), ("no_match", rule.spec.examples.no_match)):
        for number, example in enumerate(examples, 1):
            what = f"{kind} example {number} ({describe(example.object)})"
            if example.now is None and needs_now(rule):
                fail(f"{what}: give its `now` (the rule reads the time)")
                continue
            verdict, why_not = _raises(rule, example)
            if verdict.error:
                fail(f"{what}: {verdict.error}")
            elif kind == "match" and why_not:
                fail(f"{what}: {why_not}")
            elif kind == "no_match" and not why_not:
                fail(f"{what}: the rule raises its fault")
            elif kind == "match":
                failures.extend(
                    Failure(rule.file, rule.id, f"{what}: {r}") for r in _expected(example, verdict)
                )
    return failures


def _raises(rule: CompiledRule, example: Example) -> tuple[Verdict, str]:
    """The rule's verdict on the example at its `now`, and why it does not raise ('' when it does)."""
    now = example.now or ANY_TIME
    now = now if now.tzinfo else now.replace(tzinfo=dt.UTC)
    verdict = rule.evaluate(cel.value(example.object), now, params=cel.value(dict(rule.spec.params)))
    if verdict.error or not verdict.holds:
        return verdict, "the rule does not raise its fault"
    if rule.spec.for_ is not None and verdict.since is not None:
        due = verdict.since + dt.timedelta(seconds=rule.spec.for_)
        if now < due:
            return (
                verdict,
                f"true since {verdict.since:%Y-%m-%dT%H:%M:%SZ}, due only at {due:%Y-%m-%dT%H:%M:%SZ}",
            )
    return verdict, ""


def _expected(example: Example, verdict: Verdict) -> list[str]:
    got = {
        "node": verdict.node,
        "entity": {"type": verdict.entity.type, "id": verdict.entity.id},
        "message": verdict.message,
        "since": f"{verdict.since:%Y-%m-%dT%H:%M:%SZ}" if verdict.since else None,
    }
    return [f"expected {name}={want!r}, got {got[name]!r}" for name, want in example.expect.items()
            if got[name] != want]  # fmt: skip


def run(rules: RuleSet) -> list[Failure]:
    failures: list[Failure] = []
    for rule in rules.rules.values():
        failures.extend(check_rule(rule))
    return failures


def count(rules: RuleSet) -> int:
    return sum(len(r.spec.examples.match) + len(r.spec.examples.no_match) for r in rules.rules.values())
