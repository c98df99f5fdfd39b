"""Fuzzing the cluster-scope pattern loader (`patterns.cluster.load`: the schema's `scope: cluster`
patterns, compiled, their examples replayed) and the windows the loaded patterns count in.

A cluster pattern is user input (`faultline analyzer --pack DIR`, `faultline analyzer replay --pack`):
whatever its text, loading it ends in cluster packs that route and count any record, or in a PackError
that names the file, the pattern where the problem is inside one, and the reason; nothing else escapes
and nothing hangs. Packs are made from the built-in cluster patterns, one pattern each, mutated as text,
as YAML structure and field by field (window keys, durations, counts, code and label globs, templates,
`fault.suppresses`, `records: faults`); every pack that loads counts its own examples' records and a few
with odd values (empty, the window key's separator, nasty text), through `replay` and through a
partition's windows, a checkpoint of them and its restore."""

from __future__ import annotations

import copy
import math
import re
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import bson
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from faultline.errors import PackError
from faultline.store.base import CODEC
from patterns import cluster, loader
from patterns.cluster import ClusterPacks, Record, Windows
from patterns.schema import CLUSTER_FIELDS
from tests.unit.fuzzing import NASTY, any_text, fuzz, mutated_doc, near

T = 1_800_000_000.0


@cache
def one_pattern_packs() -> tuple[dict[str, Any], ...]:
    """Every built-in cluster pattern as a pack of its own."""
    out = []
    for path in sorted(loader.BUILTIN_DIR.glob("*.yaml")):
        pack = yaml.safe_load(path.read_text(encoding="utf-8"))
        for pattern in pack["patterns"]:
            if pattern.get("scope") == "cluster":
                out.append({"pack": pack["pack"], "patterns": [pattern]})
    return tuple(out)


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(pack: object) -> str:
    return yaml.dump(pack, Dumper=_DUMPER, allow_unicode=True, sort_keys=False, width=1 << 16)


@cache
def pack_texts() -> tuple[str, ...]:
    return tuple(dump(p) for p in one_pattern_packs())


@pytest.fixture(scope="module")
def pack_file() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name) / "fuzzed.yaml"


def load(path: Path, text: str) -> tuple[ClusterPacks | PackError, ClusterPacks | PackError]:
    """The pack loaded without its examples run and with them (as the analyzer loads it), each as the
    cluster packs or the PackError that refused them."""
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    out: list[ClusterPacks | PackError] = []
    for check in (False, True):
        try:
            out.append(cluster.load([path], builtin=False, check=check))
        except PackError as exc:
            out.append(exc)
    return out[0], out[1]


def check_refusal(exc: PackError, path: Path) -> None:
    assert exc.file == str(path), exc
    assert str(exc).startswith(f"{path}: ") and exc.reason.strip(), exc
    if exc.pattern_id is not None:
        assert str(exc).startswith(f"{path}: pattern {exc.pattern_id!r}: ")


# Records with values a pattern's windows must take in their stride: empty ones, the key separator
# (\x1f) and the shown separator (/) inside values, long and odd text, every field a key may name.
ODD = ("", "\x1f", "a\x1fb", "/", "n1/0000:3b:00", "*", "[", "\x00", "\ufeff", "x" * 3000, "\U0001f600")


def odd_records() -> list[Record]:
    out: list[Record] = []
    for i, v in enumerate(ODD):
        meta = {"gpu_uuid": v, "gpu_serial": v, "job": v, "nvlink_domain": v, "x": v}
        labels = {"topology.kubernetes.io/zone": v, "faultline.io/switch": v, "nvidia.com/gpu.clique": v}
        for kind in ("events", "faults"):
            for node in (f"n{i % 3}", v):
                out.append(Record(
                    position=len(out) << 16, kind=kind, id=f"odd-{len(out)}@{len(out)}", t=T + 10 * len(out),
                    node=node, code=v or "XID-79", component="GPU", entity_type="GPU" if v else "",
                    entity_id=v, fatal=i % 2 == 0, state="open", metadata=meta, labels=labels, opened=T,
                ))  # fmt: skip
    return out


