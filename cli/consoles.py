"""The consoles every command prints on (rich): standard output laid out wide when it is not a terminal,
and standard error. `faultline replay` imports this only for its table or progress bar (its other lines are
plain text: rich costs a start-up that a replay of a small file notices)."""

from __future__ import annotations

import sys

from rich.console import Console

# Not a terminal (a pipe, CI): lay tables out wide instead of folding them into 80 columns.
out = Console(highlight=False, soft_wrap=True, emoji=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)
