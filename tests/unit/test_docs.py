"""The README and the documentation site stay what a reader needs (issue 24): a README of at most 10 KB with
the two commands, generated pages that are current, a nav that lists every page and only pages that exist,
and links from the README that lead somewhere. `make docs` builds the site strictly (links and anchors);
this test is the fast part of it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

from devtools import valuesref, xidref
from tests.conftest import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_LIMIT = 10_240  # bytes


def _nav_pages(nav: Any) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_pages(value)


def _nav() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"
    return list(_nav_pages(config["nav"]))


def _support_matrix(text: str) -> list[str]:
    section = text.split("## Support matrix", 1)[1]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_the_readme_is_at_most_10_kb() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes (at most {README_LIMIT}): move detail into docs/"


def test_the_readme_keeps_the_two_commands_and_their_prerequisites() -> None:
    text = README.read_text(encoding="utf-8")
    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    assert "make replay" in lines
    assert "make test" in lines
    for needed in ("Python 3.11 or 3.12", "`make`", "Go 1.26+", "systemd-journal-remote", "postgresql"):
        assert needed in text, needed


def test_the_values_reference_is_current() -> None:
    assert valuesref.check(ROOT) is None, "run make docs-gen (python -m devtools.valuesref)"


def test_the_xid_catalogue_is_current() -> None:
    assert xidref.check(ROOT) is None, "run make docs-gen (python -m devtools.xidref)"


def test_every_nav_page_exists_and_every_page_is_in_the_nav() -> None:
    nav = _nav()
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    missing = [page for page in nav if not (DOCS / page).is_file()]
    assert not missing, f"in mkdocs.yml's nav but not in docs/: {missing}"
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    left_out = [page for page in pages if page not in nav]
    assert not left_out, f"in docs/ but not in mkdocs.yml's nav: {left_out}"


def test_the_readme_links_lead_to_files() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into docs/"
    broken = [t for t in local if not (ROOT / t).is_file()]
    assert not broken, f"README.md links to files that do not exist: {broken}"


def test_the_support_matrix_is_the_same_in_the_readme_and_the_site() -> None:
    readme = _support_matrix(README.read_text(encoding="utf-8"))
    site = _support_matrix((DOCS / "index.md").read_text(encoding="utf-8"))
    assert readme, "the README has a support matrix"
    assert readme == site, "README.md's and docs/index.md's support matrices differ"