def own_records(packs: ClusterPacks) -> list[Record]:
    """The records of every example of the loaded patterns, as events and as fault changes, in one
    feed (renumbered: one position and id each)."""
    records: list[Record] = []
    for p in packs.patterns.values():
        for ex in [*p.spec.examples.match, *p.spec.examples.no_match]:
            records += cluster.example_records(ex.records, start=T)
    out = []
    for i, r in enumerate([*records, *(as_fault_change(r) for r in records)]):
        out.append(renumbered(r, i))
    return out


def as_fault_change(r: Record) -> Record:
    return Record(**{**fields(r), "kind": "faults", "state": r.state or "open"})


def renumbered(r: Record, i: int) -> Record:
    return Record(**{**fields(r), "position": i << 16, "id": f"own-{i}@{i}"})


def fields(r: Record) -> dict[str, Any]:
    return {s: getattr(r, s) for s in Record.__slots__}


def check_derived(packs: ClusterPacks, derived: list[cluster.Derived], stored: bool) -> None:
    for d in derived:
        p = packs.patterns[d.pattern]
        assert 1 <= d.count <= cluster.MAX_ENTRIES and d.count >= min(p.count, cluster.MAX_ENTRIES), d
        assert d.first_seen <= d.last_seen and 0 < len(d.records) <= cluster.MAX_IDS, d
        assert isinstance(d.code, str) and isinstance(d.entity_id, str) and isinstance(d.entity_type, str), d
        if stored:  # as the analyzer writes it (records of the feed's times, not an example's)
            f = d.fault()
            assert f.pattern == d.pattern and f.metadata["scope"] == "cluster", f


def exercise(packs: ClusterPacks) -> None:
    """Route and count the patterns' own example records and the odd ones: in one process (`replay`)
    and through a partition's windows, checkpointed and restored on the way."""
    own, odd = own_records(packs), odd_records()
    check_derived(packs, cluster.replay(packs, own), stored=False)
    check_derived(packs, cluster.replay(packs, odd), stored=True)
    windows = Windows(packs)
    watermark = T
    for n, r in enumerate(odd + odd[:3]):  # the last three again: a replay of records held already
        watermark = max(watermark, r.t)
        for routed in packs.route(r, watermark):
            assert cluster.partition(routed.pattern, routed.key) in range(cluster.PARTITIONS)
            check_derived(packs, windows.add(routed), stored=True)
        if n == len(odd) // 2:  # a checkpoint as the analyzer saves it (one BSON binary) and restores it
            state = windows.state()
            saved = bson.decode(bson.encode(state, codec_options=CODEC), codec_options=CODEC)
            windows = Windows.restore(packs, saved)
            assert windows.state() == state
    windows.expire(math.inf)
    assert windows.windows == {}


def check(path: Path, text: str) -> tuple[ClusterPacks | PackError, ClusterPacks | PackError]:
    """The property: loaded packs work, a refusal names the file (and the pattern) and why."""
    unchecked, checked = load(path, text)
    for result in (unchecked, checked):
        if isinstance(result, PackError):
            check_refusal(result, path)
    if isinstance(unchecked, PackError):  # what the schema refuses, the examples never get to
        assert isinstance(checked, PackError) and str(checked) == str(unchecked), (unchecked, checked)
    else:  # the same patterns whether their examples passed or not
        exercise(unchecked)
    return unchecked, checked


# -- text mutations ------------------------------------------------------------------------------------


@fuzz(600)
@given(near(pack_texts(), max_edits=3))
@example("pack: x\npatterns: [{scope: cluster, id: p, " + "[" * 3000)  # nested deeper than YAML goes
@example(
    "pack: x\npatterns: [{scope: cluster, id: p, window: {within: " + "9" * 5000 + "}}]"
)  # int() refuses
def test_mutated_cluster_pack_text_loads_or_is_refused_by_name(pack_file: Path, text: str) -> None:
    check(pack_file, text)


