"""A tiny template language for codes, entity ids and table keys: `XID-{xid|int}`, `{pci|bus}`.

`{name}` inserts a named regex group; `|filter` post-processes it. A template whose group did not
participate in the match renders to None, so optional lookups can be skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)((?:\|[a-z_]+)*)\}")
_PCI = re.compile(r"^(?:PCI:)?(?:([0-9A-Fa-f]{4,8}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.([0-7]))?$")


def _pci(value: str, *, function: bool) -> str:
    m = _PCI.match(value.strip())
    if not m:
        return value.lower()
    domain = (m.group(1) or "0000")[-4:]  # 8-digit domains (nvidia-smi) keep their low 4 digits
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


FILTERS: dict[str, Callable[[str], str]] = {
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
