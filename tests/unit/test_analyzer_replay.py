"""`faultline analyzer replay`: the cluster patterns over an exported event history (JSON lines with
MongoDB's extended JSON, or a JSON array), node labels from a file, and bad input named by file and line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

PACK = """
pack: t
patterns:
  - id: zone-burst
    scope: cluster
    description: fatal faults on three nodes of one zone
    match: {fatal: true}
    window: {key: ["zone=label:topology.kubernetes.io/zone"], within: 10m, count: 3, distinct: node}
    fault: {code: ZONE-INCIDENT, entity: {type: ZONE, id: "{zone}"}, nodes: every}
    examples:
      match:
        - records:
            - {node: a, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z}}
            - {node: b, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z}}
            - {node: c, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z}}
      no_match:
        - records:
            - {node: a, code: XID-79, fatal: true, labels: {topology.kubernetes.io/zone: z}}
"""


def event(i: int, node: str, when: Any, fatal: bool = True) -> dict[str, Any]:
    return {"_id": f"e{i}", "node": node, "code": "XID-79", "component": "GPU", "healthy": False,
            "fatal": fatal, "entities": [{"type": "GPU", "id": "0000:3b:00"}], "observed_at": when}  # fmt: skip


def replay(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    pack = tmp_path / "pack.yaml"
    pack.write_text(PACK)
    return subprocess.run(
        [sys.executable, "-m", "faultline", "analyzer", "replay", "--pack", str(pack), "--no-builtin", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_replay_derives_what_the_analyzer_would_from_an_export(tmp_path: Path) -> None:
    nodes = {"items": [{"metadata": {"name": n, "labels": {"topology.kubernetes.io/zone": z}}}
                       for n, z in (("a", "z1"), ("b", "z1"), ("c", "z1"), ("d", "z2"))]}  # fmt: skip
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))  # kubectl get nodes -o json
    lines = [  # out of order, as an export may be; dates as mongoexport writes them, or plain ISO
        event(3, "c", {"$date": "2026-12-01T10:04:00Z"}),
        event(1, "a", {"$date": {"$numberLong": str(1_796_119_200_000)}}),  # 2026-12-01T10:00:00Z
        event(2, "d", "2026-12-01T10:01:00+00:00"),
        event(4, "b", "2026-12-01T10:05:00Z"),
        event(5, "b", "2026-12-01T10:06:00Z", fatal=False),
    ]
    history = tmp_path / "events.jsonl"
    history.write_text("".join(json.dumps(d) + "\n" for d in lines))
    done = replay(tmp_path, "--labels", str(tmp_path / "nodes.json"), "--output", "jsonl", str(history))
    assert done.returncode == 0, done.stderr
    got = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted((f["node"], f["entity"]["id"], f["code"], f["count"], f["last_seen"]) for f in got) == [
        (n, "z1", "ZONE-INCIDENT", 3, "2026-12-01T10:05:00+00:00") for n in ("a", "b", "c")
    ]  # fmt: skip
    assert got[0]["records"] == ["e1", "e3", "e4"]
    assert "5 records, 3 derived faults" in done.stderr
    array = tmp_path / "events.json"  # the same as one JSON array (mongoexport --jsonArray)
    array.write_text(json.dumps(lines))
    table = replay(tmp_path, "--labels", str(tmp_path / "nodes.json"), str(array))
    assert table.returncode == 0 and "ZONE-INCIDENT" in table.stdout and "3 derived faults" in table.stdout


def test_replay_names_the_file_and_line_of_bad_input(tmp_path: Path) -> None:
    history = tmp_path / "events.jsonl"
    history.write_text(json.dumps(event(1, "a", "2026-12-01T10:00:00Z")) + "\n" + "{not json\n")
    done = replay(tmp_path, str(history))
    assert done.returncode == 2 and f"{history}:2: not JSON" in done.stderr
    history.write_text(json.dumps(event(1, "a", "yesterday")) + "\n")
    done = replay(tmp_path, str(history))
    assert done.returncode == 2 and f"{history}:1: observed_at is not a date: 'yesterday'" in done.stderr
    history.write_text(json.dumps({"_id": "x", "observed_at": "2026-12-01T10:00:00Z"}) + "\n")
    done = replay(tmp_path, str(history))
    assert done.returncode == 2 and f"{history}:1: not a health event" in done.stderr
