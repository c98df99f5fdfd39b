"""The kernel-log corpus of issue 14: every fault family in every log format faultline reads.

    python -m tests.corpus.corpus        # rewrite the files in logs/ (they are committed)

Each family is the kernel's own message text (see PROVENANCE.md for where each text and each format
comes from) and the fault it must give. Each format writes every family the way that format carries
it: multi-line records as the format splits them (separate syslog lines, one journal entry per line or
one entry holding newlines, dmesg's indented continuation lines, kmsg's escaped newlines, rsyslog's
#012), among lines of other programs, and user-space lines that look like the kernel's (`SPOOFED`),
which must never be a fault. `tests/e2e/test_corpus.py` replays the files and checks that they are
what this module writes.
"""

from __future__ import annotations

import calendar
import json
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOGS = HERE / "logs"
T0 = calendar.timegm((2026, 12, 1, 10, 0, 0, 0, 0, 0))
BOOT = T0 - 3600  # replay with --boot-time 2026-12-01T09:00:00 for the formats stamped since boot
YEAR = 2026


@dataclass(frozen=True)
class Family:
    """One kernel record (one line, or several when the driver prints it over several) and the fault
    it must give: (entity type, entity id, code, fatal, action)."""

    name: str
    lines: tuple[str, ...]
    fault: tuple[str, str, str, bool, str]
    repeat: int = 1  # matches needed (a pattern with a threshold)


