"""Catalogue consistency (issue 14 item 4): the XID catalogue page (docs/patterns/xid-catalogue.md) is the
pack's, unused and unknown XIDs are handled one way, XID 74 and fatal SXids carry the actions their NVIDIA
documents give, and only user-space patterns trust lines from user space."""

from __future__ import annotations

from devtools import xidref
from patterns import loader
from patterns.schema import LOG_SOURCES, SetStep
from tests.conftest import ROOT


def test_the_xid_catalogue_page_is_generated_from_the_pack() -> None:
    assert xidref.check(ROOT) is None, "run make docs-gen (python -m devtools.xidref)"


def test_unused_reserved_and_unknown_xids_are_handled_one_way() -> None:
    packs = loader.load()
    default = next(s.set for s in packs.patterns["xid"].pattern.classify if isinstance(s, SetStep))
    unused = {
        key: row
        for key, row in packs.tables["xid"].items()
        if row.description and ("unused" in row.description.lower() or "reserved" in row.description.lower())
    }
    assert len(unused) > 50
    for key, row in unused.items():
        assert (row.fatal, row.action) == (default.fatal, default.action), key
        assert row.recommendation == "contact support: not expected on current data-centre GPUs", key


def test_xid74_is_decoded_not_blindly_reset_and_fatal_sxids_reboot() -> None:
    packs = loader.load()
    assert packs.tables["xid"]["74"].action is not None
    assert packs.tables["xid"]["74"].action.value == "CONTACT_SUPPORT"
    assert packs.tables["xid74_registers"]["hardware"].action.value == "CONTACT_SUPPORT"  # type: ignore[union-attr]
    fatal = [(k, r) for k, r in packs.tables["sxid"].items() if r.fatal]
    assert fatal and all(r.action is not None and r.action.value == "RESTART_BM" for _, r in fatal)
    assert packs.tables["sxid_severity"]["fatal"].action.value == "RESTART_BM"  # type: ignore[union-attr]


def test_only_user_space_patterns_trust_user_space_lines() -> None:
    trusting = {
        lp.pattern.id
        for lp in loader.load().patterns.values()
        if lp.pattern.origin == "any" and set(lp.pattern.sources) & set(LOG_SOURCES)
    }
    assert trusting == set()  # a repair is confirmed by the GPU backend's read, not a log line (item 6)
