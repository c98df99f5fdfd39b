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


@pytest.fixture
def unreachable_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig whose API server is a port nothing listens on (a client made from it connects only
    when it is used)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    return path