def test_the_seeds_load_and_count() -> None:
    """Every built-in cluster pattern is a seed, and each loads alone (else the fuzzing above mutates
    packs refused before it changed anything)."""
    assert {p["patterns"][0]["id"] for p in one_pattern_packs()} >= {
        "gpu-repeated-failure", "node-repeated-failure", "workload-app-xid", "nvlink-domain-fault",
        "switch-link-flaps", "zone-incident",
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as name:
        for text in pack_texts():
            unchecked, checked = check(Path(name) / "seed.yaml", text)
            assert isinstance(unchecked, ClusterPacks) and isinstance(checked, ClusterPacks), checked


# -- structure mutations -------------------------------------------------------------------------------

leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.sampled_from(NASTY), any_text,
    st.sampled_from(("", "*", "[", "{", "}", "{gpu}", "{node}", "{key}", "{x|nope}", "10m", "-1s", "0", "1ms",
                     "events", "faults", "open", "every", "trigger", "GPU", "label:", "metadata:x")),
)  # fmt: skip


def mutated_pack() -> st.SearchStrategy[tuple[dict[str, Any], tuple[Any, ...]]]:
    """A one-pattern pack with one place changed (`fuzzing.mutated_doc`); the pack and the changed path."""
    return mutated_doc(one_pattern_packs(), leaf, ("colour", "keys", "Count", "for_", ""))


def check_names_pattern(
    result: ClusterPacks | PackError, pack: dict[str, Any], where: tuple[Any, ...]
) -> None:
    """A problem inside a pattern names it (by the id it has, when that is one)."""
    if not isinstance(result, PackError) or where[:2] != ("patterns", 0) or len(where) <= 2:
        return
    pid = pack["patterns"][0].get("id") if isinstance(pack["patterns"][0], dict) else None
    if isinstance(pid, str) and re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", pid):
        assert result.pattern_id == pid, result


@fuzz(500)
@given(mutated_pack())
def test_each_field_of_a_cluster_pack_replaced_loads_or_is_refused_naming_the_pattern(
    pack_file: Path, mutation: tuple[dict[str, Any], tuple[Any, ...]]
) -> None:
    pack, where = mutation
    for result in check(pack_file, dump(pack)):
        check_names_pattern(result, pack, where)


# -- the fields a cluster pattern's meaning hangs on, given values near the valid ones ------------------

