"""Reading a YAML document that a person wrote (a pattern pack, quarantine rules, a remediation template):
every way the text can fail to load becomes one `YamlError` with a reason, which the caller wraps in its
own error naming the file.

PyYAML raises more than `yaml.YAMLError`: its constructors raise ValueError for scalars they cannot
build (an integer of more than 4300 digits, a date such as 2026-13-01), and its pure-Python loader
recurses once per level of nesting (RecursionError for a document nested about a thousand deep; libyaml's
loader, used where it is installed, refuses such nesting with a YAMLError). Fuzzing the loaders found
both (`tests/unit/test_fuzz_packs.py`, `test_fuzz_config.py`).
"""

from __future__ import annotations

from typing import Any


class YamlError(ValueError):
    """The text is not a YAML document faultline can read; the message says why (and where, when the
    parser knows the line)."""


def parse(text: str) -> Any:
    """The document in `text` (None when it is empty), with a safe loader (libyaml's when available).
    PyYAML is imported here, at the first document: `faultline replay` with the built-in packs reads
    none (their parse is in patterns/packs.json) and does not import it."""
    import yaml  # noqa: PLC0415

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        raise YamlError(f"invalid YAML: {exc}") from exc
    except RecursionError as exc:
        raise YamlError("invalid YAML: nested too deeply") from exc
    except (ValueError, OverflowError) as exc:
        raise YamlError(f"invalid YAML: a value cannot be read: {exc}") from exc
