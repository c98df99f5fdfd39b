"""The GPU clients on a node that a GPU reset must stop first (pure): the labels that take them away.

NVIDIA's reset (`nvidia-smi --gpu-reset`) needs no process to hold the GPU. On a node the GPU Operator
runs, its device plugin, DCGM and DCGM exporter hold every GPU; each runs as a DaemonSet whose node selector
is `nvidia.com/gpu.deploy.<operand>=true`, and any other value takes its pod off the node (the GPU
Operator's own MIG manager pauses them so, with `paused-for-mig-change`). The janitor sets each such label
that is `true` to PAUSED before the reset Job and back to `true` once the Job is done, and sets
AGENT_LABEL, which faultline's own agent steps aside for (the chart's agent affinity), and removes it
after. A value other than `true` (an operand switched off on purpose) is left alone, so a restore
never switches on what someone switched off; a takeover restores from the labels themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

PAUSED = "paused-for-gpu-reset"
AGENT_LABEL = "faultline.io/gpu-clients"  # faultline's agent leaves a node labelled so (value AGENT_PAUSED)
AGENT_PAUSED = "paused"


def pause(labels: Mapping[str, str], keys: Iterable[str]) -> dict[str, str | None]:
    """The labels to set before a reset (a merge patch's `labels`)."""
    return {**{k: PAUSED for k in keys if labels.get(k) == "true"}, AGENT_LABEL: AGENT_PAUSED}


def resume(labels: Mapping[str, str], keys: Iterable[str] = ()) -> dict[str, str | None]:
    """The labels to set after it: what `pause` changed, back, whichever keys it was given (PAUSED is
    faultline's alone: a restore needs no list, so one made with other settings, or by the uninstall,
    finds them all); {} when nothing is paused. `keys` is accepted for symmetry with `pause`."""
    del keys
    back: dict[str, str | None] = {k: "true" for k, v in labels.items() if v == PAUSED}
    if AGENT_LABEL in labels:
        back[AGENT_LABEL] = None
    return back
