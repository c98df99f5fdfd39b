"""Shared fixtures: the compiled built-in packs, the sample corpus and a helper to write user packs."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from patterns import compiler, loader

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "benchmarks" / "corpus" / "sample"


@pytest.fixture(scope="session")
def builtin() -> compiler.CompiledPacks:
    return compiler.compile_packs(loader.load())


@pytest.fixture
def write_pack(tmp_path: Path) -> Callable[[str, str], Path]:
    """write_pack(name, yaml_text) -> the directory holding it (dedented)."""
    directory = tmp_path / "packs"
    directory.mkdir(exist_ok=True)

    def write(name: str, text: str) -> Path:
        (directory / name).write_text(textwrap.dedent(text), encoding="utf-8")
        return directory

    return write


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    assert SAMPLE.is_dir(), "the sample corpus is committed under benchmarks/corpus/sample"
    return SAMPLE


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Tests that run the CLI, which configures the root logger (it is the entry point): put it back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(capture=False)
