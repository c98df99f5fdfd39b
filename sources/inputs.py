"""The node agent's inputs as one Bytewax input: every source (GPU backend, journal, syslog, kmsg, NIC,
gRPC ingest) behind a single partition that sleeps until a source's thread notifies it (`sources.wake`),
so an idle agent costs little CPU and a queued fault is taken at once. Items are (input position, batch).
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from typing import Any

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from sources import wake
from sources.journal import Entry

MAX_WAIT_S = 0.25  # the longest an idle agent sleeps (metrics heartbeat, monitor watchdog)
SPIN_CALLS = 8  # empty calls answered without blocking after a batch (see _InputsPartition)


@dataclass(frozen=True)
class LogInput:
    """A kernel-log input of the node flow: its step id (a recovery contract), the pack source its
    lines are (journal, syslog or kmsg) and the Bytewax source emitting `Entry` items."""

    step_id: str
    kind: str
    source: FixedPartitionedSource[Entry, Any]


class _InputsPartition(StatefulSourcePartition[tuple[int, list[Any]], dict[str, Any]]):
    """Every input of the agent behind one partition: each call asks each input for its batch and hands
    the non-empty ones over as (input position, batch) items.

    While nothing is pending it blocks in `wake.wait` (the GIL released) until an input's thread
    notifies, a timed input is due, or MAX_WAIT_S passes, instead of letting Bytewax poll the inputs:
    an idle agent then wakes a few times a second, not a thousand. After handing a batch over it first
    answers SPIN_CALLS empty calls without blocking, so the worker carries that batch through the
    downstream steps before it looks again (and sleeps if nothing came). Inputs marked `notifies`
    (their threads call `wake.notify()`) are not scheduled by time. The snapshot holds each input's
    own snapshot under its step id.

    Once `stop` is set (a SIGTERM), the next look that finds nothing pending ends the input: Bytewax
    then finishes the flow in order and writes the last snapshot, so a restart resumes after everything
    this agent handled."""

    def __init__(
        self, parts: list[tuple[str, StatefulSourcePartition[Any, Any]]], stop: threading.Event | None = None
    ) -> None:
        self.parts = parts
        self.stop = stop
        self.spin = 0  # empty answers left before the inputs are looked at again

    def next_batch(self) -> list[tuple[int, list[Any]]]:
        if self.spin > 0 and not wake.pending():
            self.spin -= 1  # the worker is carrying the last batch downstream
            return []
        wake.clear()  # before looking: a notify after the look ends the wait below at once
        out = []
        for position, (_step_id, part) in enumerate(self.parts):
            batch = part.next_batch()
            if batch:
                out.append((position, list(batch)))
        if out:
            self.spin = SPIN_CALLS
            return out
        if self.stop is not None and self.stop.is_set():
            raise StopIteration  # everything read was handed over: end the flow in order
        now = dt.datetime.now(dt.UTC)
        due = [
            awake for _, part in self.parts
            if not getattr(part, "notifies", False) and (awake := part.next_awake()) is not None
        ]  # fmt: skip
        timeout = min([MAX_WAIT_S, *((d - now).total_seconds() for d in due)])
        if timeout > 0:
            wake.wait(timeout)
        return []

    def next_awake(self) -> dt.datetime | None:
        return None  # next_batch paces itself

    def snapshot(self) -> dict[str, Any]:
        return {step_id: part.snapshot() for step_id, part in self.parts}

    def close(self) -> None:
        for _, part in self.parts:
            part.close()


class Inputs(FixedPartitionedSource[tuple[int, list[Any]], dict[str, Any]]):
    """Single-partition sources (by step id, in order) as one source; see `_InputsPartition`. Setting
    `stop` ends the input once nothing is pending (an orderly shutdown)."""

    def __init__(
        self, sources: list[tuple[str, FixedPartitionedSource[Any, Any]]], stop: threading.Event | None = None
    ) -> None:
        self.sources = sources
        self.stop = stop

    def list_parts(self) -> list[str]:
        return ["inputs"]

    def build_part(
        self, step_id: str, for_part: str, resume_state: dict[str, Any] | None
    ) -> _InputsPartition:
        resume = resume_state or {}
        parts = []
        for inner_id, source in self.sources:
            names = source.list_parts()
            if len(names) != 1:
                raise ValueError(f"input {inner_id} has partitions {names}; the agent's inputs have one each")
            parts.append((inner_id, source.build_part(inner_id, names[0], resume.get(inner_id))))
        return _InputsPartition(parts, self.stop)
