"""What the analyzer's tests share: a cluster pattern (a GPU that fails again, on any node), finding a
replica's other processes (`faultline analyzer process`)."""

from __future__ import annotations

from pathlib import Path


def gpu_repeat_pack(name: str) -> str:
    """A pack `name` whose one cluster pattern derives GPU-REPEATED-FAILURE on a GPU (by UUID) that fails
    twice within a day, whichever node it is in."""
    return f"pack: {name}\n" + GPU_REPEAT


GPU_REPEAT = """patterns:
  - id: gpu-repeat
    scope: cluster
    description: the same GPU (by UUID) fails again, whichever node it is in
    match: {codes: [XID-79, XID-95]}
    window: {key: [gpu], within: 24h, count: 2}
    fault:
      code: GPU-REPEATED-FAILURE
      component: GPU
      entity: {type: GPU-UUID, id: "{gpu}"}
      fatal: true
      action: CONTACT_SUPPORT
    examples:
      match:
        - records:
            - {node: n1, code: XID-79, metadata: {gpu_uuid: GPU-1}}
            - {at: 1h, node: n2, code: XID-95, metadata: {gpu_uuid: GPU-1}}
          expect: {nodes: [n2], entity_id: GPU-1, count: 2}
      no_match:
        - records:
            - {node: n1, code: XID-79, metadata: {gpu_uuid: GPU-1}}
            - {at: 1h, node: n2, code: XID-79, metadata: {gpu_uuid: GPU-2}}
"""


def second_processes(parent: int | None = None) -> list[int]:
    """The pids of analyzer processes still alive that are a replica's second ones (of `parent`, or of
    any replica)."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
            ppid = int((cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if argv[-3:-1] == [b"analyzer", b"process"] and parent in (None, ppid):
            out.append(int(cmdline.parent.name))
    return out
