"""Repairs the janitor carried out on this node, confirmed from the GPUs themselves.

On a real node the evidence that a GPU reset worked is not in any kernel log: the NVIDIA driver writes
no line for a reset, and nvidia-smi's "was successfully reset" goes to the reset Job's container log,
which the agent never sees (and which any user-space process could write to syslog). So the agent
confirms a repair from two things it can observe:

1. the janitor's record, in the store, that the round's step verifiably happened (the reset Job
   succeeded, i.e. the reset script exited 0; or the node came back Ready with a new boot id):
   `Store.repairs_to_confirm(node)`, read by a thread of the GPU source every `repair_interval` seconds
   while a repair of the node is open (the janitor's stage not finished), and every
   `repair_idle_interval` seconds otherwise (`Store.repair_watch`: one query, cheap for a fleet);
2. a fresh read of the round's GPUs through the GPU backend (NVML, DCGM, the simulator) taken after
   that record was read: a GPU is repaired when `sources.gpu.repair_verdict` finds it reachable, with
   no uncorrectable error since the reset and nothing pending (remapping, page retirement).

Each GPU that reads repaired becomes one `repaired` event (its message is matched by the `gpu` pack's
`gpu-repaired-*` patterns, which clear the faults that step repairs); one that does not is checked
again at every read until it does or the janitor closes the round (validation then fails and the next
round escalates). The agent and the janitor meet only in the store; neither imports the other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from faultline import store
from sources import gpu

log = logging.getLogger(__name__)
Notices = Callable[
    [], tuple[list[store.RepairNotice], bool]
]  # (verified rounds, any repair of the node open)


class RepairWatch:
    """Pure: which GPUs of the verified rounds read repaired (each reported once per round)."""

    def __init__(self, devices: list[gpu.GpuDevice]) -> None:
        self.index = {d.pci: d.index for d in devices}
        self.reported: set[tuple[str, str]] = set()  # (round id, GPU) already reported repaired
        self.waiting: dict[tuple[str, str], str] = {}  # why a GPU is not repaired yet (logged on change)

    def judge(
        self, notices: list[store.RepairNotice], fields: dict[int, dict[str, int]], ts: float
    ) -> list[gpu.GpuEvent]:
        """Events for the GPUs of `notices` whose `fields` (read after the notices were) show them
        repaired. Rounds no longer listed are forgotten."""
        out = []
        current = set()
        for notice in notices:
            if notice.step not in gpu.REPAIR_STEPS:
                continue
            for pci in notice.gpus:
                key = (notice.round_id, pci)
                current.add(key)
                index = self.index.get(pci)
                if key in self.reported or index is None:
                    continue
                verdict = gpu.repair_verdict(fields.get(index))
                if verdict is None:
                    self.reported.add(key)
                    self.waiting.pop(key, None)
                    out.append(gpu.GpuEvent(ts, index, "repaired", name=notice.step))
                    where = {"gpu": pci, "step": notice.step, "round": notice.round_id}
                    log.info("gpu repaired", extra=where)
                elif self.waiting.get(key) != verdict:
                    self.waiting[key] = verdict
                    log.info(
                        "gpu not repaired",
                        extra={"gpu": pci, "step": notice.step, "round": notice.round_id, "reason": verdict},
                    )  # fmt: skip
        self.reported &= current
        self.waiting = {k: v for k, v in self.waiting.items() if k in current}
        return out


def from_store(st: store.Store, node: str) -> Notices:
    """The node's verified repairs, and whether one of its repairs is open, read from the store (the agent's
    one client). A failed read raises; the caller keeps the last answer and tries again later."""

    def notices() -> tuple[list[store.RepairNotice], bool]:
        with store.unreachable_is_transient("reading the node's repairs"):
            return st.repair_watch(node)

    return notices
