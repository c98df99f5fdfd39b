"""Running a production dataflow: Bytewax's run API (`bytewax.run.cli_main`, what `python -m
bytewax.run` calls), not its testing helper, with SIGTERM and SIGINT as an orderly stop.

As PID 1 in a container, a process that installs no SIGTERM handler ignores SIGTERM (the kernel does not
apply the default action to init), and the pod is killed only after its grace period. With `on_stop`
(the agent: it ends its inputs, see `sources.inputs`), the first SIGTERM or SIGINT asks the flow to finish
in order, so Bytewax closes the last epoch and writes its snapshot; without it, or on a second signal,
the signal raises inside the flow, Bytewax aborts ("signal received") and `run` returns normally: the
next start resumes from the last snapshot written.
"""

from __future__ import annotations

import datetime as dt
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from bytewax.dataflow import Dataflow
from bytewax.errors import BytewaxRuntimeError
from bytewax.recovery import RecoveryConfig
from bytewax.run import cli_main


class Stopped(KeyboardInterrupt):
    """Raised by the signal handler inside the flow's thread; Bytewax ends the run on it."""


def run(
    flow: Dataflow,
    *,
    workers: int = 1,
    epoch_interval: dt.timedelta = dt.timedelta(seconds=10),
    recovery: RecoveryConfig | None = None,
    handle_signals: bool = True,
    on_stop: Callable[[], None] | None = None,
    process_id: int | None = None,
    addresses: list[str] | None = None,
) -> bool:
    """Run `flow` in this process with `workers` worker threads until its inputs end or, with
    `handle_signals` (only in the main thread, where handlers can be installed), a stop signal arrives;
    returns whether it was stopped by a signal. With `addresses` (every process's host:port), this
    process is process `process_id` of a Bytewax cluster, each of whose processes runs the same flow.
    `on_stop`: called (in the signal handler: it must only set flags) on the first signal instead of
    aborting the flow. Other errors propagate."""
    stopped = threading.Event()
    handle_signals = handle_signals and threading.current_thread() is threading.main_thread()

    def stop(signum: int, _frame: FrameType | None) -> None:
        first = not stopped.is_set()
        stopped.set()
        if first and on_stop is not None:
            on_stop()  # the flow ends itself; a second signal aborts it
            return
        raise Stopped(signal.Signals(signum).name)

    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT) if handle_signals else ():
        previous[sig] = signal.signal(sig, stop)
    try:
        cli_main(  # type: ignore[no-untyped-call]
            flow,
            workers_per_process=workers,
            process_id=process_id,
            addresses=addresses,
            epoch_interval=epoch_interval,
            recovery_config=recovery,
        )
    except (BytewaxRuntimeError, Stopped):
        if not stopped.is_set():
            raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return stopped.is_set()
