"""Bytewax input for replaying log files: one partition per rotation group, emitting line chunks."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from sources import files

ProgressFn = Callable[[int, int], None]  # (bytes read, lines read) since the last call
READ_ERRORS = (OSError, EOFError, zlib.error)  # a file gone, unreadable, or compressed and cut short


def read_error(info: files.FileInfo, exc: BaseException) -> files.Chunk:
    """An empty chunk that says the file could not be read on (what it gave before stays)."""
    return files.Chunk(info, 0, diags=[f"{info.path}: read error, rest of file skipped: {exc}"])


class _GroupPartition(StatefulSourcePartition[files.Chunk, tuple[int, int]]):
    def __init__(
        self, group: list[files.FileInfo], resume: tuple[int, int] | None, progress: ProgressFn | None
    ):
        self.group = group
        self.progress = progress
        self.pos, skip = resume if resume is not None else (0, 0)
        self.emitted = 0
        self.fh: Any = None
        self.reader: Any = None
        self._open(skip)

    def _open(self, skip: int = 0) -> None:
        self.emitted = 0
        if self.pos >= len(self.group):
            return
        info = self.group[self.pos]
        try:
            self.fh = files.open_binary(info.path)
        except READ_ERRORS as exc:  # gone or unreadable since it was sniffed: said, then the next file
            self.fh, self.reader = None, iter([read_error(info, exc)])
            return
        self.reader = files.chunks(info, self.fh)
        for _ in range(skip):
            next(self.reader, None)
            self.emitted += 1

    def next_batch(self) -> list[files.Chunk]:
        while self.pos < len(self.group):
            try:
                chunk = next(self.reader)
            except StopIteration:
                chunk = None
            except READ_ERRORS as exc:
                chunk = read_error(self.group[self.pos], exc)
                self.reader = iter(())
            if chunk is not None:
                self.emitted += 1
                if self.progress is not None:
                    self.progress(chunk.nbytes, chunk.lines)
                return [chunk]
            if self.fh is not None:
                self.fh.close()
            self.pos += 1
            self._open()
        raise StopIteration

    def snapshot(self) -> tuple[int, int]:
        return (self.pos, self.emitted)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


class ReplaySource(FixedPartitionedSource[files.Chunk, tuple[int, int]]):
    """Reads groups of already-sniffed files; each group is read in order by one worker."""

    def __init__(self, groups: list[list[files.FileInfo]], progress: ProgressFn | None = None) -> None:
        self.groups = groups
        self.progress = progress

    def list_parts(self) -> list[str]:
        return [f"group-{i}" for i in range(len(self.groups))]

    def build_part(
        self, step_id: str, for_part: str, resume_state: tuple[int, int] | None
    ) -> _GroupPartition:
        index = int(for_part.removeprefix("group-"))
        return _GroupPartition(self.groups[index], resume_state, self.progress)
