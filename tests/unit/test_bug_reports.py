"""The agent's upload of the repair Jobs' bug reports: whole files only, each once, deleted after; a
report over the limit keeps its head, named as truncated."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from sources import bug_reports


class Kept:
    def __init__(self) -> None:
        self.kept: dict[str, bytes] = {}

    def keep_bug_report(self, node: str, name: str, data: bytes, at: dt.datetime) -> None:
        self.kept[f"{node}/{name}"] = data

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


def test_whole_reports_are_uploaded_once_and_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bug_reports, "MAX_BYTES", 8)
    (tmp_path / "a.log.gz").write_bytes(b"12345678")
    (tmp_path / "big.log.gz").write_bytes(b"123456789abc")
    (tmp_path / ".c.log").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_bytes(b"not a report")
    st: Any = Kept()
    assert bug_reports.upload(st, "n1", tmp_path) == ["a.log.gz", "big.log.gz.truncated"]
    assert st.kept == {"n1/a.log.gz": b"12345678", "n1/big.log.gz.truncated": b"12345678"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".c.log", "notes.txt"]
    assert bug_reports.upload(st, "n1", tmp_path) == []
    assert bug_reports.upload(st, "n1", tmp_path / "missing") == []
