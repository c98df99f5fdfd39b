"""The drain's scope (pure): system namespaces, and when a drain moves only the pods of the faulty
GPUs, from the faults behind the quarantine and the node agent's GPU -> pod mapping."""

from __future__ import annotations

import datetime as dt

import pytest

from workers import drain_scope as ds

EPISODE = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
EARLIER = EPISODE - dt.timedelta(hours=1)
G0, G1, G2 = "0000:18:00", "0000:19:00", "0000:1a:00"
SYSTEM = frozenset({"kube-system", "faultline"})


def fault(
    gpu: str = G0, action: str = "COMPONENT_RESET", code: str = "XID-48", kind: str = "GPU"
) -> ds.FaultView:
    return ds.FaultView(code, kind, gpu, action)


MAPPING = ds.pod_map(
    EPISODE, [(G0, "train", "a"), (G1, "train", "b"), (G0, "train", "ab"), (G1, "train", "ab")]
)


def decide(faults: list[ds.FaultView], mapping: ds.PodMap | None = MAPPING, *, partial: bool = True,
           waited_out: bool = False, previous: str | None = None) -> ds.Scope:  # fmt: skip
    return ds.decide(partial=partial, faults=faults, mapping=mapping, episode=EPISODE, waited_out=waited_out,
                     previous=previous, previous_reason="widened by remediation" if previous else None)  # fmt: skip


@pytest.mark.parametrize(
    ("faults", "mapping", "kw", "kind", "reason"),
    [
        ([fault()], MAPPING, {"partial": False}, ds.NODE, "partial GPU drains are off"),
        ([], MAPPING, {}, ds.NODE, "no fault behind the quarantine names a GPU"),
        ([fault(), fault(G1, "RESTART_BM", "XID-79")], MAPPING, {}, ds.NODE,
         "fault XID-79 on GPU 0000:19:00 needs RESTART_BM: the whole node"),
        ([fault(action="RESTART_VM")], MAPPING, {}, ds.NODE, "needs RESTART_VM"),
        ([fault(action="REPLACE_VM")], MAPPING, {}, ds.NODE, "needs REPLACE_VM"),
        ([fault(action="CONTACT_SUPPORT")], MAPPING, {}, ds.NODE, "needs CONTACT_SUPPORT"),
        ([fault("mlx5_0/1", "RESTART_APP", "NIC-LINK-DOWN", "NIC")], MAPPING, {}, ds.NODE,
         "fault NIC-LINK-DOWN is on NIC mlx5_0/1, not on one GPU"),
        ([fault("", "COMPONENT_RESET", "GPU-DRIVER-UNRESPONSIVE", "NODE")], MAPPING, {}, ds.NODE,
         "is on NODE, not on one GPU"),
        ([fault()], None, {}, ds.WAIT, "no GPU -> pod mapping from the node's agent: waiting"),
        ([fault()], None, {"waited_out": True}, ds.NODE, "within the partial drain's wait: the whole node"),
        ([fault()], ds.pod_map(EARLIER, [(G0, "train", "a")]), {}, ds.WAIT,
         "no GPU -> pod mapping read since the node was cordoned: waiting"),
        ([fault()], ds.pod_map(None, [(G0, "train", "a")]), {"waited_out": True}, ds.NODE,
         "read since the node was cordoned within the partial drain's wait"),
        ([fault()], ds.pod_map(EPISODE, [(G0, "train", "a")], ["MIG-1", "MIG-2"]), {}, ds.NODE,
         "could not match to a GPU (MIG-1, MIG-2): the whole node"),
        ([fault()], MAPPING, {"previous": ds.NODE}, ds.NODE, "widened by remediation"),
        ([fault(), fault(G2, "RESTART_APP", "XID-13")], MAPPING, {}, ds.GPUS,
         "only the pods of GPU 0000:18:00, 0000:1a:00 (the faults need COMPONENT_RESET)"),
        ([fault(action="RESTART_APP"), fault(action="NONE", code="X")], MAPPING, {}, ds.GPUS,
         "(the faults need RESTART_APP)"),
    ],
)  # fmt: skip
def test_the_scope_and_why(faults: list[ds.FaultView], mapping: ds.PodMap | None, kw: dict[str, bool],
                           kind: str, reason: str) -> None:  # fmt: skip
    scope = decide(faults, mapping, **kw)  # type: ignore[arg-type]
    assert scope.kind == kind
    assert reason in scope.reason
    assert scope.gpus == (frozenset(f.entity_id for f in faults) if kind == ds.GPUS else frozenset())


def pod(name: str, namespace: str = "train", asks: bool = True) -> ds.PodView:
    return ds.PodView(namespace, name, asks)


PARTIAL = decide([fault()])  # GPU G0 faulty


@pytest.mark.parametrize(
    ("p", "scope", "skipped"),
    [
        (pod("coredns", "kube-system"), ds.Scope(ds.NODE, ""), "system namespace kube-system"),
        (pod("janitor-job", "faultline"), PARTIAL, "system namespace faultline"),
        (pod("web", asks=False), ds.Scope(ds.NODE, ""), None),        # a whole-node drain moves it
        (pod("a"), ds.Scope(ds.WAIT, ""), None),                      # the drain's, once it knows
        (pod("a"), PARTIAL, None),                                    # on the faulty GPU
        (pod("ab"), PARTIAL, None),                                   # on the faulty GPU and another
        (pod("b"), PARTIAL, "uses GPU 0000:19:00, not the faulty 0000:18:00 (partial drain)"),
        (pod("web", asks=False), PARTIAL, "uses no GPU (partial drain)"),
        (pod("late"), PARTIAL, None),  # asks for GPUs, not in the mapping (started after the read, DRA)
    ],
)  # fmt: skip
def test_which_pods_are_left(p: ds.PodView, scope: ds.Scope, skipped: str | None) -> None:
    assert ds.skip_reason(p, scope, SYSTEM) == skipped
