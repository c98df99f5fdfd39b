"""The agent's reads of its node's repairs: often while one is open, seldom otherwise (one read a node per
`repair_idle_interval` is what a fleet of idle nodes costs the store)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from faultline import store
from faultline.errors import TransientError
from sources import simulator
from sources.gpu_source import GpuEventSource, GpuPolling


class Reads:
    """A node's repairs as the store would answer, and when each read came."""

    def __init__(self) -> None:
        self.at: list[float] = []
        self.active = False
        self.fail = False
        self.lock = threading.Lock()

    def __call__(self) -> tuple[list[store.RepairNotice], bool]:
        with self.lock:
            self.at.append(time.monotonic())
            if self.fail:
                raise TransientError("the store is away")
            return [], self.active

    def count(self, since: float) -> int:
        with self.lock:
            return sum(t >= since for t in self.at)


def test_reads_are_seldom_while_no_repair_of_the_node_is_open(tmp_path: Path) -> None:
    reads = Reads()
    polling = GpuPolling(interval=0.05, repair_interval=0.05, repair_idle_interval=0.6)
    backend = simulator.SimulatorBackend("n1", directory=tmp_path, gpus=1)
    part = GpuEventSource(backend, polling, notices=reads, boot_id="b").build_part("gpu", "gpu", None)
    try:
        time.sleep(0.2)
        idle_from = time.monotonic()
        time.sleep(1.0)
        idle = reads.count(idle_from)
        assert 1 <= idle <= 2  # every 0.6 s, not every 0.05 s
        reads.active = True  # a repair of the node opens: seen at the next read, then read often
        time.sleep(0.7)
        busy_from = time.monotonic()
        time.sleep(0.5)
        assert reads.count(busy_from) >= 6
        reads.fail = True  # the store away: the interval stays as it was
        time.sleep(0.2)
        fail_from = time.monotonic()
        time.sleep(0.5)
        assert reads.count(fail_from) >= 6
        reads.fail, reads.active = False, False
        time.sleep(0.2)
        quiet_from = time.monotonic()
        time.sleep(1.0)
        assert reads.count(quiet_from) <= 2
    finally:
        part.close()
