"""Preflight checks: a quick look at the GPUs a pod was given, through the same GPU backend interface the
agent uses (NVML, the simulator; DCGM for its diagnostics), and at the kernel log since boot.

    read(backend, expect, ...) -> Readings     I/O: devices, health fields, inventory, kernel-log hits,
                                               DCGM diagnosis (each only when a selected check needs it)
    evaluate(readings, expect) -> [Finding]    pure: what fails, with a code, a message and an action

The checks and what fails them (`faultline.preflight.CHECKS` names them):

    count   fewer (or more) GPUs visible than the pod asked for; a GPU that answers "lost"; a model that is
            not the one asked for (the pod's business, not the node's: no health event)
    remap   remapped_rows_pending, retired_pages_pending (a reset applies them) or remapped_rows_failure
            (no spare rows: the GPU needs replacing)
    ecc     ecc_dbe_volatile > 0: uncorrectable errors since the driver loaded or the GPU was reset
    nvlink  links that exist and are not active (or fewer active than `nvlink_min_active`), and the
            backend's nvlink_down
    pcie    the link narrower than its maximum; slower only with `pcie_generation` (an idle GPU lowers its
            link speed to save power, so the generation is not compared by default)
    xid     a fatal XID, or another fatal GPU line, in the kernel log since boot on one of the pod's GPUs,
            classified by the pattern packs (the XID catalogue): the same verdict the agent reaches. Only
            those whose repair is at least `xid_min_action` (default RESTART_VM): the kernel log keeps a
            line after a GPU reset repaired it, so what a reset fixes is judged by the state it leaves
            (the remap and ecc checks), and what needs a reboot cannot have been fixed in this boot
    dcgm    DCGM diagnostics at the configured level fail a test on one of the pod's GPUs

Codes are PREFLIGHT-<what>, on the GPU's PCI bus id, with the action the agent's own packs give the same
condition (a pending remap: COMPONENT_RESET; a remapping failure: CONTACT_SUPPORT; an XID: its catalogue
row), so a preflight fault is repaired and resolved like the agent's.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from faultline import bounds
from faultline.models import Action
from faultline.preflight import CHECKS, Finding
from patterns.compiler import CompiledPacks
from sources import formats, journal
from sources.dcgm import Diagnosis
from sources.gpu import GpuBackend, GpuDevice, GpuInfo

JOURNAL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Expect:
    """What the pod asked for and how strict to be."""

    checks: tuple[str, ...]
    gpus: int | None = None  # GPUs the pod requested (nvidia.com/gpu); None: not checked
    model: str = ""  # a substring of the model's name, case-insensitive; "": any
    pcie_generation: bool = False
    nvlink_min_active: int | None = None  # set: at least this many active links per GPU
    xid_min_action: Action = Action.RESTART_VM  # kernel-log faults since boot whose repair is at least this


@dataclass(frozen=True)
class KernelHit:
    """A pattern's conclusion about a kernel-log line since boot."""

    code: str
    gpu: str  # PCI bus id
    fatal: bool
    action: str
    line: str


@dataclass
class Readings:
    devices: list[GpuDevice]
    fields: dict[int, dict[str, int]] = field(default_factory=dict)
    inventory: dict[int, GpuInfo] = field(default_factory=dict)
    kernel: list[KernelHit] = field(default_factory=list)
    diagnosis: Diagnosis | None = None


def read(
    backend: GpuBackend,
    expect: Expect,
    *,
    kernel_lines: Callable[[], Iterable[tuple[str, str, bool]]] | None = None,
    compiled: CompiledPacks | None = None,
    diagnose: Callable[[list[str]], Diagnosis] | None = None,
) -> Readings:
    """What the selected checks need. `kernel_lines()`: (source, message, from the kernel) since boot;
    `diagnose(uuids)`: DCGM diagnostics on those GPUs. A backend call may hang (a stuck driver): call this
    from a thread the caller can abandon."""
    checks = set(expect.checks)
    out = Readings(backend.devices())
    if checks & {"count", "remap", "ecc", "nvlink"}:
        out.fields = backend.read_fields()
    if checks & {"count", "nvlink", "pcie"}:
        out.inventory = backend.inventory()
    if "xid" in checks and kernel_lines is not None and compiled is not None:
        buses = {d.pci for d in out.devices}
        for source, message, kernel in kernel_lines():
            hits, _ = compiled.match_line(source, message, kernel)
            for hit in hits:
                if hit.kind == "fault" and hit.entity_type == "GPU" and hit.entity_id in buses:
                    out.kernel.append(KernelHit(hit.code, hit.entity_id, hit.fatal, hit.action, message))
    if "dcgm" in checks and diagnose is not None:
        out.diagnosis = diagnose([d.uuid for d in out.devices])
    return out


