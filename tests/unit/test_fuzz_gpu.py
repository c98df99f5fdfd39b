"""Fuzzing the GPU side's parsing: DCGM health incidents (`sources.dcgm`, through the stand-in bindings)
with any system, severity, entity and error code; health-field reads and the lines they become
(`sources.gpu`); the monitor's own health over any sequence of polls; PCI addresses as the templates
normalise them.

A backend's answer is untrusted data: whatever it reports becomes fields of small integers, lines the
packs read, and monitor transitions, and nothing raises in the agent's flow."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from patterns.compiler import CompiledPacks
from patterns.templates import pci_bus, pci_function
from sources import dcgm, gpu, simulator
from tests.unit.fuzzing import NASTY, any_text, fuzz

FAKE = Path(__file__).parent / "fake_dcgm"
ints = st.one_of(
    st.integers(-5, 40), st.integers(-(2**63), 2**64), st.sampled_from((0, 1, 2, 10, 20, 3, 0x800))
)


@pytest.fixture(scope="module")
def backend() -> Iterator[tuple[dcgm.DcgmBackend, dict[str, Any]]]:
    modules = dcgm.load_bindings(FAKE)
    state = modules["dcgm_agent"].STATE
    saved = dict(state)
    b = dcgm.DcgmBackend("localhost:5555", modules)
    yield b, modules
    b.close()
    state.clear()
    state.update(saved)


@fuzz(1000)
@given(st.lists(st.lists(st.tuples(ints, ints, ints, ints, ints), max_size=5), min_size=1, max_size=3))
def test_dcgm_incidents_of_any_shape_become_small_fields_and_lines(
    builtin: CompiledPacks,
    backend: tuple[dcgm.DcgmBackend, dict[str, Any]],
    checks: list[list[tuple[int, ...]]],
) -> None:
    b, modules = backend
    s, state = modules["dcgm_structs"], modules["dcgm_agent"].STATE
    devices = {d.index: d for d in b.devices()}
    previous: dict[int, dict[str, int]] = {}
    for incidents in checks:
        state["incidents"] = [
            s.Incident(system, health, s.ErrorDetail(b"x", code), s.EntityPair(group, entity))
            for system, health, code, group, entity in incidents
        ]
        fields = b.read_fields()
        for index, values in fields.items():
            assert index in devices or index == dcgm.NODE
            for name, value in values.items():
                assert re.fullmatch(r"dcgm_[a-z_]+_(s-?\d+_)?-?\d+", name) and value in (0, 1, 2), (
                    name,
                    value,
                )
        for event in gpu.field_changes(previous, fields, 1.0):
            line = gpu.message(event, devices.get(event.gpu))
            if line is not None:
                for hit in builtin.match("dcgm", line):
                    assert hit.code.startswith("DCGM-") and hit.action, (line, hit)
        previous = fields
    state["incidents"] = []


field_names = st.sampled_from(("lost", "ecc_dbe_volatile", "pcie_replay", "nvlink_down", "thermal_shutdown",
                               "dcgm_pcie_23", "xid", "", "x" * 200)) | any_text  # fmt: skip
reads = st.dictionaries(st.integers(-2, 9), st.dictionaries(field_names, ints, max_size=4), max_size=3)


@fuzz(1000)
@given(reads, reads, st.floats(allow_nan=False))
def test_field_reads_of_any_shape_become_lines(
    builtin: CompiledPacks, before: dict[int, dict[str, int]], after: dict[int, dict[str, int]], ts: float
) -> None:
    devices = {d.index: d for d in simulator.devices_for("gpu-1", 8)}
    for event in gpu.field_changes(before, after, ts):
        if event.kind == "counter":
            assert event.value > 0
        line = gpu.message(event, devices.get(event.gpu))
        if line is not None:
            assert "\n" not in line or "\n" in event.name
            for source in ("nvml", "dcgm"):
                for hit in builtin.match(source, line):
                    assert hit.code, (line, hit)
    for fields in after.values():
        assert gpu.repair_verdict(fields) is None or isinstance(gpu.repair_verdict(fields), str)


@fuzz(1000)
@given(
    st.floats(0, 1e6), st.floats(0, 1e6),
    st.lists(st.tuples(st.floats(0, 1e9), st.none() | st.floats(0, 1e9), st.none() | any_text), max_size=12),
)  # fmt: skip
def test_the_monitor_watch_reports_transitions_only(
    hung: float, unresponsive: float, polls: list[Any]
) -> None:
    watch = gpu.MonitorWatch(hung, unresponsive)
    state = gpu.MONITOR_OK
    for now, running_since, failure in sorted(polls, key=lambda p: p[0]):
        for event in watch.observe(now, running_since, failure):
            assert event.kind == "monitor" and event.gpu == -1 and event.value != state
            assert event.value in (gpu.MONITOR_OK, gpu.MONITOR_UNHEALTHY, gpu.MONITOR_UNRESPONSIVE)
            assert len(event.name) <= 200 and math.isfinite(event.ts)
            state = event.value
            text = gpu.message(event, None)
            assert text is not None and text.startswith("faultline GPU monitor ")
        assert watch.state == state


@fuzz(1500)
@given(
    st.one_of(
        any_text,
        st.sampled_from(NASTY),
        st.from_regex(r"(PCI:)?[0-9a-fA-F]{0,12}:[0-9a-f]{2}:[0-9a-f]{2}(\.\d)?"),
    )
)
def test_pci_addresses_of_any_shape_normalise_without_error(value: str) -> None:
    bus, function = pci_bus(value), pci_function(value)
    assert (pci_bus(bus), pci_function(function)) == (bus, function)  # normal forms stay as they are
    if re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}", bus):  # an address: the same GPU either way
        assert function.startswith(bus + ".") and pci_bus(function) == bus