FALLEN = (
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
)
FAMILIES = (
    Family("gpu-fell-off-bus, multi-line", FALLEN, ("GPU", "0000:b3:00", "GPU-FELL-OFF-BUS", True, "RESTART_BM")),
    Family(
        "XID 154, recovery action",
        ("NVRM: Xid (PCI:0000:19:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",),
        ("GPU", "0000:19:00", "XID-154", True, "RESTART_BM"),
    ),
    Family(
        "XID 145, padded NVLink5 fields",
        ("NVRM: Xid (PCI:0008:06:00): 145, RLW_SRC_TRACK    Nonfatal    XC1   i0   Link 10 (0x04082907 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",),
        ("GPU", "0008:06:00", "XID-145", False, "NONE"),
    ),
    Family(
        "XID 149, padded NVLink5 fields",
        ("NVRM: Xid (PCI:0018:01:00): 149, NETIR_INT  Fatal   XC0 i0 Link -1",),
        ("GPU", "0018:01:00", "XID-149", True, "COMPONENT_RESET"),
    ),
    Family(
        "XID 13, GPC and TPC",
        ("NVRM: Xid (PCI:0000:b1:00): 13, pid=52044, name=train.py, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",),
        ("GPU", "0000:b1:00", "XID-13", False, "RESTART_APP"),
    ),
    Family(
        "XID 74, link hardware bits",
        ("NVRM: Xid (PCI:0000:ba:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",),
        ("GPU", "0000:ba:00", "XID-74", True, "CONTACT_SUPPORT"),
    ),
    Family(
        "XID 79, 8-digit domain and odd punctuation",
        ("NVRM: Xid (PCI:00000000:3C:00): 79; GPU has fallen off the bus.",),
        ("GPU", "0000:3c:00", "XID-79", True, "RESTART_BM"),
    ),
    Family(
        "mlx5 health poll",
        ("mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss count",),
        ("NIC", "0000:41:00.0", "NIC-HEALTH-COMPROMISED", True, "RESTART_BM"),
    ),
    Family(
        "mlx5 firmware fatal syndrome",
        ("mlx5_core 0000:41:00.1: print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error",),
        ("NIC", "0000:41:00.1", "NIC-FW-FATAL", True, "RESTART_BM"),
    ),
    Family(
        "mlx5 PCI reads failing",
        ("mlx5_core 0000:61:00.1: mlx5_health_try_recover:381:(pid 1): health recovery flow aborted, PCI reads still not working",),
        ("NIC", "0000:61:00.1", "NIC-PCI-READS-FAILED", True, "RESTART_BM"),
    ),
    Family(
        "mlx5 command timeout",
        ("mlx5_core 0000:03:00.0: wait_func:964:(pid 112): ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource",),
        ("NIC", "0000:03:00.0", "NIC-CMD-TIMEOUT", False, "NONE"),
    ),
    Family(
        "mlx5 PCIe slot power",
        ("mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe slot (27W).",),
        ("NIC", "0000:5c:00.0", "NIC-PCI-POWER-INSUFFICIENT", False, "CONTACT_SUPPORT"),
    ),
    Family(
        "mlx5 high temperature",
        ("mlx5_core 0000:61:00.0: temp_warn:171:(pid 0): High temperature on sensors with bit set 0 8000000000000001",),
        ("NIC", "0000:61:00.0", "NIC-HIGH-TEMPERATURE", False, "CONTACT_SUPPORT"),
    ),
    Family(
        "port module error, newer kernels' port_module prefix",
        ("mlx5_core 0000:5e:00.0: port_module:254:(pid 0): Port module event[error]: module 0, Cable error, High Temperature",),
        ("NIC", "0000:5e:00.0", "NIC-MODULE-ERROR", False, "CONTACT_SUPPORT"),
    ),
    Family(
        "port module cable unplugged, no prefix",
        ("mlx5_core 0000:5e:00.1: Port module event: module 1, Cable unplugged",),
        ("NIC", "0000:5e:00.1", "NIC-CABLE-UNPLUGGED", False, "CONTACT_SUPPORT"),
    ),
    Family(
        "transmit watchdog",
        ("NETDEV WATCHDOG: enp175s0f1np1 (mlx5_core): transmit queue 5 timed out 5120 ms",),
        ("NIC", "enp175s0f1np1", "NIC-TX-TIMEOUT", False, "NONE"),
    ),
    Family(
        "mlx5e transmit timeout",
        ("mlx5_core 0000:af:00.0 enp175s0f0np0: TX timeout detected",),
        ("NIC", "0000:af:00.0", "NIC-TX-TIMEOUT", False, "NONE"),
    ),
    Family(
        "mlx5 register access failures",
        ("mlx5_core 0000:56:00.0: mlx5_cmd_out_err:838:(pid 1234): ACCESS_REG(0x805) op_mod(0x1) failed, status bad parameter(0x3), syndrome (0x6b92b8), err(-22)",),
        ("NIC", "0000:56:00.0", "NIC-REG-ACCESS-FAILED", False, "CONTACT_SUPPORT"),
        repeat=5,
    ),
    Family(
        "EFA admin queue",
        ("efa 0000:00:1d.0 rdmap0s29: The device didn't send any completion for admin cmd CREATE_QP(1) status 1 (ctx: 0x00000000a1b2c3d4, sq producer: 12, sq consumer: 11, cq consumer: 11)",),
        ("NIC", "0000:00:1d.0", "NIC-EFA-ADMIN-QUEUE", True, "RESTART_VM"),
    ),
    # issue 27: the formats real drivers write besides the ones above
    Family(
        "EFA admin queue closed, RDMA class prefix",
        ("infiniband rdmap0s6: Admin queue is closed",),
        ("NIC", "rdmap0s6", "NIC-EFA-ADMIN-QUEUE", True, "RESTART_VM"),
    ),
    Family(
        "EFA reset failed during probe, (null) device",
        ("(null): Reset indication didn't turn on",),
        ("NIC", "efa", "NIC-EFA-RESET-FAILED", True, "RESTART_VM"),
    ),
    Family(
        "EFA unknown async event",
        ("efa 0000:00:06.0 efa_0: Unknown event was received or event with unimplemented handler",),
        ("NIC", "0000:00:06.0", "NIC-EFA-UNKNOWN-EVENT", False, "CONTACT_SUPPORT"),
    ),
    Family(
        "ENA reset failed",
        ("ena 0000:00:05.0: Reset attempt failed. Can not reset the device",),
        ("NIC", "0000:00:05.0", "NIC-ENA-RESET-FAILED", True, "RESTART_VM"),
    ),
    Family(
        "mlx5 command without done completion",
        ("mlx5_core 0000:56:00.1: wait_func_handle_exec_timeout:1062:(pid 871): cmd[13]: MODIFY_CQ(0x403) No done completion",),
        ("NIC", "0000:56:00.1", "NIC-CMD-TIMEOUT", False, "NONE"),
    ),
    Family(
        "mlx5 health recovery failed",
        ("mlx5_core 0000:41:00.0: mlx5_health_try_recover:390:(pid 1122): health recovery failed",),
        ("NIC", "0000:41:00.0", "NIC-RECOVERY-FAILED", True, "RESTART_BM"),
    ),
    Family(
        "InfiniBand port down (RDMA core)",
        ("mlx5_core 0000:42:00.0 mlx5_1: Port: 1 Link DOWN",),
        ("NIC", "0000:42:00.0", "NIC-LINK-DOWN", False, "NONE"),
    ),
    Family(
        "transmit watchdog, newer kernels' device prefix",
        ("mlx5_core 0000:b0:00.0 enp176s0np0: NETDEV WATCHDOG: CPU: 3: transmit queue 5 timed out 5120 ms",),
        ("NIC", "0000:b0:00.0", "NIC-TX-TIMEOUT", False, "NONE"),
    ),
    Family(
        "PCIe AER fatal on a GPU with its register dump",
        (
            "nvidia 0000:c1:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Transaction Layer, (Receiver ID)",
            "nvidia 0000:c1:00.0:   device [10de:2330] error status/mask=00040000/00000000",
            "nvidia 0000:c1:00.0:    [18] MalfTLP                (First)",
        ),
        ("GPU", "0000:c1:00", "PCIE-AER-FATAL", True, "RESTART_BM"),
    ),
    Family(
        "PCIe AER on a GPU with no driver bound (5.x wording)",
        (
            "pci 0000:c2:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)",
            "pci 0000:c2:00.0:   device [10de:2330] error status/mask=00004000/00000000",
            "pci 0000:c2:00.0:    [14] CmpltTO                (First)",
        ),
        ("GPU", "0000:c2:00", "PCIE-AER-FATAL", True, "RESTART_BM"),
    ),
    Family(
        "PCIe AER non-fatal on a NIC",
        ("mlx5_core 0000:5e:00.1: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)",),
        ("NIC", "0000:5e:00.1", "PCIE-AER-NON-FATAL", False, "CONTACT_SUPPORT"),
    ),
    Family(
        "PCIe DPC containment",
        ("pcieport 0000:00:03.1: DPC: containment event, status:0x1f05, ERR_FATAL received from 0000:c1:00.0",),
        ("PCIE", "0000:00:03.1", "PCIE-DPC-CONTAINMENT", True, "RESTART_BM"),
    ),
    Family(
        "PCIe recovery failed",
        ("pcieport 0000:00:05.1: AER: device recovery failed",),
        ("PCIE", "0000:00:05.1", "PCIE-RECOVERY-FAILED", True, "RESTART_BM"),
    ),
    Family(
        "PCIe hotplug surprise link down",
        ("pcieport 0000:00:1c.0: pciehp: Slot(3): Link Down",),
        ("PCIE", "0000:00:1c.0", "PCIE-SLOT-DOWN", True, "CONTACT_SUPPORT"),
    ),
    Family(
        "fallen off the bus, PCI: address form",
        ("NVRM: GPU PCI:0000:d1:00: GPU has fallen off the bus.",),
        ("GPU", "0000:d1:00", "GPU-FELL-OFF-BUS", True, "RESTART_BM"),
    ),
    Family(
        "fallen off the bus, garbled XID number",
        ("NVRM: Xid (PCI:0000:d2:00): 7g9, GPU has fallen off the bus.",),
        ("GPU", "0000:d2:00", "GPU-FELL-OFF-BUS", True, "RESTART_BM"),
    ),
    Family(
        "GPU reset failed",
        ("NVRM: GPU 0000:d3:00.0: MC prepare for XVE reset failed.",),
        ("GPU", "0000:d3:00", "GPU-RESET-FAILED", True, "RESTART_BM"),
    ),
    Family(
        "NVLink training failed (postRxDetLinkMask)",
        ("NVRM: knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's postRxDetLinkMask failed!",),
        ("GPU", "", "GPU-NVLINK-TRAINING-FAILED", True, "RESTART_BM"),
    ),
    Family(
        "XID 145 Non-Fatal in capitals",
        ("NVRM: Xid (PCI:0008:07:00): 145, RLW_SRC_TRACK Non-Fatal XC1 i0 Link 10 (0x04082907 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",),
        ("GPU", "0008:07:00", "XID-145", False, "NONE"),
    ),
    Family(
        "fatal machine check",
        ("mce: [Hardware Error]: CPU 12: Machine Check Exception: 5 Bank 4: b200000000070005",),
        ("NODE", "", "NODE-MCE-FATAL", True, "CONTACT_SUPPORT"),
    ),
    Family(
        "NVMe controller down",
        ("nvme nvme1: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff",),
        ("DISK", "nvme1", "NODE-NVME-CONTROLLER-DOWN", True, "CONTACT_SUPPORT"),
    ),
    Family(
        "disk I/O error",
        ("I/O error, dev nvme2n1, sector 104857600 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2",),
        ("DISK", "nvme2n1", "NODE-DISK-IO-ERROR", False, "NONE"),
    ),
    Family(
        "file system remounted read-only",
        ("EXT4-fs (nvme0n1p1): Remounting filesystem read-only",),
        ("FILESYSTEM", "nvme0n1p1", "NODE-FS-READ-ONLY", True, "RESTART_BM"),
    ),
    Family(
        "hung task",
        ("INFO: task python3:48211 blocked for more than 122 seconds.",),
        ("NODE", "", "NODE-HUNG-TASK", False, "NONE"),
    ),
    Family(
        "EFA admin timeout before the device is renamed (efa_0)",
        ("efa_0: The device didn't send any completion for admin cmd GET_FEATURE(11) status 0 (id: 0, sq producer: 1, sq consumer: 0, cq consumer: 0)",),
        ("NIC", "efa_0", "NIC-EFA-ADMIN-QUEUE", True, "RESTART_VM"),
    ),
    Family(
        "EFA probe failed",
        ("efa 0000:00:07.0: EFA device init failed",),
        ("NIC", "0000:00:07.0", "NIC-EFA-INIT-FAILED", True, "RESTART_VM"),
    ),
    Family(
        "EFA admin command failed",
        ("efa 0000:00:08.0 rdmap0s8: Failed to process command REG_MR (opcode 9) err -12",),
        ("NIC", "0000:00:08.0", "NIC-EFA-CMD-FAILED", False, "NONE"),
    ),
    Family(
        "ENA keep-alive timeout",
        ("ena 0000:00:06.0 eth1: Keep alive watchdog timeout.",),
        ("NIC", "0000:00:06.0", "NIC-ENA-KEEP-ALIVE", False, "NONE"),
    ),
    Family(
        "mlx5 unrecoverable error without a PCI address",
        ("print_health_info:458:(pid 0): synd 0x8: unrecoverable hardware error",),
        ("NIC", "mlx5", "NIC-FW-FATAL", True, "RESTART_BM"),
    ),
    Family(
        "mlx5 port module event without the device prefix",
        ("mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 2, Cable error, High Temperature",),
        ("NIC", "module 2", "NIC-MODULE-ERROR", False, "CONTACT_SUPPORT"),
    ),
    Family(
        "mlx5 insufficient PCIe power, no wattage",
        ("mlx5_core 0000:5d:00.0: mlx5_pcie_event:287:(pid 11): Detected insufficient power on the PCIe slot.",),
        ("NIC", "0000:5d:00.0", "NIC-PCI-POWER-INSUFFICIENT", False, "CONTACT_SUPPORT"),
    ),
    Family(
        "PCIe AER, device inaccessible",
        ("nvidia 0000:c3:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Inaccessible, (Unregistered Agent ID)",),
        ("GPU", "0000:c3:00", "PCIE-AER-FATAL", True, "RESTART_BM"),
    ),
    Family(
        "SXid Nonfatal",
        ("nvidia-nvswitch3: SXid (PCI:0000:c4:00.0): 12028, Nonfatal, Link 46 egress non-posted PRIV error",),
        ("NVSWITCH", "0000:c4:00", "SXID-12028", False, "NONE"),
    ),
    Family(
        "NVMe command timeout, 6.x wording",
        ("nvme nvme3: I/O tag 28 (401c) opcode 0x2 (Read) QID 5 timeout, aborting req_op:READ(0) size:131072",),
        ("DISK", "nvme3", "NODE-NVME-TIMEOUT", False, "NONE"),
    ),
    Family(
        "XFS shut down",
        ("XFS (nvme4n1): Filesystem has been shut down due to log error (0x2).",),
        ("FILESYSTEM", "nvme4n1", "NODE-FS-READ-ONLY", True, "RESTART_BM"),
    ),
    Family(
        "hard lockup, 7.x prefix",
        ("watchdog: CPU3: Watchdog detected hard LOCKUP on cpu 5",),
        ("NODE", "", "NODE-LOCKUP", True, "RESTART_BM"),
    ),
    Family(
        "soft lockup",
        ("watchdog: BUG: soft lockup - CPU#17 stuck for 23s! [nv_queue:1422]",),
        ("NODE", "", "NODE-SOFT-LOCKUP", False, "NONE"),
    ),
)  # fmt: skip
# What user space writes to look like the kernel: never a fault (entities 0000:aa:00, 0000:ab:00).
SPOOFED = (
    ("NVRM: Xid (PCI:0000:aa:00): 79, pid=1, name=x, GPU has fallen off the bus.",),
    ("NVRM: The NVIDIA GPU 0000:ab:00.0", "NVRM: installed in this system has", "NVRM: fallen off the bus and is not responding to commands."),
)  # fmt: skip
SPOOFED_ENTITIES = {"0000:aa:00", "0000:ab:00"}
NOISE = (
    ("systemd", 1, "Started session-42.scope - Session 42 of User ubuntu."),
    ("kubelet", 1861, 'I1201 10:00:00.000000 1861 kubelet.go:2410] "SyncLoop (PLEG): event for pod"'),
    ("containerd", 902, 'time="2026-12-01T10:00:00Z" level=info msg="StartContainer returns successfully"'),
)