def evaluate(readings: Readings, expect: Expect) -> list[Finding]:
    """The findings of the selected checks, in CHECKS order."""
    out: list[Finding] = []
    checks = set(expect.checks)
    by_index = {d.index: d for d in readings.devices}
    if "count" in checks:
        out += _count(readings, expect, by_index)
    for index, fields in sorted(readings.fields.items()):
        device = by_index.get(index)
        if device is None:
            continue
        if "remap" in checks:
            out += _remap(device.pci, fields)
        if "ecc" in checks and fields.get("ecc_dbe_volatile", 0) > 0:
            n = fields["ecc_dbe_volatile"]
            out.append(
                Finding(
                    "ecc",
                    "PREFLIGHT-ECC-DBE",
                    f"{n} uncorrectable ECC errors since the driver loaded or the GPU was last reset",
                    device.pci,
                    Action.COMPONENT_RESET,
                )
            )
    if "nvlink" in checks:
        out += _nvlink(readings, expect, by_index)
    if "pcie" in checks:
        out += _pcie(readings, expect, by_index)
    if "xid" in checks:
        seen = set()
        for hit in readings.kernel:
            actions = list(Action)
            light = actions.index(_action(hit.action)) < actions.index(expect.xid_min_action)
            if not hit.fatal or light or (hit.code, hit.gpu) in seen:
                continue
            seen.add((hit.code, hit.gpu))
            out.append(
                Finding(
                    "xid",
                    f"PREFLIGHT-{hit.code}",
                    f"in the kernel log since boot: {bounds.clip(hit.line, bounds.EXCERPT)}",
                    hit.gpu,
                    _action(hit.action),
                )
            )
    if "dcgm" in checks and readings.diagnosis is not None:
        pci = {d.uuid: d.pci for d in readings.devices}
        for failure in readings.diagnosis.failures:
            test = "".join(c if c.isalnum() else "-" for c in failure.test.upper()).strip("-") or "TEST"
            out.append(
                Finding(
                    "dcgm",
                    f"PREFLIGHT-DCGM-{test}",
                    f"DCGM diagnostic {failure.test!r} failed: {failure.message}",
                    pci.get(failure.uuid, ""),
                    Action.COMPONENT_RESET,
                )
            )
    names = list(CHECKS)
    return sorted(out, key=lambda f: names.index(f.check))


def _action(name: str) -> Action:
    return Action(name) if name in Action.__members__ else Action.CONTACT_SUPPORT


def _count(readings: Readings, expect: Expect, by_index: dict[int, GpuDevice]) -> list[Finding]:
    out = []
    for index, fields in sorted(readings.fields.items()):
        if fields.get("lost") and index in by_index:
            out.append(
                Finding(
                    "count",
                    "PREFLIGHT-GPU-LOST",
                    "the GPU answers 'lost' (fallen off the bus)",
                    by_index[index].pci,
                    Action.RESTART_BM,
                )
            )
    seen = len(readings.devices)
    if expect.gpus is not None and seen != expect.gpus:
        out.append(
            Finding(
                "count",
                "PREFLIGHT-GPU-COUNT",
                f"{seen} GPUs visible, the pod was given {expect.gpus}",
                "",
                Action.RESTART_BM,
            )
        )
    if expect.model:
        for index, info in sorted(readings.inventory.items()):
            if info.model and expect.model.lower() not in info.model.lower() and index in by_index:
                out.append(
                    Finding(
                        "count",
                        "PREFLIGHT-GPU-MODEL",
                        f"model {info.model!r}, the pod asked for {expect.model!r}",
                        by_index[index].pci,
                        Action.NONE,
                        node_fault=False,
                    )
                )
    return out


