"""Pack loading: every kind of bad pack fails at load naming the file, the pattern and the reason;
user packs override built-ins by id; the compiled matcher's prefilter and timeout behave."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from faultline.errors import PackError
from patterns import compiler, examples, loader, templates
from patterns.schema import parse_duration

GOOD = """
pack: mine
patterns:
  - id: {pid}
    description: a thing
    regex: "{regex}"
    code: THING
    examples:
      match: ["{pos}"]
      no_match: ["nothing"]
"""

WritePack = Callable[[str, str], Path]


def load(directory: Path, *, builtin: bool = False) -> compiler.CompiledPacks:
    return compiler.compile_packs(loader.load([directory], builtin=builtin))


def good(pid: str = "thing", regex: str = "THING (?P<x>\\\\d+)", pos: str = "THING 1") -> str:
    return GOOD.format(pid=pid, regex=regex, pos=pos)


@pytest.mark.parametrize(
    ("text", "pattern_id", "reason"),
    [
        ("pack: x\npatterns: [\n", None, "invalid YAML"),
        ("- just\n- a list\n", None, "must be a YAML mapping"),
        (good().replace("code: THING", "code: THING\n    colour: red"), "thing", "colour: unknown field"),
        (good(regex="THING (?P<x>\\\\d+"), "thing", "invalid regex"),
        (good(regex="THING (?P<x>\\\\d+)", pos="THING x"), "thing", "example does not match"),
        (
            good().replace('no_match: ["nothing"]', 'no_match: ["THING 5"]'),
            "thing",
            "negative example matches",
        ),
        (good().replace("code: THING", "code: T-{y}"), "thing", "group 'y' that the regex does not define"),
        (
            good().replace("code: THING", "code: THING\n    classify: [{table: nope, key: '{x}'}]"),
            "thing",
            "unknown table 'nope'",
        ),
        (good().replace("code: THING", "code: T-{x|shout}"), "thing", "unknown template filter 'shout'"),
        (good().replace("code: THING", "code: THING\n    boot_grace: soon"), "thing", "not a duration"),
        (good().replace("code: THING", "code: ''"), "thing", "needs a `code`"),
        (good(regex="NVRM: (a|aa)+$", pos="NVRM: aa"), "thing", "backtracks catastrophically"),
        (good(regex="(?=x)x\\\\d", pos="x1"), "thing", "cannot derive a prefilter literal"),
        (good() + good().split("patterns:\n")[1], "thing", "duplicate pattern id"),
        (good(pid="Bad Id"), "Bad Id", "String should match pattern"),
        # a code that cannot be a taint value: the node could never be quarantined for it
        (good().replace("code: THING", "code: THING-" + "X" * 58), "thing", "is not a valid taint value"),
        (
            good().replace("code: THING", "code: 'THING-'"),
            "thing",
            "code 'THING-' is not a valid taint value",
        ),
        (
            good().replace("code: THING", "code: 'THING {x}'"),
            "thing",
            "(as 'THING 0', each field taken as 0)",
        ),
        (
            good().replace(
                "code: THING", "code: THING\n    flapping: {count: 2, within: 1h, code: 'FLAP/X'}"
            ),
            "thing",
            "flapping.code: Value error, code 'FLAP/X' is not a valid taint value",
        ),
    ],
)
def test_bad_pack_fails_at_load_with_file_pattern_and_reason(
    write_pack: WritePack, text: str, pattern_id: str | None, reason: str
) -> None:
    directory = write_pack("mine.yaml", text)
    with pytest.raises(PackError) as caught:
        load(directory)
    err = caught.value
    assert err.file == str(directory / "mine.yaml")
    assert err.pattern_id == pattern_id
    assert reason in err.reason
    assert str(err).startswith(str(directory / "mine.yaml"))


def test_missing_pack_directory(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="pack directory does not exist"):
        loader.load([tmp_path / "nope"])


def test_user_pattern_overrides_builtin_by_id(write_pack: WritePack) -> None:
    directory = write_pack(
        "mine.yaml",
        good(pid="gpu-init-failed-node", regex="NVRM: RmInitAdapter failed! (?P<detail>.*)",
             pos="NVRM: RmInitAdapter failed! (0x22)").replace("code: THING", "code: MY-INIT"),
    )  # fmt: skip
    packs = loader.load([directory])
    assert packs.patterns["gpu-init-failed-node"].overrides is not None
    compiled = compiler.compile_packs(packs)
    assert [h.code for h in compiled.match("syslog", "NVRM: RmInitAdapter failed! (0x22)")] == ["MY-INIT"]


def test_user_table_rows_override_builtin_rows(
    write_pack: WritePack, builtin: compiler.CompiledPacks
) -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 43, pid=1, name=x, Ch 00000001"
    (default,) = builtin.match("syslog", line)
    assert (default.fatal, default.action) == (False, "NONE")
    directory = write_pack(
        "mine.yaml", 'pack: mine\ntables:\n  xid:\n    "43": {fatal: true, action: COMPONENT_RESET}\n'
    )
    (hit,) = load(directory, builtin=True).match("syslog", line)
    assert (hit.fatal, hit.action, hit.description) == (True, "COMPONENT_RESET", default.description)


def test_patterns_apply_only_to_their_sources(write_pack: WritePack) -> None:
    compiled = load(
        write_pack("mine.yaml", good().replace("code: THING", "code: THING\n    sources: [journal]"))
    )
    assert compiled.match("syslog", "THING 1") == ()
    assert len(compiled.match("journal", "THING 1")) == 1


def test_example_failures_are_all_reported(write_pack: WritePack) -> None:
    directory = write_pack("a.yaml", good(pid="one", pos="THING x"))
    write_pack("b.yaml", good(pid="two").replace('no_match: ["nothing"]', 'no_match: ["THING 2"]'))
    compiled = compiler.compile_packs(loader.load([directory], builtin=False), check_examples=False)
    failures = examples.run(compiled)
    assert [(Path(f.file).name, f.pattern_id) for f in failures] == [("a.yaml", "one"), ("b.yaml", "two")]


def test_prefilter_literals_are_derived_or_declared(write_pack: WritePack) -> None:
    compiled = load(
        write_pack("mine.yaml", good(regex="foo (?:bar)? THING-X (?P<x>\\\\d+)", pos="foo  THING-X 1"))
    )
    assert compiled.literals == [" THING-X "]
    assert [(s, e) for s, e in compiled.candidate_lines(b"a\nfoo bar THING-X 2\nb THING-Y\n")] == [(2, 19)]


def test_inline_ignore_case_makes_the_prefilter_ignore_case_too(write_pack: WritePack) -> None:
    compiled = load(write_pack("mine.yaml", good(regex="(?i)thing-x (?P<x>\\\\d+)", pos="THING-X 1")))
    assert compiled.literals == ["thing-x "]
    assert compiled.prefilter("a Thing-X 7")  # the regex matches it, so the prefilter must pass it
    assert [h.code for h in compiled.match("journal", "a Thing-X 7")] == ["THING"]
    assert list(compiled.candidate_lines(b"x\nTHING-X 9\n")) == [(2, 11)]


def test_runaway_regex_on_a_hostile_line_is_stopped_and_counted(write_pack: WritePack) -> None:
    # The lookahead keeps this pattern out of RE2, and the load-time probe is switched off here, so
    # only the match timeout stands between a hostile line and a hang.
    text = good(regex="EVIL (?=.)((a|aa)+)$", pos="EVIL aa").replace(
        "code: THING", "code: EVIL\n    prefilter: [EVIL]"
    )
    packs = loader.load([write_pack("evil.yaml", text)], builtin=False)
    compiled = compiler.CompiledPacks(packs, check_backtracking=False)
    started = time.perf_counter()
    assert compiled.match("syslog", "EVIL " + "a" * 60 + "!") == ()
    assert time.perf_counter() - started < 5 * compiler.MATCH_TIMEOUT + 1
    assert compiled.timeouts == 1
    assert len(compiled.match("syslog", "EVIL aa")) == 1


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30s", 30.0), ("10m", 600.0), ("24h", 86400.0), ("1d", 86400.0), (5, 5.0), ("250ms", 0.25)],
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["soon", "-5s", 0, True, "5 weeks"])
def test_bad_durations(value: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


@pytest.mark.parametrize(
    ("raw", "bus", "function"),
    [
        ("0000:3B:00", "0000:3b:00", "0000:3b:00.0"),
        ("PCI:0000:3b:00.1", "0000:3b:00", "0000:3b:00.1"),
        ("00000000:3B:00.0", "0000:3b:00", "0000:3b:00.0"),
        ("3b:00.0", "0000:3b:00", "0000:3b:00.0"),
        ("0008:06:00", "0008:06:00", "0008:06:00.0"),
        ("not-pci", "not-pci", "not-pci"),
    ],
)
def test_pci_normalisation(raw: str, bus: str, function: str) -> None:
    assert templates.pci_bus(raw) == bus
    assert templates.pci_function(raw) == function


def test_templates_render_and_skip_missing_groups() -> None:
    t = templates.Template("XID-{xid|int}/{pci|bus}")
    assert t.render({"xid": "079", "pci": "0000:3B:00"}) == "XID-79/0000:3b:00"
    assert t.render({"xid": "1", "pci": None}) is None
    assert templates.Template("fixed").render({}) == "fixed"
    with pytest.raises(ValueError, match="malformed template"):
        templates.Template("{x")
