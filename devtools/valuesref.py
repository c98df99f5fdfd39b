"""The Helm chart's values reference page, `docs/install/values.md`, generated from
`charts/faultline/values.schema.json` (every value's path, type, what it accepts and its description) with
the defaults of `charts/faultline/values.yaml`.

    python -m devtools.valuesref           # rewrite the page
    python -m devtools.valuesref --check   # exit 1 when the page is not current

A value the schema gives no description takes the comment written after it in values.yaml. `make docs`
runs the check, `make docs-gen` the rewrite; tests/unit/test_docs.py calls `check`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devtools import docpage, tools

SCHEMA = Path("charts/faultline/values.schema.json")
VALUES = Path("charts/faultline/values.yaml")
PAGE = Path("docs/install/values.md")
COMMAND = "python -m devtools.valuesref"

# Patterns the schema repeats, said in words (any other pattern is shown as the regex it is).
_NAMED_PATTERNS = {
    r"^\d+(\.\d+)?(ms|s|m|h|d)?$": "a duration (`250ms`, `30s`, `10m`, `7d`, or seconds)",
    r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E)?$": "a quantity (`100m`, `256Mi`)",
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$": "a DNS-1123 name",
    r"^(sha256:[0-9a-f]{64})?$": "`sha256:` and 64 lower-case hex digits, or empty",
    r"^/": "an absolute path",
}
_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?P<rest>.*)$")
_COMMENT_LINE = re.compile(r"^(?P<indent> *)# ?(?P<text>.*)$")


@dataclass(frozen=True)
class Row:
    """One value of the chart: its dotted path (`<name>` for a key of your choosing, `[]` for each item of
    a list), what it is, what it accepts, its default and what it does."""

    path: str
    type: str
    accepts: str
    default: str
    description: str


def _cell(text: str) -> str:
    """Text for a table cell, one line: outside code spans, pipes escaped and `<`, `>` written as entities
    (a description's `<release>` is not an HTML tag)."""
    parts = text.replace("\n", " ").split("`")
    return "`".join(
        p if i % 2 else p.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
        for i, p in enumerate(parts)
    )


def _code(value: str) -> str:
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def _type(node: Mapping[str, Any]) -> str:
    if "enum" in node:
        names = {type(v).__name__ for v in node["enum"]}
        return "string" if names == {"str"} else " or ".join(sorted(names))
    if "const" in node:
        return "string" if isinstance(node["const"], str) else type(node["const"]).__name__
    if "anyOf" in node:
        seen: list[str] = []
        for branch in node["anyOf"]:
            kind = _type(branch)
            if kind and kind not in seen:
                seen.append(kind)
        return " or ".join(seen)
    declared = node.get("type", "")
    kinds: list[str] = declared if isinstance(declared, list) else [declared] if declared else []
    if "array" in kinds and isinstance(node.get("items"), Mapping):
        inner = _type(node["items"])
        kinds = [f"array of {inner}" if k == "array" and inner else k for k in kinds]
    return " or ".join(kinds)


def _accepts(node: Mapping[str, Any]) -> str:
    """What the schema accepts beyond the type, in a few words."""
    said: list[str] = []
    if "enum" in node:
        said.append("one of " + ", ".join(_code(json.dumps(v) if not isinstance(v, str) else v)
                                         for v in node["enum"]))  # fmt: skip
    if "const" in node:
        said.append(_code(json.dumps(node["const"])))
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        said.append(_NAMED_PATTERNS.get(pattern) or f"matches {_code(pattern)}")
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum")
    exclusive = "exclusiveMinimum" in node
    if low is not None and high is not None:
        said.append(f"more than {low}, at most {high}" if exclusive else f"{low} to {high}")
    elif low is not None:
        said.append(f"more than {low}" if exclusive else f"at least {low}")
    elif high is not None:
        said.append(f"at most {high}")
    if node.get("minLength") == 1:
        said.append("not empty")
    for key, words in (("minLength", "at least {} characters"), ("maxLength", "at most {} characters"),
                       ("minItems", "at least {} items")):  # fmt: skip
        if key in node and not (key == "minLength" and node[key] == 1):
            said.append(words.format(node[key]))
    if node.get("uniqueItems"):
        said.append("no repeats")
    if "anyOf" in node:
        said.append(" or ".join(a for a in (_accepts(b) or _type(b) for b in node["anyOf"]) if a))
    items = node.get("items")
    if isinstance(items, Mapping) and "properties" not in items:
        inner = _accepts(items)
        if inner:
            said.append(f"each: {inner}")
    return "; ".join(s for s in said if s)


def _default(values: Any, path: list[str]) -> tuple[bool, Any]:
    """(found, value) of a dotted path in values.yaml; `<name>` and `[]` parts are never there."""
    here = values
    for key in path:
        if not isinstance(here, Mapping) or key not in here:
            return False, None
        here = here[key]
    return True, here


def _show(value: Any) -> str:
    if isinstance(value, str):
        return _code(json.dumps(value)) if value == "" else _code(value)
    if isinstance(value, bool) or value is None:
        return _code(json.dumps(value))
    if isinstance(value, int | float):
        return _code(str(value))
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    return _code(text)


def comments(text: str) -> dict[str, str]:
    """The comment written after each key of a values file (with the comment lines that continue it, set
    deeper than the key), by dotted path. Keys inside lists are not followed."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last: str | None = None
    last_indent = 0
    for line in text.splitlines():
        key = _KEY_LINE.match(line)
        if key is None:
            more = _COMMENT_LINE.match(line)
            if more and last is not None and len(more["indent"]) > last_indent:
                out[last] = f"{out[last]} {more['text'].strip()}"
            else:
                last = None
            continue
        indent = len(key["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key["key"]))
        path = ".".join(k for _, k in stack)
        rest = key["rest"]
        at = rest.find(" #")
        if at >= 0 and rest[:at].count('"') % 2 == 0:
            out[path] = rest[at + 2 :].strip()
            last, last_indent = path, indent
        else:
            last = None
    return out


def _children(node: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    """(path, schema, whether values.yaml can hold it) of each value below `node`."""
    for name, sub in node.get("properties", {}).items():
        yield f"{path}.{name}" if path else name, sub, True
    for pattern, sub in node.get("patternProperties", {}).items():
        yield f"{path}.<name>", {**sub, "_names": pattern}, False
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping) and extra:
        yield f"{path}.<name>", extra, False
    items = node.get("items")
    if isinstance(items, Mapping) and "properties" in items:
        yield f"{path}[]", items, False


def rows(schema: Mapping[str, Any], values: Any, notes: Mapping[str, str]) -> list[Row]:
    """Every value the schema describes, depth first in the schema's order."""
    out: list[Row] = []

    def walk(node: Mapping[str, Any], path: str, concrete: bool) -> None:
        for sub_path, sub, here in _children(node, path):
            real = concrete and here
            found, value = _default(values, sub_path.split(".")) if real else (False, None)
            nested = "properties" in sub
            default = _show(value) if found and not nested else ""
            description = str(sub.get("description") or "")
            if not description and real:
                description = notes.get(sub_path, "")
            names = sub.get("_names")
            if names:
                description = f"a key matching {_code(str(names))}" + (
                    f": {description}" if description else ""
                )
            out.append(Row(sub_path, _type(sub), _accepts(sub), default, description))
            walk(sub, sub_path, real)

    walk(schema, "", True)
    return out


def render(schema: Mapping[str, Any], values: Any, notes: Mapping[str, str]) -> str:
    """The whole page: one table per top-level value, in the schema's order."""
    lines = [
        "# Values reference",
        "",
        f"<!-- generated by `{COMMAND}` from {SCHEMA} and {VALUES}; do not edit: run make docs-gen -->",
        "",
        "Every value of the `faultline` chart, generated from the chart's `values.schema.json` (type, what "
        "it accepts, description) and `values.yaml` (defaults). Helm checks values against the schema at "
        "install, upgrade, template and lint, so a value outside it fails with its path named. `<name>` "
        "stands for a key of your choosing, `[]` for each item of a list. Where to start: "
        "[Installing with Helm](helm.md).",
    ]
    table = ["| value | type | accepts | default | description |", "|---|---|---|---|---|"]
    by_top: dict[str, list[Row]] = {}
    for row in rows(schema, values, notes):
        by_top.setdefault(row.path.split(".")[0].split("[")[0], []).append(row)
    for top, top_rows in by_top.items():
        lines += ["", f"## `{top}`", ""]
        lines += table
        lines += [f"| {_code(r.path)} | {_cell(r.type)} | {_cell(r.accepts)} | {r.default} | "
                  f"{_cell(r.description)} |" for r in top_rows]  # fmt: skip
    return "\n".join(lines) + "\n"


def page(root: Path = tools.REPO) -> str:
    """The page as it should be, from the chart in `root`."""
    schema = json.loads((root / SCHEMA).read_text(encoding="utf-8"))
    text = (root / VALUES).read_text(encoding="utf-8")
    return render(schema, yaml.safe_load(text), comments(text))


def check(root: Path = tools.REPO) -> str | None:
    """None when the page is current, else the message saying which file and what to run."""
    return docpage.stale(root, PAGE, page, f"{SCHEMA} and {VALUES}", COMMAND)


def main(argv: list[str] | None = None) -> int:
    return docpage.main(argv, description=__doc__, page=PAGE, render=page, check=check)


if __name__ == "__main__":
    sys.exit(main())