def _remap(pci: str, fields: dict[str, int]) -> list[Finding]:
    out = []
    if fields.get("remapped_rows_failure", 0):
        out.append(
            Finding(
                "remap",
                "PREFLIGHT-REMAP-FAILED",
                "row remapping failed: no spare rows left",
                pci,
                Action.CONTACT_SUPPORT,
            )
        )
    if fields.get("remapped_rows_pending", 0):
        out.append(
            Finding(
                "remap",
                "PREFLIGHT-REMAP-PENDING",
                "a row remapping waits for a GPU reset",
                pci,
                Action.COMPONENT_RESET,
            )
        )
    if fields.get("retired_pages_pending", 0):
        out.append(
            Finding(
                "remap",
                "PREFLIGHT-PAGES-PENDING",
                "a page retirement waits for a GPU reset",
                pci,
                Action.COMPONENT_RESET,
            )
        )
    return out


def _nvlink(readings: Readings, expect: Expect, by_index: dict[int, GpuDevice]) -> list[Finding]:
    out = []
    for index, device in sorted(by_index.items()):
        info = readings.inventory.get(index)
        down = readings.fields.get(index, {}).get("nvlink_down", 0)
        if info is not None and info.nvlink_active >= 0:
            if expect.nvlink_min_active is not None:
                if info.nvlink_active < expect.nvlink_min_active:
                    out.append(
                        Finding(
                            "nvlink",
                            "PREFLIGHT-NVLINK-DOWN",
                            f"{info.nvlink_active} NVLinks active, "
                            f"at least {expect.nvlink_min_active} expected",
                            device.pci,
                        )
                    )
                continue
            down = max(down, info.nvlink_inactive)
        if down > 0:
            out.append(Finding("nvlink", "PREFLIGHT-NVLINK-DOWN", f"{down} NVLinks down", device.pci))
    return out


def _pcie(readings: Readings, expect: Expect, by_index: dict[int, GpuDevice]) -> list[Finding]:
    out = []
    for index, device in sorted(by_index.items()):
        info = readings.inventory.get(index)
        if info is None:
            continue
        if info.pcie_width and info.pcie_width_max and info.pcie_width < info.pcie_width_max:
            out.append(
                Finding(
                    "pcie",
                    "PREFLIGHT-PCIE-WIDTH",
                    f"PCIe link x{info.pcie_width}, its maximum is x{info.pcie_width_max}",
                    device.pci,
                    Action.RESTART_BM,
                )
            )
        if (
            expect.pcie_generation
            and info.pcie_gen
            and info.pcie_gen_max
            and info.pcie_gen < info.pcie_gen_max
        ):
            out.append(
                Finding(
                    "pcie",
                    "PREFLIGHT-PCIE-GEN",
                    f"PCIe link Gen{info.pcie_gen}, its maximum is Gen{info.pcie_gen_max}",
                    device.pci,
                    Action.RESTART_BM,
                )
            )
    return out


# -- the kernel log since boot -----------------------------------------------------------------------------


def journal_lines(
    *, directory: Path | None = None, file: Path | None = None, journalctl: str = "journalctl"
) -> list[tuple[str, str, bool]]:
    """The kernel's journal entries of the current boot, read to the end (the agent's command, without
    --follow)."""
    argv = [
        a for a in journal.command(file=file, directory=directory, journalctl=journalctl) if a != "--follow"
    ]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=JOURNAL_TIMEOUT_S, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OSError(f"reading the journal ({' '.join(argv[:1])}): {exc}") from exc
    if done.returncode != 0:
        error = bounds.clip(done.stderr.decode("utf-8", "replace").strip(), bounds.ERROR_TEXT)
        raise OSError(f"journalctl exited {done.returncode}: {error}")
    out = []
    for raw in done.stdout.splitlines():
        entry = journal.parse(raw)
        if entry is not None:
            out.append(("journal", entry.record.message, entry.record.kernel))
    return out


def kmsg_lines(path: Path = Path("/dev/kmsg")) -> list[tuple[str, str, bool]]:
    """The records of a kmsg device (the kernel's ring buffer: this boot's, as far back as it holds) or
    of a file of kmsg records."""
    ctx = formats.Context(formats.YearGuess(1970, 1))
    out = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        data = b""
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break  # the device's end: no record left
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten while reading; go on
                    continue
                raise
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    for raw in data.decode("utf-8", "replace").splitlines():
        if not raw or raw.startswith(" "):
            continue  # continuation lines carry key=value context
        parsed = formats.parse_kmsg(raw, ctx)
        if parsed is not None:
            out.append(("kmsg", parsed.message, parsed.kernel))
    return out
