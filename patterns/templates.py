"""A tiny template language for codes, entity ids and table keys: `XID-{xid|int}`, `{pci|bus}`.

`{name}` inserts a named regex group; `|filter` post-processes it. A template whose group did not
participate in the match renders to None, so optional lookups can be skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)((?:\|[a-z_][a-z0-9_]*)*)\}")
_PCI = re.compile(r"^(?:PCI:)?(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.([0-7]))?$")


def _pci(value: str, *, function: bool) -> str:
    m = _PCI.match(value.strip())
    if not m:
        return value.lower()
    # any domain width: `0:3b:00`, `0000:3b:00`, `00000000:3b:00` (nvidia-smi) are one GPU; a VMD
    # domain above ffff (`10000:e1:00`) keeps all its digits
    domain = f"{int(m.group(1) or '0', 16):04x}"
    bus = f"{domain}:{m.group(2)}:{m.group(3)}"
    return (f"{bus}.{m.group(4) or '0'}" if function else bus).lower()


def pci_bus(value: str) -> str:
    """Normalise a PCI address to the bus id `dddd:bb:dd` (lowercase, no function)."""
    return _pci(value, function=False)


def pci_function(value: str) -> str:
    """Normalise a PCI address to `dddd:bb:dd.f` (a NIC port is a PCI function)."""
    return _pci(value, function=True)


def _int(value: str) -> str:
    try:
        return str(int(value, 16) if value.lower().startswith("0x") else int(value))
    except ValueError:
        return value


# XID 74 (NVLink 3/4): what the set bits of its seven registers mean, per NVIDIA's Xid catalogue
# (`WORKFLOW_NVLINK_ERR`); registers counted from 1. Categories in order of precedence.
_XID74_BITS: dict[int, dict[str, frozenset[int]]] = {
    1: {
        "hardware": frozenset({8, 9, 12, 16, 17, 24, 28}),
        "signal": frozenset({21, 22}),
        "ecc": frozenset({4, 5}),
        "repeat": frozenset({27, 29}),
        "sympathetic": frozenset({1, 20}),
        "ignore": frozenset({0, 23, 30}),
    },
    3: {
        "report": frozenset({13}),
        "hardware": frozenset({16, 19}),
        "ecc": frozenset({0, 1, 2, 6}),
        "repeat": frozenset({17, 18}),
    },
    4: {"fabric": frozenset({18}), "sympathetic": frozenset({16, 17})},
    5: {"ecc": frozenset({18, 19, 21, 22, 24, 25, 27, 28}), "threshold": frozenset({20, 23, 26, 29})},
}
_XID74_ORDER = (
    "hardware", "report", "signal", "fabric", "ecc", "repeat", "sympathetic", "threshold", "ignore",
)  # fmt: skip


def xid74_category(registers: str) -> str:
    """`0x100000, 0x0, ...` (XID 74's registers) -> the catalogue's category for its set bits, the most
    severe first; `report` for a bit the catalogue does not list, `none` when no bit is set."""
    found: set[str] = set()
    for number, word in enumerate(re.split(r"[\s,]+", registers.strip()), start=1):
        try:
            value = int(word, 16)
        except ValueError:
            continue
        meaning = _XID74_BITS.get(number, {})
        for bit in range(64):
            if value >> bit & 1:
                found.add(next((c for c, bits in meaning.items() if bit in bits), "report"))
    return next((c for c in _XID74_ORDER if c in found), "none")


FILTERS: dict[str, Callable[[str], str]] = {
    "present": lambda _value: "yes",  # a table key that exists when the group took part in the match
    "xid74": xid74_category,
    "bus": pci_bus,
    "func": pci_function,
    "int": _int,
    "lower": str.lower,
    "upper": str.upper,
    "strip": str.strip,
    "code": lambda value: value.upper().replace(
        "_", "-"
    ),  # a field name as a code: nvlink_down -> NVLINK-DOWN
}


class Template:
    """A compiled template. `render(groups)` returns None when a referenced group is missing."""

    __slots__ = ("fields", "literal", "parts", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        parts: list[str | tuple[str, tuple[Callable[[str], str], ...]]] = []
        pos = 0
        for m in _FIELD.finditer(source):
            if m.start() > pos:
                parts.append(source[pos : m.start()])
            names = [f for f in m.group(2).split("|") if f]
            unknown = [f for f in names if f not in FILTERS]
            if unknown:
                raise ValueError(f"unknown template filter {unknown[0]!r} in {source!r}")
            parts.append((m.group(1), tuple(FILTERS[f] for f in names)))
            pos = m.end()
        if pos < len(source):
            parts.append(source[pos:])
        leftover = _FIELD.sub("", source)
        if "{" in leftover or "}" in leftover:
            raise ValueError(f"malformed template {source!r}: braces must enclose a group name")
        self.parts = tuple(parts)
        self.fields = tuple(p[0] for p in parts if isinstance(p, tuple))
        self.literal = source if not self.fields else None

    def render(self, groups: Mapping[str, str | None]) -> str | None:
        if self.literal is not None:
            return self.literal
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = groups.get(part[0])
            if value is None:
                return None
            for fn in part[1]:
                value = fn(value)
            out.append(value)
        return "".join(out)