@dataclass
class Event:
    ts: float
    lines: tuple[str, ...]
    app: str = "kernel"  # the writer: "kernel" or a user-space program
    pid: int = 0


@dataclass
class Writer:
    """One format: how to write a kernel record, with its continuation lines, and a user-space one."""

    name: str
    suffix: str
    write: Callable[[list[Event], str], bytes]
    extra: list[Family] = field(default_factory=list)  # families only this format can carry
    origin: bool = True  # the format says who wrote a line (dmesg does not)


def events(extra: list[Family], *, spoofs: bool) -> list[Event]:
    out: list[Event] = []
    t = T0
    for family in (*FAMILIES, *extra):
        for _ in range(family.repeat):
            t += 30
            out.append(Event(t, family.lines))
            app, pid, text = NOISE[len(out) % len(NOISE)]
            out.append(Event(t + 0.000002, (text,), app, pid))
    if spoofs:
        for lines in SPOOFED:
            t += 30
            out.append(Event(t, lines, "logger", 4242))
    return out


def _stamp3164(ts: float) -> str:
    d = datetime.fromtimestamp(ts, tz=UTC)
    return f"{calendar.month_abbr[d.month]} {d.day:2d} {d:%H:%M:%S}"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="microseconds")


def _tag(e: Event) -> str:
    return "kernel" if e.app == "kernel" else f"{e.app}[{e.pid}]"


