"""Fuzzing the simulated GPU backend's inputs (`sources.simulator`): the control records `faultline sim
inject` appends (any JSON, any text), `--field NAME=VALUE` values, and scenario files (the agent's
`--sim-scenario`, YAML an operator writes).

Control records the backend cannot use are passed over, as a driver ignores garbage; a field value is a
name and an integer or a ValueError saying what was expected; a scenario loads, and then runs, or is a
ConfigError naming the file and the event."""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from faultline.errors import ConfigError
from sources import simulator
from tests.unit.fuzzing import NASTY, any_text, fuzz, near

numbers = st.one_of(
    st.integers(-5, 40), st.integers(-(2**70), 2**70), st.floats(), st.sampled_from((0, 1, 2, 79, 10**400))
)


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


records = st.one_of(
    st.fixed_dictionaries(
        {
            "ts": numbers | st.text(max_size=5),
            "gpu": numbers | st.text(max_size=3),
            # (no `hang`: it makes read_fields block for its value in seconds, by design)
            "kind": st.sampled_from(("xid", "lost", "healthy", "field", "reset", ""))
            | any_text.filter(lambda k: k != "hang"),
        },
        optional={
            "value": numbers | st.none() | st.text(max_size=3),
            "name": st.sampled_from(("ecc_dbe_volatile", "pcie_width", "")) | any_text,
        },
    ),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)


# Found by this fuzzing: a record whose gpu or value is Infinity (json's word for it) or whose ts is an
# integer no float holds raised OverflowError out of the backend's read, past the garbage filter.
@fuzz(300)
@given(st.lists(records.map(json.dumps) | st.sampled_from(NASTY) | st.text(max_size=40), max_size=6))
@example(['{"ts": 1, "gpu": Infinity, "kind": "xid", "value": 79}'])
@example(['{"ts": 1' + "0" * 400 + ', "gpu": 0, "kind": "xid", "value": 79}'])
def test_control_records_of_any_shape_are_read_or_passed_over(workdir: Path, lines: list[str]) -> None:
    sim = simulator.SimulatorBackend("gpu-1", directory=workdir, gpus=2)
    try:
        with sim.path.open("a", encoding="utf-8", errors="surrogatepass") as fh:
            fh.write("".join(line.replace("\n", " ") + "\n" for line in lines))
        for event in sim.wait_events(0):
            assert isinstance(event.ts, float) and isinstance(event.gpu, int) and isinstance(event.value, int)
        for values in sim.read_fields().values():
            assert all(isinstance(v, int) for v in values.values())
    finally:
        sim.close()
        sim.path.unlink(missing_ok=True)


def field_or_error(text: str) -> tuple[str, int] | ValueError:
    try:
        return simulator.parse_field(text)
    except ValueError as exc:
        return exc


# Found by this fuzzing: 'x=²' passed str.isdigit() and failed int() with "invalid literal for int()"
@fuzz(2000)
@given(
    any_text
    | st.sampled_from(("ecc_dbe_volatile=1", "x=-3", "x= 7 ", "x=\u00b2", "x=" + "9" * 5000, "=1", "a="))
)
@example("x=\u00b2")
@example("x=" + "9" * 5000)
def test_field_values_parse_or_say_what_was_expected(text: str) -> None:
    result = field_or_error(text)
    if isinstance(result, ValueError):
        assert str(result) == f"field {text!r}: expected NAME=INTEGER, e.g. ecc_dbe_volatile=1"
        return
    name, value = result
    assert simulator.FIELD_NAME.fullmatch(name) and isinstance(value, int)


SCENARIO = [
    {"at": "5s", "gpu": 3, "xid": 79},
    {"at": "20s", "gpu": 1, "field": "ecc_dbe_volatile=1"},
    {"at": "30s", "gpu": 2, "lost": True},
    {"at": "40s", "gpu": 2, "reset": True},
    {"at": "60s", "gpu": 3, "clear": True},
]
leaf = st.one_of(
    st.none(), st.booleans(), numbers, st.sampled_from(NASTY), any_text,
    st.sampled_from(("5s", "-1s", "x=1", "ecc=", "3", "\u00b2", "79")), st.lists(st.integers(), max_size=2),
)  # fmt: skip


@st.composite
def scenarios(draw: st.DrawFn) -> list[Any]:
    """The example scenario with one event changed: a value replaced, a key removed or added, or the
    event replaced by something that is not one."""
    doc = copy.deepcopy(SCENARIO)
    i = draw(st.integers(0, len(doc) - 1))
    op = draw(st.sampled_from(("replace", "replace", "remove", "add", "event")))
    if op == "event":
        doc[i] = draw(leaf)
    else:
        key = draw(st.sampled_from(sorted(doc[i])))
        if op == "remove":
            del doc[i][key]
        elif op == "add":
            doc[i][draw(st.sampled_from(("xid", "field", "lost", "colour")))] = draw(leaf)
        else:
            doc[i][key] = draw(leaf)
    return doc


def scenario_or_error(path: Path) -> list[dict[str, Any]] | ConfigError:
    try:
        return simulator.load_scenario(path)
    except ConfigError as exc:
        return exc


# Found by this fuzzing: a scenario event that was not a mapping, lacked `gpu` or held a value int()
# refuses escaped as AttributeError, KeyError, TypeError or ValueError (the agent's traceback, not an
# error naming the file), and a file that is not UTF-8 or is nested too deep as UnicodeDecodeError or
# RecursionError.
@fuzz(500)
@given(
    scenarios().map(lambda doc: yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)))
    | near(("- {at: 5s, gpu: 3, xid: 79}\n",))
)
@example("- 3\n")
@example("- {at: 5s, xid: 79}\n")
@example("- {at: 5s, gpu: [1], xid: 79}\n")
@example("- {at: 5s, gpu: 3, field: x=\u00b2}\n")
@example("".join(" " * i + "- \n" for i in range(1500)))
def test_scenarios_load_and_run_or_name_the_event(workdir: Path, text: str) -> None:
    path = workdir / "scenario.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    result = scenario_or_error(path)
    if isinstance(result, ConfigError):
        assert str(result).startswith(f"{path}: "), result
        return
    sim = simulator.SimulatorBackend("gpu-2", directory=workdir, gpus=4, scenario=result)
    try:
        sim.wait_events(0)
    finally:
        sim.close()
        sim.path.unlink(missing_ok=True)
