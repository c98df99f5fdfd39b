"""The tarball `faultline rma` writes: per bundle a directory with the bundle (`bundle.json`), the kernel
lines and samples behind its faults as text (`kernel-lines.txt`), the GPUs (`gpus.json`) and the repair
history (`repairs.json`); the nodes' `nvidia-bug-report` outputs under `bug-reports/`; and `README.txt`
saying what it holds."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import tarfile
import time
from pathlib import Path
from typing import Any

from faultline.models import utc_text

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe(name: str) -> str:
    """A file-name part from an id (a repair id holds `/`, `:` and `#`)."""
    return _UNSAFE.sub("_", name).strip("_") or "x"


def write(
    path: Path, target: str, bundles: list[dict[str, Any]], reports: dict[str, list[dict[str, Any]]]
) -> int:
    """Write the tarball; how many files it holds."""
    now = time.time()
    count = 0
    with tarfile.open(path, "w:gz") as tar:

        def add(name: str, data: bytes) -> None:
            nonlocal count
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(now), 0o644
            tar.addfile(info, io.BytesIO(data))
            count += 1

        listed = []
        for b in bundles:
            top = safe(str(b["_id"]))
            listed.append(f"{top}: {b['step']} of {b['node']} ({b.get('why', '')})")
            add(f"{top}/bundle.json", _json(b))
            add(f"{top}/gpus.json", _json(b.get("gpus", [])))
            add(f"{top}/repairs.json", _json(b.get("repairs", [])))
            add(f"{top}/kernel-lines.txt", _lines(b).encode())
        for node, found in reports.items():
            for r in found:
                add(f"bug-reports/{safe(node)}/{safe(str(r['name']))}", bytes(r.get("data") or b""))
        readme = [
            f"faultline RMA evidence of {target}", "", *listed, "",
            "bundle.json: the faults, the newest lines or samples behind each, the GPUs (UUID, serial,",
            "PCI, model, VBIOS, driver) and their last health sample, and the node's repairs.",
            "bug-reports/: nvidia-bug-report outputs the node's repair Jobs collected (gzip).",
        ]  # fmt: skip
        add("README.txt", ("\n".join(readme) + "\n").encode())
    return count


def _lines(b: dict[str, Any]) -> str:
    out = []
    for f in b.get("faults", []):
        out.append(
            f"== {f['code']} on {f['entity']['type']} {f['entity']['id']} ({f['state']}, {f['count']}x)"
        )
        for e in b.get("evidence", {}).get(f["id"], []):
            out.append(f"{_iso(e.get('observed_at'))}  {e.get('message', '')}")
    for pci, samples in b.get("samples", {}).items():
        for e in samples:
            fields = ", ".join(f"{k}={v}" for k, v in sorted((e.get("metadata") or {}).items()))
            out.append(f"== health sample of GPU {pci} at {_iso(e.get('observed_at'))}: {fields}")
    return "\n".join(out) + "\n"


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, default=_iso, sort_keys=True) + "\n").encode()


def _iso(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return utc_text(value)
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)
