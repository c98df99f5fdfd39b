"""The XID catalogue's actions against NVIDIA's published resolution buckets (`tests/corpus/xid-buckets.tsv`:
each XID's immediate bucket from NVIDIA's Xid catalogue): a bucket with one meaning maps to one action, and
the pack follows it; buckets that are workflows (the line decides: XID 154's recovery action, NVLink5's
severity word, XID 48 with or without a row remap, XID 74's registers) or have no bucket in the revision are
decided by the pack's own tables and rows, each with a recommendation that says what to do."""

from __future__ import annotations

from pathlib import Path

from patterns import loader

BUCKETS = Path(__file__).resolve().parents[1] / "corpus" / "xid-buckets.tsv"
ACTION_OF_BUCKET = {
    "RESET_GPU": ("COMPONENT_RESET", True),
    "RESTART_BM": ("RESTART_BM", True),
    "RESTART_VM": ("RESTART_VM", True),
    "RESTART_APP": ("RESTART_APP", False),
    "IGNORE": ("NONE", False),
    "CONTACT_SUPPORT": (
        "CONTACT_SUPPORT",
        None,
    ),  # unused or unknown codes: not fatal unless the row says why
}


def _buckets() -> dict[str, str]:
    lines = [line for line in BUCKETS.read_text().splitlines() if line and not line.startswith("#")]
    return dict(tuple(line.split("\t")) for line in lines)


def test_every_catalogued_xid_has_a_bucket_row_and_a_pack_row() -> None:
    table = loader.load().tables["xid"]
    buckets = _buckets()
    assert len(buckets) == 172
    assert set(buckets) <= set(table)


def test_actions_follow_nvidias_immediate_bucket() -> None:
    table = loader.load().tables["xid"]
    differ = []
    for xid, bucket in _buckets().items():
        if bucket not in ACTION_OF_BUCKET:
            continue
        action, fatal = ACTION_OF_BUCKET[bucket]
        row = table[xid]
        assert row.action is not None
        if row.action.value != action or (fatal is not None and row.fatal is not fatal):
            differ.append((xid, bucket, row.action.value, row.fatal))
    assert differ == []


def test_workflow_buckets_are_decided_by_the_line_and_say_what_to_do() -> None:
    table = loader.load().tables["xid"]
    others = {x: b for x, b in _buckets().items() if b not in ACTION_OF_BUCKET}
    assert "154" in others and others["154"] == "XID_154"  # decided by the recovery action in the line
    assert {x for x, b in others.items() if b == "WORKFLOW_NVLINK5_ERR"} == {str(x) for x in range(144, 151)}
    for xid, bucket in others.items():
        assert table[xid].recommendation, f"XID {xid} ({bucket}) has no recommendation"