key_specs = st.one_of(
    st.sampled_from(CLUSTER_FIELDS),
    st.sampled_from((
        "zone=label:topology.kubernetes.io/zone", "label:x", "metadata:job", "label:", "metadata:", "=gpu",
        "a=b=c", "x=", "1x=node", "Node", " node ", "node=gpu", "key=node", "key", "gpu=label:*", "x=label:[",
        "label:\x1f", "job=metadata:job", "",
    )),
    near(("zone=label:topology.kubernetes.io/zone", "gpu", "switch=label:faultline.io/switch"), 2),
)  # fmt: skip
durations = st.one_of(
    st.sampled_from(("1ms", "10m", "24h", "7d", "0", "0s", "-1s", "1e3s", "10 m", "1.5h", "nan", "inf", "")),
    st.integers(-5, 10**6), st.floats(), st.just(10**400), near(("10m", "24h"), 2),
)  # fmt: skip
counts = st.one_of(st.integers(-2, 8), st.sampled_from((2**70, 10**5, True, 1.5, "3", "three", None)))
globs = st.lists(
    st.sampled_from(("*", "XID-*", "XID-79", "XID-[!0-9]*", "[", "[]", "[!]", "?", "*" * 200 + "x", "", "x" * 3000))
    | st.sampled_from(NASTY) | st.text(max_size=6),
    max_size=4,
)  # fmt: skip
templates = st.one_of(
    st.sampled_from(("{gpu}", "{node}", "{key}", "{zone}", "{job}", "{gpu|bus}", "{gpu|int}", "{node|nope}",
                     "{", "}", "", "X-{code}-{node}", "{ gpu }", "{1x}", "{gpu|}")),
    near(("GPU-REPEATED-FAILURE", "{gpu}", "WORKLOAD-{job}"), 2),
)  # fmt: skip
FIELDS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("window", "key"): st.lists(key_specs, max_size=4) | key_specs,
    ("window", "within"): durations,
    ("window", "count"): counts,
    ("window", "distinct"): st.none() | key_specs,
    ("match", "records"): st.sampled_from(("events", "faults", "Faults", "", None, 1)),
    ("match", "codes"): globs,
    ("match", "components"): st.none()
    | st.lists(st.sampled_from(("GPU", "NIC", "gpu", "TPU", "")), max_size=3),
    ("match", "healthy"): st.sampled_from((None, True, False, "yes", 0)),
    ("match", "fatal"): st.sampled_from((None, True, False, "no", 2)),
    ("match", "states"): st.none()
    | st.lists(st.sampled_from(("open", "resolved", "closed", "")), max_size=3),
    ("match", "labels"): st.dictionaries(
        key_specs | st.integers(), st.none() | st.integers() | globs.map("".join)
    ),
    ("fault", "code"): templates,
    ("fault", "entity"): st.none()
    | st.fixed_dictionaries({"type": st.sampled_from(("GPU", "", 1)), "id": templates}),
    ("fault", "entity", "id"): templates,
    ("fault", "nodes"): st.sampled_from(("trigger", "every", "all", "", None)),
    ("fault", "suppresses"): st.none() | st.fixed_dictionaries({"codes": globs, "for": durations}),
    ("fault", "suppresses", "codes"): globs,
    ("fault", "suppresses", "for"): durations,
    ("fault", "action"): st.sampled_from(("NONE", "REPLACE_VM", "none", "", "REBOOT_NOW")),
    ("fault", "component"): st.sampled_from(("NODE", "GPU", "NVSWITCH", "node", "")),
    ("scope",): st.sampled_from(("cluster", "node", "Cluster", "", None)),
    ("id",): st.sampled_from(("p", "P", "-p", "", "x" * 300)) | near(("gpu-repeated-failure",), 2),
}


@st.composite
def changed_fields(draw: st.DrawFn) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """A one-pattern pack with one to three of its meaningful fields set (made where absent) or removed."""
    pack = copy.deepcopy(draw(st.sampled_from(one_pattern_packs())))
    pattern = pack["patterns"][0]
    wheres = draw(st.lists(st.sampled_from(list(FIELDS)), min_size=1, max_size=3, unique=True))
    for where in wheres:
        parent = pattern
        for key in where[:-1]:
            if not isinstance(parent.get(key), dict):
                parent[key] = {}
            parent = parent[key]
        if draw(st.integers(0, 9)) == 0:
            parent.pop(where[-1], None)
        else:
            parent[where[-1]] = draw(FIELDS[where])
    return pack, ("patterns", 0, *wheres[0])


def with_value(where: tuple[str, ...], value: Any, seed: int = 0) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """A seed with one field of its pattern set: an example of `changed_fields` to pin."""
    pack = copy.deepcopy(one_pattern_packs()[seed])
    parent = pack["patterns"][0]
    for key in where[:-1]:
        parent = parent.setdefault(key, {})
    parent[where[-1]] = value
    return pack, ("patterns", 0, *where)


@fuzz(600)
@given(changed_fields())
# Found by this fuzzing: a refusal named pattern '' (no pattern in its message); `null` named 'None'
@example(with_value(("id",), ""))
@example(with_value(("id",), None))
# Found by this fuzzing: a window key value holding \x1f (the key's separator) raised ValueError when
# the window fired (every pack that loads counts such records: here one keyed by two fields)
@example(with_value(("window", "key"), ["gpu", "zone=label:topology.kubernetes.io/zone"]))
def test_window_match_and_fault_fields_near_valid_load_or_are_refused_naming_the_pattern(
    pack_file: Path, mutation: tuple[dict[str, Any], tuple[Any, ...]]
) -> None:
    pack, where = mutation
    for result in check(pack_file, dump(pack)):
        check_names_pattern(result, pack, where)
