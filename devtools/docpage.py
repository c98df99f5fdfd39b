"""A page of docs/ that a program writes from the sources it describes (the values reference, the XID
catalogue): the one command line its generators share. `--check` says whether the page in the tree is
what the sources make now (exit 1 naming the page and the command that rewrites it); without it, the page
is written."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from devtools import tools


def stale(root: Path, page: Path, render: Callable[[Path], str], sources: str, command: str) -> str | None:
    """None when `page` is current, else the message saying which page and what to run."""
    path = root / page
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    if current == render(root):
        return None
    return f"{page} is not current with {sources}: run make docs-gen (or {command})"


def main(
    argv: list[str] | None, *, description: str | None, page: Path, render: Callable[[Path], str],
    check: Callable[[Path], str | None],
) -> int:  # fmt: skip
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only check that the page is current")
    parser.add_argument("--root", type=Path, default=tools.REPO, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    if args.check:
        problem = check(args.root)
        if problem:
            sys.stderr.write(f"error: {problem}\n")
            return 1
        return 0
    target = args.root / page
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(args.root), encoding="utf-8")
    return 0