def syslog_lines(render: Callable[[float, Event, str], str]) -> Callable[[list[Event], str], bytes]:
    """Syslog formats: a record over several lines is several lines (the kernel's syslog interface
    splits it), a microsecond apart, with another program's line between (a merged stream)."""

    def write(evs: list[Event], host: str) -> bytes:
        out = []
        for e in evs:
            for i, line in enumerate(e.lines):
                out.append(render(e.ts + i * 1e-6, e, line))
                if i == 0 and len(e.lines) > 1:  # another program writes between the record's lines
                    out.append(render(e.ts, Event(e.ts, (), "systemd", 1), "Started fstrim.service."))
        return ("\n".join(out) + "\n").encode()

    return write


def rfc3164(ts: float, e: Event, line: str, host: str = "node-rfc3164") -> str:
    return f"{_stamp3164(ts)} {host} {_tag(e)}: {line}"


def iso(ts: float, e: Event, line: str, host: str = "node-iso") -> str:
    return f"{_iso(ts)} {host} {_tag(e)}: {line}"


def rfc5424(ts: float, e: Event, line: str, host: str = "node-rfc5424") -> str:
    # PRI: the kernel logs with facility kern (0), user space with user (1)
    pri = 6 if e.app == "kernel" else 14
    procid = "-" if e.app == "kernel" else str(e.pid)
    return f"<{pri}>1 {_iso(ts)} {host} {e.app} {procid} - - {line}"


