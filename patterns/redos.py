"""Load-time checks for regexes too costly to run: catastrophic backtracking, and counted repetition
the `regex` module's compiler cannot afford.

Backtracking blows up on long runs that *almost* match, so each pattern is run (with a short timeout)
on probes made of a prefix of its own positive examples followed by a long run of one character and a
character that breaks the match. A pattern that times out on any probe is rejected.

The `regex` module compiles a counted repetition `X{n}` as n copies of X, in C and holding the GIL:
`a{10000000}` takes 4 s and `a{999999999}` never ends (no timeout can interrupt it), and
`(?:ab|cd){1000000}` crashes the process (measured with regex 2024.x; found by fuzzing the pack
loader). So before compiling, `expansion` bounds how many atoms the copies come to, nesting multiplied,
and a pattern over MAX_EXPANSION is refused (100 000 atoms compile in about 0.05 s).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import regex

PROBE_RUN = 1000
PROBE_TIMEOUT = 0.2
PROBED_EXAMPLES = 2  # positive examples whose prefixes make probes (each adds some 10 to 20 of them)
SHOWN_PROBE = 60  # characters of a probe shown whole in the refusal; a longer one by its first SHOWN_START
SHOWN_START = 40
_FILLERS = ("a", "0", " ", "A", ":", ".", "x ", "a0", "-", "\t")
MAX_EXPANSION = 100_000
# A count as the compiler may read it: in verbose mode (?x) blanks inside the braces do not count
_COUNT = re.compile(r"\{([\d\s]*)(?:,([\d\s]*))?\}", re.ASCII)
_VERBOSE = re.compile(r"\(\?[a-zA-Z^-]*x")


def probes(examples: list[str]) -> Iterator[str]:
    yield from (f * PROBE_RUN + "\x01" for f in _FILLERS)
    for example in examples[:PROBED_EXAMPLES]:
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
            return probe if len(probe) < SHOWN_PROBE else f"{probe[:SHOWN_START]!r}... ({len(probe)} chars)"
    return None


def expansion(source: str) -> int:
    """An upper bound on the atoms the regex module's compiler makes of `source` once counted
    repetitions are copied out (stops counting past MAX_EXPANSION). Reads the syntax conservatively: a
    brace that could be a count is taken as one, blanks are passed over (in verbose mode they may stand
    between an atom and its count), alternatives add up, and where (?x) may apply, `#` comments are
    read both as comments and as text."""
    size = _expansion(source, comments=False)
    return max(size, _expansion(source, comments=True)) if _VERBOSE.search(source) else size


def _expansion(source: str, *, comments: bool) -> int:
    levels = [[0, 0]]  # per open group: [size of the finished items, size of the last item]
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        level = levels[-1]
        if ch.isspace():
            i += 1
        elif comments and ch == "#":
            i = source.find("\n", i)
            i = n if i < 0 else i + 1
        elif ch == "(" and source.startswith("(?#", i):  # a comment group
            i = source.find(")", i)
            i = n if i < 0 else i + 1
        elif ch == "(":
            levels.append([0, 0])
            i += 1
        elif ch == ")" and len(levels) > 1:
            done = levels.pop()
            levels[-1][0] += levels[-1][1]
            levels[-1][1] = done[0] + done[1]
            i += 1
        elif ch == "{" and (m := _COUNT.match(source, i)) and any(c.strip() for c in m.groups() if c):
            counts = ["".join(c.split()) for c in m.groups() if c and c.strip()]
            times = MAX_EXPANSION + 1 if any(len(c) > 6 for c in counts) else max(map(int, counts)) + 1
            level[1] = min(level[1] * times, MAX_EXPANSION + 1)
            i = m.end()
        else:
            level[0] += level[1]
            level[1] = 1
            i = _atom_end(source, i)
        if level[0] + level[1] > MAX_EXPANSION:
            return MAX_EXPANSION + 1
    while len(levels) > 1:
        done = levels.pop()
        levels[-1][0] += levels[-1][1] + done[0] + done[1]
    return min(levels[0][0] + levels[0][1], MAX_EXPANSION + 1)


def _atom_end(source: str, i: int) -> int:
    """The end of the atom at `i`: an escape, a character class, or one character. Braces after an
    escape (`\\p{L}`, `\\N{...}`) are left to be read as a possible count: over-counting is safe."""
    n = len(source)
    if source[i] == "\\":
        return min(i + 2, n)
    if source[i] == "[":  # to the first ']' that closes it (a leading one is literal; [:alpha:] inside)
        j = i + 1
        if j < n and source[j] == "^":
            j += 1
        if j < n and source[j] == "]":
            j += 1
        while j < n and source[j] != "]":
            if source[j] == "\\":
                j += 2
            elif source.startswith("[:", j) and (k := source.find(":]", j + 2)) >= 0:
                j = k + 2
            else:
                j += 1
        return min(j + 1, n)
    return i + 1
