"""The GPU backend (NVML, DCGM or the simulator) as a Bytewax source: its blocking waits and field polls
run on their own threads and hand events over a bounded queue; the partition's resume state is the
backend's replay position and the last fields read.

With `repairs` (the node's verified repairs, `sources.repairs`), a third thread reads them every
`repair_interval` seconds while a repair of the node is open (else every `repair_idle_interval`) and each
field poll judges the rounds' GPUs from the read it just made.

With `samples` (seconds: the agent's `health_samples`), the first field poll and then the first one
each `samples` seconds after the last also hand over one health sample per GPU of what it read
(`sources.gpu.samples`): no call of their own, so a sample costs one event per GPU.

The fields in the resume state belong to one boot of the node: after a reboot the GPUs were
re-initialised, so the first read reports every abnormal state afresh (a GPU still lost, or with a
remapping still pending, after a reboot is a fault again instead of "no change").
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
import time
from dataclasses import dataclass

from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from faultline import bounds, metrics, store
from sources import gpu, repairs, wake
from sources.follow import current_boot_id
from sources.inputs import MAX_WAIT_S

WAIT_S = 0.5  # the longest one backend wait for events blocks (the thread checks for stop between)
JOIN_S = 5.0  # a closing source waits this long in all for its threads (a wait blocks WAIT_S at most)


@dataclass(frozen=True)
class GpuPolling:
    """How the GPU source polls health fields and judges its own health (AgentConfig holds the values)."""

    interval: float = 1.0
    hung_after: float = 10.0
    unresponsive_after: float = 300.0
    repair_interval: float = 5.0  # between reads of the node's verified repairs, one of its repairs open
    samples: float | None = None  # between health samples of each GPU (None: none)
    repair_idle_interval: float = 30.0  # between those reads while none of the node's repairs is open


GpuResume = tuple[int | None, dict[int, dict[str, int]], str]  # position, last fields read, their boot


class _GpuPartition(StatefulSourcePartition[gpu.GpuEvent, GpuResume]):
    """Two threads block in the backend (events, field polls); `next_batch` hands over what they found
    and checks the poll thread is not stuck. Resume state: the replay position of the backend (the
    simulator's) and the last fields read, so a restart reports only what changed meanwhile."""

    def __init__(
        self, backend: gpu.GpuBackend, polling: GpuPolling, resume: GpuResume | None,
        notices: repairs.Notices | None = None, boot_id: str = "",
    ) -> None:  # fmt: skip
        self.backend = backend
        self.boot_id = boot_id
        self.notices = notices
        self.pending_repairs: list[store.RepairNotice] = []
        self.repair_watch = repairs.RepairWatch(backend.devices())
        self.polling = polling
        self.notifies = True  # its threads call wake.notify() after queueing
        self.position, self.fields, boot = (*resume, "")[:3] if resume is not None else (None, {}, boot_id)
        if boot != boot_id:  # another boot (or a snapshot from before boots were kept): report afresh
            self.fields = {}
        if self.position is not None:
            backend.resume(self.position)  # before the waiting thread starts
        else:  # where reading begins: a snapshot before the first event must replay from here
            self.position = backend.position()
        self.queue: queue.Queue[gpu.GpuEvent] = queue.Queue(maxsize=10_000)
        self.stop = threading.Event()
        # a hung call is a node fault only where it is the node's own driver call (sources.gpu)
        escalates = bool(getattr(backend, "driver_in_process", True))
        self.watch = gpu.MonitorWatch(polling.hung_after, polling.unresponsive_after, escalates=escalates)
        self.quiet = gpu.GAUGES | frozenset(getattr(backend, "sample_only", ()))
        self.sample_at = 0.0  # when the next health sample is due (with polling.samples)
        self.call_started: float | None = None
        self.failure: str | None = None
        self.announced = False
        self.latest = self.fields
        self.threads = [
            threading.Thread(target=self._wait, name="gpu-events", daemon=True),
            threading.Thread(target=self._poll, name="gpu-fields", daemon=True),
        ]
        if notices is not None:
            self.threads.append(threading.Thread(target=self._read_repairs, name="gpu-repairs", daemon=True))
        for thread in self.threads:
            thread.start()

    def _read_repairs(self) -> None:
        assert self.notices is not None
        active = True  # until a read says otherwise (and after a failed one): the shorter interval
        while not self.stop.is_set():
            try:
                self.pending_repairs, active = self.notices()
            except Exception as exc:  # noqa: BLE001 - the store away: keep the last answer, try again
                repairs.log.debug("repairs not read: %s", exc)  # the interval stays as it was
            wait = self.polling.repair_interval if active else self.polling.repair_idle_interval
            self.stop.wait(max(self.polling.repair_interval, wait))

    def _wait(self) -> None:  # the backend blocks; Bytewax's next_batch must not
        while not self.stop.is_set():
            with metrics.BACKEND_WAIT.time():
                events = self.backend.wait_events(WAIT_S)
            for event in events:
                self.queue.put(event)
            if events:
                wake.notify()

    def _poll(self) -> None:
        previous = self.fields
        while not self.stop.is_set():
            self.call_started = time.monotonic()
            notices = self.pending_repairs  # read before the fields: the read below is after the repair
            try:
                with metrics.FIELD_READ.time():
                    current = self.backend.read_fields()
            except Exception as exc:  # noqa: BLE001 - any backend failure is the monitor's health, reported
                self.failure = bounds.clip(f"{type(exc).__name__}: {exc}", bounds.EXCERPT)
            else:
                self.failure = None
                now = time.time()
                for event in gpu.field_changes(previous, current, now, self.quiet):
                    self.queue.put(event)
                if self.polling.samples is not None and now >= self.sample_at:
                    self.sample_at = now + self.polling.samples
                    for event in gpu.samples(current, now):
                        self.queue.put(event)
                for event in self.repair_watch.judge(notices, current, time.time()) if notices else ():
                    self.queue.put(event)
                previous = self.latest = current
                self.queue.put(gpu.GpuEvent(time.time(), -1, "fields", 0))  # a marker: the read is done
                wake.notify()
            finally:
                self.call_started = None
            self.stop.wait(self.polling.interval)

    def next_batch(self) -> list[gpu.GpuEvent]:
        metrics.beat()  # asked at least every MAX_WAIT_S: a stalled dataflow stops beating
        out: list[gpu.GpuEvent] = []
        while len(out) < 1000:
            try:
                event = self.queue.get_nowait()
            except queue.Empty:
                break
            if event.kind == "fields":
                self.fields = self.latest  # what the snapshot says was last read
                if not self.announced:  # the first read done: the monitor works. Its line creates the
                    self.announced = True  # node's detector, which publishes the node's conditions now,
                    out.append(
                        gpu.GpuEvent(time.time(), -1, "monitor", gpu.MONITOR_OK)
                    )  # not at a first fault
                continue
            out.append(event)
            if event.position is not None:
                self.position = event.position
        out += self.watch.observe(time.monotonic(), self.call_started, self.failure, ts=time.time())
        return out

    def next_awake(self) -> dt.datetime | None:
        return None if not self.queue.empty() else dt.datetime.now(dt.UTC) + dt.timedelta(seconds=MAX_WAIT_S)

    def snapshot(self) -> GpuResume:
        return self.position, self.fields, self.boot_id

    def close(self) -> None:
        """Stop the threads and join them (a wait on the driver ends within its own timeout; a thread
        still in a hung driver call after JOIN_S is left to the process's end, as the call cannot be
        interrupted), then close the backend."""
        self.stop.set()
        deadline = time.monotonic() + JOIN_S
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.backend.close()


class GpuEventSource(FixedPartitionedSource[gpu.GpuEvent, GpuResume]):
    def __init__(
        self, backend: gpu.GpuBackend, polling: GpuPolling | None = None,
        notices: repairs.Notices | None = None, boot_id: str | None = None,
    ) -> None:  # fmt: skip
        self.backend = backend
        self.polling = polling or GpuPolling()
        self.notices = notices
        self.boot_id = current_boot_id() if boot_id is None else boot_id

    def list_parts(self) -> list[str]:
        return ["gpu"]

    def build_part(self, step_id: str, for_part: str, resume_state: GpuResume | None) -> _GpuPartition:
        return _GpuPartition(self.backend, self.polling, resume_state, self.notices, self.boot_id)