def write_iso(evs: list[Event], host: str) -> bytes:
    """rsyslog's file format; one more record written whole, its newlines escaped as #012."""
    text = syslog_lines(iso)(evs, host).decode()
    folded = "#012".join(line.replace("b3:00", "b7:00") for line in FALLEN)
    return (text + iso(T0 + 5000, Event(T0 + 5000, ()), folded) + "\n").encode()


def _journal_fields(e: Event, host: str, message: str, ts: float) -> dict[str, str]:
    kernel = e.app == "kernel"
    fields = {
        "__CURSOR": f"s=4b1d3c2a;i={int(ts * 1e6):x}",
        "__REALTIME_TIMESTAMP": str(int(ts * 1e6)),
        "__MONOTONIC_TIMESTAMP": str(int((ts - BOOT) * 1e6)),
        "_BOOT_ID": "4b1d3c2a9e8f4d7c8b6a5f4e3d2c1b0a",
        "_HOSTNAME": host,
        "PRIORITY": "3" if kernel else "6",
        "SYSLOG_FACILITY": "0" if kernel else "1",
        # journald sets _TRANSPORT itself; `logger -t kernel` can fake the identifier, not the transport
        "SYSLOG_IDENTIFIER": "kernel",
        "_TRANSPORT": "kernel" if kernel else "syslog",
        "MESSAGE": message,
    }
    if kernel:
        fields["_SOURCE_MONOTONIC_TIMESTAMP"] = fields["__MONOTONIC_TIMESTAMP"]
    else:
        fields["_PID"] = str(e.pid)
        fields["_COMM"] = e.app
    return fields


