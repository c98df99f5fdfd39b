"""The agent's kernel-log matching (sources.entry_match) over issue 14's corpus: records assembled
within and across batches, in the journal, a syslog file and kmsg, and user-space lines never a fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataflows import node
from faultline import metrics
from patterns import compiler
from sources import entry_match, follow, formats, journal
from tests.corpus import corpus

# an agent with syslog_trusted (its file is one only the kernel writes): the corpus's syslog kernel lines count
CTX = formats.Context(
    formats.YearGuess(corpus.YEAR, 12, fixed=True), boot_base=float(corpus.BOOT), syslog_trusted=True
)
WRITERS = {w.name: w for w in corpus.WRITERS}
# what a match shows without the detector: every family's code and entity (thresholds come later)
WANT = {(f.fault[1], f.fault[2]) for f in corpus.FAMILIES}


def _entries(fmt: str, tmp_path: Path) -> list[journal.Entry]:
    writer = WRITERS[fmt]
    data = corpus.render(writer)
    if fmt == "json":
        return [e for line in data.splitlines() if (e := journal.parse(line)) is not None]
    if fmt == "kmsg":  # as the agent's kmsg reader hands them over (dictionary lines dropped)
        path = tmp_path / "kmsg"
        path.write_bytes(data)
        lines = [r for raw in data.decode().splitlines() if (r := follow.KmsgReader(path)._accept(raw))]
    else:  # the syslog follower, polling the file
        path = tmp_path / "syslog"
        path.write_bytes(data)
        follower = follow.SyslogFollower(path)
        lines = follower.poll()
        follower.close()
    out = []
    for i, line in enumerate(lines):
        parsed = formats.parse_line(fmt, line, CTX)
        assert parsed is not None, line
        out.append(journal.Entry(f"c{i}", parsed[1]))
    return out


@pytest.mark.parametrize("fmt", ["json", "rfc3164", "kmsg"])
@pytest.mark.parametrize("batch", [1, 2, 3, 1000])
def test_the_agent_finds_every_family_in_batches_of_any_size(
    builtin: compiler.CompiledPacks, tmp_path: Path, fmt: str, batch: int
) -> None:
    entries = _entries(fmt, tmp_path)
    matcher = entry_match.EntryMatcher(builtin, formats.SOURCE_OF_FORMAT[fmt], 1)
    hits = [t for i in range(0, len(entries), batch) for t in matcher(entries[i : i + batch])]
    got = {(t.hit.entity_id, t.hit.code) for t in hits}
    extra = {(f.fault[1], f.fault[2]) for f in WRITERS[fmt].extra}
    assert got == WANT | extra
    fallen = [t for t in hits if t.hit.code == "GPU-FELL-OFF-BUS" and t.hit.entity_id == "0000:b3:00"]
    assert len(fallen) == 1  # one record, one match, whatever the batches
    assert not [t for t in hits if t.hit.entity_id in corpus.SPOOFED_ENTITIES]
    assert matcher.untrusted == len(corpus.SPOOFED)


def test_a_record_left_open_at_the_end_of_a_batch_is_finished_by_the_next(
    builtin: compiler.CompiledPacks,
) -> None:
    matcher = entry_match.EntryMatcher(builtin, "journal", 1)
    lines = [*corpus.FALLEN, "nfs: server storage-1 OK"]
    entries = [
        journal.Entry(f"c{i}", formats.Parsed(1e9 + i * 0.001, "h", m, None)) for i, m in enumerate(lines)
    ]
    assert matcher(entries[:1]) == []
    assert matcher(entries[1:2]) == []
    done = matcher(entries[2:])
    assert [(t.hit.code, t.hit.entity_id, t.ts) for t in done] == [("GPU-FELL-OFF-BUS", "0000:b3:00", 1e9)]
    assert matcher([]) == []


def test_a_late_line_does_not_continue_a_record(builtin: compiler.CompiledPacks) -> None:
    matcher = entry_match.EntryMatcher(builtin, "journal", 1)
    times = [0.0, 0.5, 30.0]  # the last line comes long after: not the same record
    entries = [
        journal.Entry(f"c{i}", formats.Parsed(1e9 + t, "h", m, None))
        for i, (t, m) in enumerate(zip(times, corpus.FALLEN, strict=True))
    ]
    assert matcher(entries) == []


def test_untrusted_lines_count_in_the_agent_metric(builtin: compiler.CompiledPacks) -> None:
    counter = metrics.UNTRUSTED_LINES.labels(source="syslog")
    before = counter._value.get()
    spoof = formats.parse_line("rfc3164", "Dec  1 10:00:00 h logger: " + corpus.SPOOFED[0][0], CTX)
    real = formats.parse_line("rfc3164", "Dec  1 10:00:01 h kernel: " + corpus.SPOOFED[0][0], CTX)
    assert spoof is not None and real is not None
    hits = node._entry_matcher(builtin, "syslog", 1)(
        [journal.Entry("a", spoof[1]), journal.Entry("b", real[1])]
    )
    assert [(t.hit.code, t.ts) for t in hits] == [("XID-79", real[1].ts)]
    assert counter._value.get() == before + 1


@pytest.mark.redteam
def test_a_forged_kernel_tag_counts_untrusted_in_an_untrusted_syslog_file(
    builtin: compiler.CompiledPacks,
) -> None:
    """`logger -t kernel -p kern.crit 'NVRM: Xid ... 79'` in an agent's default syslog file: no hit, counted."""
    counter = metrics.UNTRUSTED_LINES.labels(source="syslog")
    before = counter._value.get()
    default = formats.Context(CTX.year, CTX.boot_base)
    forged = formats.parse_line("rfc3164", "<2>Dec  1 10:00:01 h kernel: " + corpus.SPOOFED[0][0], default)
    assert forged is not None
    assert node._entry_matcher(builtin, "syslog", 1)([journal.Entry("a", forged[1])]) == []
    assert counter._value.get() == before + 1


@pytest.mark.parametrize(("trusted", "kernel"), [(False, False), (True, True)])
def test_the_agents_syslog_follower_believes_kernel_tags_only_where_trusted(
    tmp_path: Path, trusted: bool, kernel: bool
) -> None:
    """The agent's `syslog_trusted`: off, a `kernel:` tag (and a dmesg-looking line) in the file is no one's."""
    path = tmp_path / "kern.log"
    path.write_text(
        f"<2>Dec  1 10:00:01 h kernel: {corpus.SPOOFED[0][0]}\n"
        f"2026-12-01T10:00:02.000001+00:00 h kernel: {corpus.SPOOFED[0][0]}\n"
        f"[    5.000000] {corpus.SPOOFED[0][0]}\n"
    )
    source = follow.LogFollowSource("syslog", path, interval=0.0, syslog_trusted=trusted)
    part = source.build_part("syslog", "syslog", None)
    try:
        entries = part.next_batch()
    finally:
        part.close()
    assert [e.record.kernel for e in entries] == [kernel] * 3
