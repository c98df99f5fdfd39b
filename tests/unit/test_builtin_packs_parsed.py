"""patterns/packs.json: the built-in packs as parsed, used only for the very text it was made from."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from devtools import builtin_packs
from faultline import yamldoc
from patterns import loader


def test_packs_json_is_current() -> None:
    assert loader.BUILTIN_PARSED.read_text(encoding="utf-8") == builtin_packs.render(), (
        "patterns/packs.json is not current: run `python -m devtools.builtin_packs`"
    )


def test_a_built_in_pack_reads_the_same_from_packs_json_as_from_its_yaml() -> None:
    for path in loader.pack_files(loader.BUILTIN_DIR):
        text = path.read_text(encoding="utf-8")
        assert loader._parsed_builtin(path, text) == yamldoc.parse(text), path.name


def test_an_entry_is_used_only_for_the_text_it_was_made_from(monkeypatch: pytest.MonkeyPatch) -> None:
    path = loader.BUILTIN_DIR / "node.yaml"
    text = path.read_text(encoding="utf-8")
    doc: dict[str, Any] = copy.deepcopy(yamldoc.parse(text))
    doc["patterns"] = doc["patterns"][:1]
    entry = {"sha256": loader.text_digest(text), "doc": doc}
    monkeypatch.setattr(loader, "_builtin_parsed", lambda: {"node.yaml": entry})
    assert len(loader.read_pack(path).patterns) == 1  # the entry's parse is what was read
    entry["sha256"] = loader.text_digest(text + "\n# changed")
    assert len(loader.read_pack(path).patterns) == len(yamldoc.parse(text)["patterns"])  # stale: the YAML


def test_a_user_pack_is_always_parsed_from_its_file(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path / "node.yaml"
    text = (loader.BUILTIN_DIR / "node.yaml").read_text(encoding="utf-8")
    own.write_text(text, encoding="utf-8")
    monkeypatch.setattr(
        loader,
        "_builtin_parsed",
        lambda: {"node.yaml": {"sha256": loader.text_digest(text), "doc": {"pack": "x", "patterns": []}}},
    )
    assert len(loader.read_pack(own).patterns) == len(yamldoc.parse(text)["patterns"])
