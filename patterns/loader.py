"""Loads pattern packs: the built-in ones, then user pack directories, merged by pattern id.

A user pattern with the id of a built-in one replaces it; a user table with the name of a built-in
one overrides it row by row (so one XID can be re-classified without copying the catalogue).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from faultline import yamldoc
from faultline.errors import PackError
from patterns.schema import Classification, ClusterPattern, Pack, Pattern

BUILTIN_DIR = Path(__file__).parent / "packs"
# the built-in packs as parsed, by file name with the SHA-256 of the text it was parsed from (written by
# `python -m devtools.builtin_packs`): JSON reads in a millisecond what YAML takes 30 to parse, at every start
BUILTIN_PARSED = Path(__file__).parent / "packs.json"


@dataclass(frozen=True)
class LoadedPattern:
    pattern: Pattern
    file: str
    pack: str
    overrides: str | None = None  # the file whose pattern of the same id this one replaced
    builtin: bool = False  # shipped in patterns/packs (its regex and examples are proven by the test suite)


@dataclass(frozen=True)
class LoadedClusterPattern:
    pattern: ClusterPattern
    file: str
    pack: str
    overrides: str | None = None


@dataclass
class PackSet:
    """Everything the loaded packs say, merged: patterns by id (in load order) and tables by name; the
    analyzer's (`scope: cluster`) apart in `cluster`."""

    patterns: dict[str, LoadedPattern] = field(default_factory=dict)
    cluster: dict[str, LoadedClusterPattern] = field(default_factory=dict)
    tables: dict[str, dict[str, Classification]] = field(default_factory=dict)
    table_files: dict[str, list[str]] = field(default_factory=dict)  # every file that set rows of it
    files: list[str] = field(default_factory=list)


def pack_files(directory: Path) -> list[Path]:
    if not directory.exists():
        raise PackError(str(directory), "pack directory does not exist")
    if directory.is_file():
        return [directory]
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def read_pack(path: Path) -> Pack:
    """Parse and validate one pack file; every problem is a PackError naming the file and pattern."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PackError(name, f"cannot read: {exc}") from exc
    raw = _parsed_builtin(path, text)
    if raw is None:  # a user's pack, or a built-in one changed since packs.json was written
        try:
            raw = yamldoc.parse(text)
        except yamldoc.YamlError as exc:
            raise PackError(name, str(exc)) from exc
    if not isinstance(raw, dict):
        raise PackError(name, "a pack must be a YAML mapping with `pack` and `patterns`")
    try:
        return Pack.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise PackError(name, _describe(err), _pattern_id(raw, err["loc"])) from exc


@functools.cache
def _builtin_parsed() -> dict[str, Any]:
    try:
        parsed = json.loads(BUILTIN_PARSED.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


@functools.cache
def builtin_facts() -> dict[str, dict[str, Any]]:
    """What the compiler keeps of each built-in pattern's regex (`compiler.regex_facts`), by pattern id,
    from the entries of packs.json whose pack file is unchanged (the compiler also checks the regex)."""
    out: dict[str, dict[str, Any]] = {}
    for name, entry in _builtin_parsed().items():
        path = BUILTIN_DIR / name
        if (
            isinstance(entry, dict)
            and isinstance(entry.get("facts"), dict)
            and _current(path, entry.get("sha256"))
        ):
            out.update(entry["facts"])
    return out


@functools.cache
def _current(path: Path, entry_digest: Any) -> bool:
    try:
        return bool(text_digest(path.read_text(encoding="utf-8")) == entry_digest)
    except OSError:
        return False


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _parsed_builtin(path: Path, text: str) -> Any:
    """A built-in pack's parse from packs.json when it was made from this very text; else None."""
    if path.parent != BUILTIN_DIR:
        return None
    entry = _builtin_parsed().get(path.name)
    if not isinstance(entry, dict) or entry.get("sha256") != text_digest(text):
        return None
    return entry.get("doc")


def _pattern_id(raw: dict[str, Any], loc: tuple[int | str, ...]) -> str | None:
    if len(loc) >= 2 and loc[0] in ("patterns", "cluster_patterns") and isinstance(loc[1], int):
        place = loc[1]
        patterns = raw.get("patterns")
        if isinstance(patterns, list):  # the schema parts them by scope: back to the place in the file
            cluster = loc[0] == "cluster_patterns"
            places = [
                i
                for i, p in enumerate(patterns)
                if (isinstance(p, dict) and p.get("scope") == "cluster") == cluster
            ]
            if place < len(places):
                place = places[place]
                pid = patterns[place].get("id") if isinstance(patterns[place], dict) else None
                # an id that is no word (missing, empty, null, a list) names no pattern: its place does
                if isinstance(pid, str | int) and not isinstance(pid, bool) and str(pid).strip():
                    return str(pid)
        return f"#{place + 1}"
    return None


def _describe(err: Any) -> str:
    loc = [str(p) for p in err["loc"]]
    if len(loc) >= 2 and loc[0] in ("patterns", "cluster_patterns"):
        loc = loc[2:]
    where = ".".join(p for p in loc if not p.startswith(("SetStep", "TableStep", "ExpectedMatch", "str")))
    msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
    return f"{where}: {msg}" if where else msg


def load(user_dirs: list[Path] | None = None, *, builtin: bool = True) -> PackSet:
    """Load the built-in packs (unless `builtin=False`) and then every user directory, in order."""
    packs = PackSet()
    dirs = ([BUILTIN_DIR] if builtin else []) + list(user_dirs or [])
    for directory in dirs:
        for path in pack_files(Path(directory)):
            _merge(packs, read_pack(path), str(path), builtin=directory == BUILTIN_DIR)
    return packs


def _merge(packs: PackSet, pack: Pack, file: str, *, builtin: bool = False) -> None:
    packs.files.append(file)
    seen: set[str] = set()
    for pattern in pack.patterns:
        if pattern.id in seen:
            raise PackError(file, "duplicate pattern id in one pack", pattern.id)
        seen.add(pattern.id)
        previous = packs.patterns.get(pattern.id)
        packs.patterns[pattern.id] = LoadedPattern(
            pattern, file, pack.pack, overrides=previous.file if previous else None, builtin=builtin
        )
    for cp in pack.cluster_patterns:
        if cp.id in seen:
            raise PackError(file, "duplicate pattern id in one pack", cp.id)
        seen.add(cp.id)
        replaced = packs.cluster.get(cp.id)
        packs.cluster[cp.id] = LoadedClusterPattern(
            cp, file, pack.pack, overrides=replaced.file if replaced else None
        )
    for name, rows in pack.tables.items():
        table = packs.tables.setdefault(name, {})
        for key, row in rows.items():
            # a later row changes only the fields it sets; the rest of the earlier row stays
            earlier = table.get(key)
            table[key] = (
                earlier.model_copy(update={f: getattr(row, f) for f in row.model_fields_set})
                if earlier is not None
                else row
            )
        packs.table_files.setdefault(name, []).append(file)
