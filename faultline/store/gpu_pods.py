"""Which pods use which GPU on each node (`gpu_pods`): one `GpuPods` document per node.

Written by the node's agent from the kubelet's pod-resources API (`sources.pod_resources`), only where
partial GPU drains are on; read by the drainer, which in a partial drain evicts only the pods using the
faulty GPUs. The agent writes when what it read changed, or when it has seen a new quarantine episode
of its node since its last write (`episode`): the drainer trusts a mapping only for the episode it was
read in, i.e. after the node was cordoned, so no pod can have been scheduled onto the GPU since.
Each write replaces the node's document (one `_id` equality: the filter every server answers from its
index).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from faultline.store import documents
from faultline.store.base import Base, utc


class GpuPodMaps(Base):
    def record_gpu_pods(
        self, node: str, *, read_at: dt.datetime, episode: dt.datetime | None,
        assignments: Iterable[documents.GpuAssignment], unmapped: Iterable[str] = (),
    ) -> None:  # fmt: skip
        """The node's GPU -> pods mapping as read at `read_at`, after the agent saw `episode`."""
        doc = documents.GpuPods(
            _id=node, node=node, read_at=utc(read_at), episode=None if episode is None else utc(episode),
            assignments=list(assignments), unmapped=sorted(set(unmapped)),
        )  # fmt: skip
        body = doc.model_dump(mode="python", by_alias=True)
        body.pop("_id")
        self.upsert(self.gpu_pods, {"_id": node}, {"$set": body})

    def gpu_pods_of(self, node: str) -> documents.GpuPods | None:
        """The node's last recorded mapping, or None when its agent never wrote one."""
        doc = self.gpu_pods.find_one({"_id": node})
        return None if doc is None else documents.GpuPods.from_doc(doc)
