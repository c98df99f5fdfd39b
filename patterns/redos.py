"""Load-time check for regexes that backtrack catastrophically.

Backtracking blows up on long runs that *almost* match, so each pattern is run (with a short timeout)
on probes made of a prefix of its own positive examples followed by a long run of one character and a
character that breaks the match. A pattern that times out on any probe is rejected.
"""

from __future__ import annotations

from collections.abc import Iterator

import regex

PROBE_RUN = 1000
PROBE_TIMEOUT = 0.2
_FILLERS = ("a", "0", " ", "A", ":", ".", "x ", "a0", "-", "\t")


def probes(examples: list[str]) -> Iterator[str]:
    yield from (f * PROBE_RUN + "\x01" for f in _FILLERS)
    for example in examples[:2]:
        step = max(1, len(example) // 8)
        for i in range(0, len(example) + 1, step):
            prefix = example[:i]
            fillers = {example[i]} if i < len(example) else set()
            fillers.add("a")
            for filler in sorted(fillers):
                yield prefix + filler * PROBE_RUN + "\x01"
        yield example * 40 + "\x01"


def catastrophic_probe(compiled: regex.Pattern[str], examples: list[str]) -> str | None:
    """The first probe (abbreviated) on which the regex times out, or None if it is well-behaved."""
    for probe in probes(examples):
        try:
            compiled.search(probe, timeout=PROBE_TIMEOUT)
        except TimeoutError:
            return probe if len(probe) < 60 else f"{probe[:40]!r}... ({len(probe)} chars)"
    return None
