"""One process-wide wake-up for the node agent's inputs.

Sources fed by their own threads (GPU backend, journalctl reader, gRPC ingest) call `notify()` after
queueing something; the agent's single input partition (`dataflows.node.Inputs`) blocks in `wait()` while
nothing is pending instead of being polled. The Bytewax worker thus sleeps, holding no GIL, until there is
work or a timed source is due, rather than waking every millisecond; and a fault is picked up as soon as
it is queued rather than at the next poll. A spurious wake-up only costs one empty look.
"""

from __future__ import annotations

import threading

_event = threading.Event()


def notify() -> None:
    _event.set()


def pending() -> bool:
    """Notified since the last `clear()`."""
    return _event.is_set()


def clear() -> None:
    """Before looking at the queues: a notify after the look then ends the next wait at once."""
    _event.clear()


def wait(timeout: float) -> bool:
    """True when notified within `timeout` seconds."""
    return _event.wait(timeout)