def write_json(evs: list[Event], host: str) -> bytes:
    """`journalctl -o json`: each line of a multi-line record its own entry; one more record held
    whole in one entry (newlines inside MESSAGE)."""
    out = []
    for e in evs:
        for i, line in enumerate(e.lines):
            out.append(json.dumps(_journal_fields(e, host, line, e.ts + i * 1e-6)))
    whole = "\n".join(line.replace("b3:00", "b6:00") for line in FALLEN)
    out.append(json.dumps(_journal_fields(Event(T0 + 5000, ()), host, whole, T0 + 5000)))
    return ("\n".join(out) + "\n").encode()


def write_export(evs: list[Event], host: str) -> bytes:
    """`journalctl -o export`: a multi-line record is one entry whose MESSAGE (with its newlines) is a
    binary field: 64-bit little-endian length, then the bytes."""
    out = bytearray()
    for e in evs:
        fields = _journal_fields(e, host, "\n".join(e.lines), e.ts)
        for key, value in fields.items():
            raw = value.encode()
            if "\n" in value:
                out += key.encode() + b"\n" + struct.pack("<Q", len(raw)) + raw + b"\n"
            else:
                out += key.encode() + b"=" + raw + b"\n"
        out += b"\n"
    return bytes(out)


def _uptime(ts: float) -> str:
    return f"[{ts - BOOT:12.6f}] "


def _dmesg_t(ts: float) -> str:
    d = datetime.fromtimestamp(ts, tz=UTC)
    return f"[{d:%a %b} {d.day:2d} {d:%H:%M:%S %Y}] "


def dmesg(stamp: Callable[[float], str]) -> Callable[[list[Event], str], bytes]:
    """dmesg: a record over several lines has its continuation lines indented under the first line's
    text (util-linux dmesg). dmesg shows no writer, so only kernel records are written."""

    def write(evs: list[Event], host: str) -> bytes:
        out = []
        for e in evs:
            if e.app != "kernel":
                continue
            prefix = stamp(e.ts)
            out.append(prefix + e.lines[0])
            out.extend(" " * len(prefix) + line for line in e.lines[1:])
        return ("\n".join(out) + "\n").encode()

    return write


_LEVELS = ("emerg", "alert", "crit", "err", "warn", "notice", "info", "debug")


def _decode(ts: float, e: Event) -> str:
    """`dmesg --decode`: facility and level names, each padded (util-linux prints `%-6s:%-6s: `)."""
    return f"{'kern' if e.app == 'kernel' else 'user':<6}:{_LEVELS[3 if e.app == 'kernel' else 5]:<6}: "


def dmesg_with_origin(
    prefix: Callable[[float, Event], str], stamp: Callable[[float], str]
) -> Callable[[list[Event], str], bytes]:
    """dmesg forms that print each record's facility (`--decode`, `-r`): user-space records appear too
    (what `logger` wrote to /dev/kmsg, facility user), and only kern is the kernel's. Continuation lines
    are indented under the first line's text."""

    def write(evs: list[Event], host: str) -> bytes:
        out = []
        for e in evs:
            head = prefix(e.ts, e) + stamp(e.ts)
            out.append(head + e.lines[0])
            out.extend(" " * len(head) + line for line in e.lines[1:])
        return ("\n".join(out) + "\n").encode()

    return write


def _raw(ts: float, e: Event) -> str:
    """`dmesg -r`: the record's priority, facility * 8 + level (kern 0, user 1)."""
    return "<3>" if e.app == "kernel" else "<13>"


def _caller(ts: float) -> str:
    """The kernel's console form with a printk caller id (CONFIG_PRINTK_CALLER): `[ 1.5][  T896] `."""
    return f"[{ts - BOOT:12.6f}][{'T' + str(896 + int(ts) % 7):>6}] "


def _iso_dmesg(ts: float) -> str:
    d = datetime.fromtimestamp(ts, tz=UTC)
    return f"{d:%Y-%m-%dT%H:%M:%S},{d.microsecond:06d}+00:00 "


def write_kmsg(evs: list[Event], host: str) -> bytes:
    """/dev/kmsg records `prio,seq,usec,flags;text`: a record's newlines are escaped as \\x0a, the
    priority carries the facility (kern 0; what user space writes to /dev/kmsg has user, 1)."""
    out = []
    for seq, e in enumerate(evs, start=100):
        prio = 3 if e.app == "kernel" else 8 + 6
        out.append(f"{prio},{seq},{int((e.ts - BOOT) * 1e6)},-;" + "\\x0a".join(e.lines))
        if e.app == "kernel" and e.lines[0].startswith("mlx5_core"):
            out.append(" SUBSYSTEM=pci")  # the record's dictionary (continuation lines of kmsg)
            out.append(" DEVICE=+pci:" + e.lines[0].split()[1].rstrip(":"))
    return ("\n".join(out) + "\n").encode()


WRITERS = (
    Writer("rfc3164", "syslog", syslog_lines(rfc3164)),
    Writer("iso", "log", write_iso, [Family("rsyslog #012", (), ("GPU", "0000:b7:00", "GPU-FELL-OFF-BUS", True, "RESTART_BM"))]),
    Writer("rfc5424", "rfc5424.log", syslog_lines(rfc5424)),
    Writer("json", "json", write_json, [Family("journal entry with newlines", (), ("GPU", "0000:b6:00", "GPU-FELL-OFF-BUS", True, "RESTART_BM"))]),
    Writer("export", "export", write_export),
    Writer("dmesg", "dmesg", dmesg(_uptime), origin=False),
    Writer("dmesg-T", "dmesg", dmesg(_dmesg_t), origin=False),
    Writer("kmsg", "kmsg", write_kmsg),
    Writer("dmesg-decode", "dmesg", dmesg_with_origin(_decode, _uptime)),
    Writer("dmesg-decode-T", "dmesg", dmesg_with_origin(_decode, _dmesg_t)),
    Writer("dmesg-raw", "dmesg", dmesg_with_origin(_raw, _uptime)),
    Writer("dmesg-iso", "dmesg", dmesg(_iso_dmesg), origin=False),
    Writer("dmesg-caller", "dmesg", dmesg(_caller), origin=False),
)  # fmt: skip


def node_of(writer: Writer) -> str:
    return f"node-{writer.name}"


def file_of(writer: Writer) -> str:
    return f"{node_of(writer)}.{writer.suffix}"


def expected(writer: Writer) -> set[tuple[str, str, str, bool, str]]:
    return {f.fault for f in (*FAMILIES, *writer.extra)}


def render(writer: Writer) -> bytes:
    # extra families are written by the writer itself; only the shared ones become events
    return writer.write(events([], spoofs=writer.origin), node_of(writer))


def main() -> int:
    for writer in WRITERS:
        LOGS.mkdir(exist_ok=True)
        (LOGS / file_of(writer)).write_bytes(render(writer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
