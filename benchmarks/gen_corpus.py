"""Generates syslog/journal/dmesg corpora for faultline replay.

    python benchmarks/gen_corpus.py sample DIR           # the committed sample corpus (every pack, every format)
    python benchmarks/gen_corpus.py large FILE --lines N # a realistic large corpus for benchmarks/replay.py

Output is deterministic for a given seed.  The large corpus is written streaming, so N can be huge.
"""

from __future__ import annotations

import argparse
import calendar
import gzip
import json
import random
import struct
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

T0 = calendar.timegm((2026, 11, 30, 8, 0, 0, 0, 0, 0))
MONTHS = [m for m in calendar.month_abbr if m]

NOISE = [
    ("systemd[1]", "Started session-{n}.scope - Session {n} of User ubuntu."),
    ("systemd[1]", "Finished logrotate.service - Rotate log files."),
    (
        "sshd[{pid}]",
        "Accepted publickey for ubuntu from 10.20.{a}.{b} port {port} ssh2: ED25519 SHA256:qk3v9x",
    ),
    ("sshd[{pid}]", "pam_unix(sshd:session): session closed for user ubuntu"),
    ("CRON[{pid}]", "(root) CMD (/usr/lib/sysstat/debian-sa1 1 1)"),
    (
        "kubelet[{pid}]",
        'I1130 08:00:00.000000 {pid} kubelet.go:2410] "SyncLoop (PLEG): event for pod" pod="train/job-{n}-worker-0"',
    ),
    (
        "kubelet[{pid}]",
        'I1130 08:00:00.000000 {pid} prober.go:107] "Probe succeeded" probeType="Readiness" pod="kube-system/dcgm-exporter-{n}"',
    ),
    (
        "containerd[{pid}]",
        'time="2026-11-30T08:00:00Z" level=info msg="StartContainer for \\"{hex}\\" returns successfully"',
    ),
    ("kernel", "[{up}] IPv6: ADDRCONF(NETDEV_CHANGE): veth{hex6}: link becomes ready"),
    ("kernel", "[{up}] cni0: port {a}(veth{hex6}) entered forwarding state"),
    ("nvidia-persistenced[{pid}]", "device 0000:{bus}:00.0 - persistence mode enabled."),
    ("chronyd[{pid}]", "Selected source 10.0.0.{a} (ntp.internal)"),
    (
        "systemd-journald[{pid}]",
        "Data hash table of /var/log/journal/{hex}/system.journal has a fill level at 75.0",
    ),
    (
        "dockerd[{pid}]",
        'time="2026-11-30T08:00:00Z" level=warning msg="cleaning up after shim disconnected" id={hex}',
    ),
]
GPU_BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def noise(rng: random.Random) -> tuple[str, str]:
    tag, msg = rng.choice(NOISE)
    fill = {
        "n": rng.randint(1, 99999), "pid": rng.randint(300, 65000), "a": rng.randint(1, 254),
        "b": rng.randint(1, 254), "port": rng.randint(1024, 65535), "hex": f"{rng.getrandbits(64):016x}",
        "hex6": f"{rng.getrandbits(24):06x}", "up": f"{rng.uniform(10, 90000):12.6f}", "bus": rng.choice(GPU_BUSES),
    }  # fmt: skip
    return tag.format(**fill), msg.format(**fill)


def xid(bus: str, code: int, text: str, pid: int = 4242, proc: str = "python3") -> str:
    return f"NVRM: Xid (PCI:0000:{bus}:00): {code}, pid={pid}, name={proc}, {text}"


# ---- writers ----------------------------------------------------------------------------------------
def rfc3164(ts: float, host: str, tag: str, msg: str) -> str:
    t = datetime.fromtimestamp(ts, tz=UTC)
    return f"{MONTHS[t.month - 1]} {t.day:2d} {t:%H:%M:%S} {host} {tag}: {msg}"


def iso(ts: float, host: str, tag: str, msg: str) -> str:
    t = datetime.fromtimestamp(ts, tz=UTC)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond:06d}+00:00 {host} {tag}: {msg}"


def rfc5424(ts: float, host: str, tag: str, msg: str) -> str:
    t = datetime.fromtimestamp(ts, tz=UTC)
    app = tag.split("[", maxsplit=1)[0]
    return f"<4>1 {t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z {host} {app} - - - {msg}"


def journal_fields(ts: float, host: str, tag: str, msg: str, boot: float) -> dict[str, str]:
    app = tag.split("[", maxsplit=1)[0]
    fields = {
        "__REALTIME_TIMESTAMP": str(int(ts * 1e6)),
        "__MONOTONIC_TIMESTAMP": str(int((ts - boot) * 1e6)),
        "_BOOT_ID": "4b1d3c2a9e8f4d7c8b6a5f4e3d2c1b0a",
        "_HOSTNAME": host,
        "SYSLOG_IDENTIFIER": app,
        "MESSAGE": msg,
    }
    if app == "kernel":
        fields["_TRANSPORT"] = "kernel"
        fields["SYSLOG_FACILITY"] = "0"  # journald's, with the transport: what says the kernel wrote it
        fields["_SOURCE_MONOTONIC_TIMESTAMP"] = fields["__MONOTONIC_TIMESTAMP"]
    return fields


Event = tuple[float, str, str]  # (time, tag, message)


def with_noise(rng: random.Random, events: list[Event], start: float, end: float, n: int) -> list[Event]:
    out = list(events)
    for _ in range(n):
        tag, msg = noise(rng)
        out.append((rng.uniform(start, end), tag, msg))
    return sorted(out, key=lambda e: e[0])


# ---- the sample corpus ------------------------------------------------------------------------------
def scenario_node01(t: float) -> list[Event]:
    """RFC 3164: boot, link-down inside boot grace, XID 79 with its 'fallen off the bus' twin and 154,
    an XID 13 burst that escalates, an XID 45 flood, NIC flapping, then a reboot that clears the 79."""
    k = "kernel"
    ev: list[Event] = [
        (t, k, "[    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02-amd64-115) #45-Ubuntu SMP")
    ]
    ev.append((t + 40, k, "[   40.100000] mlx5_core 0000:0c:00.0 ibp12s0: Link down"))
    ev.append((t + 45, k, "[   45.100000] mlx5_core 0000:0c:00.0 ibp12s0: Link up"))
    for i in range(6):  # XID 13 on one GPU: escalates at the 5th within an hour
        ev.append(
            (
                t + 600 + i * 300,
                k,
                xid(
                    "3a",
                    13,
                    "Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address",
                    51200,
                    "train.py",
                ),
            )
        )
    for i in range(40):  # an XID 45 flood from job teardown: one fault, count 40
        ev.append((t + 3000 + i * 0.5, k, xid("5d", 45, "Ch 00000010", 51200 + i % 4, "train.py")))
    for i in range(4):  # NIC flapping: 4 down/up cycles in 8 minutes
        ev.append((t + 4000 + i * 120, k, "mlx5_core 0000:0c:00.1 ibp12s1: Link down"))
        ev.append((t + 4030 + i * 120, k, "mlx5_core 0000:0c:00.1 ibp12s1: Link up"))
    ev.append((t + 7200, k, xid("9a", 79, "GPU has fallen off the bus.", 51200, "train.py")))
    ev.append((t + 7200.2, k, "NVRM: GPU 0000:9a:00.0: GPU has fallen off the bus."))
    ev.append(
        (
            t + 7201,
            k,
            "NVRM: Xid (PCI:0000:9a:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        )
    )
    ev.append(
        (t + 9000, k, "[    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02-amd64-115) #45-Ubuntu SMP")
    )
    ev.append((t + 9040, k, "[   40.200000] mlx5_core 0000:0c:00.0 ibp12s0: Link down"))
    return ev


def scenario_node02(t: float) -> list[Event]:
    """ISO syslog: DBE (XID 48) followed by a row remap (XID 63), an uncontained error with its reset, XID 94."""
    k = "kernel"
    return [
        (
            t + 100,
            k,
            xid(
                "18",
                48,
                "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
            ),
        ),
        (t + 160, k, xid("18", 63, "Row Remapper: New row marked for remapping, reset gpu to activate.")),
        (
            t + 161,
            k,
            "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
        ),
        (t + 900, k, xid("2a", 95, "Uncontained: SM 0 ECC DBE, channel 0x0000004b")),
        (t + 901, k, xid("2a", 45, "Ch 0000004b")),
        # user space's line (nvidia-smi in a reset job): no evidence of a repair, it clears nothing
        (t + 1500, "nvidia-reset[7711]", "GPU 00000000:2A:00.0 was successfully reset."),
        (t + 2000, k, xid("ab", 94, "Contained: SM 3 ECC DBE, RST: No, channel 0x00000012")),
    ]


def scenario_node03(t: float) -> list[Event]:
    """Journal JSON: NVSwitch SXids of every severity, a thermal start/end pair and an NVLink XID 74."""
    k = "kernel"
    return [
        (
            t + 50,
            k,
            "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
        ),
        (
            t + 51,
            k,
            "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate",
        ),
        (t + 52, k, "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 12021, Correctable, Link 04 ingress SBE"),
        (t + 300, k, "nvidia-nvswitch2: SXid (PCI:0000:c2:00.0): 10004, Thermal event start"),
        (t + 420, k, "nvidia-nvswitch2: SXid (PCI:0000:c2:00.0): 10005, Thermal event end"),
        (
            t + 600,
            k,
            xid("ba", 74, "NVLink: fatal error detected on link 14(0x100000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"),
        ),
    ]


def scenario_node04(t: float) -> list[Event]:
    """Journal export: driver init failure, GSP RPC timeouts, a 154 asking for a reset, a GPU AER fatal error."""
    k = "kernel"
    return [
        (t + 20, k, "NVRM: GPU 0000:db:00.0: RmInitAdapter failed! (0x26:0x56:1474)"),
        (
            t + 700,
            k,
            xid(
                "5d",
                119,
                "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
            ),
        ),
        (
            t + 760,
            k,
            xid(
                "5d",
                119,
                "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
            ),
        ),
        (
            t + 761,
            k,
            "NVRM: Xid (PCI:0000:5d:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        ),
        (
            t + 1200,
            k,
            "nvidia 0000:3a:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
        ),
    ]


def scenario_node05(t: float) -> list[Event]:
    """dmesg (--time-format iso): NVLink5 XIDs with the severity in the line, one injected."""
    return [
        (
            t + 10,
            "kernel",
            "NVRM: Xid (PCI:0008:06:00): 145, RLW_REMAP Fatal XC0 i0 Link 03 (0x00040406 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)",
        ),
        (
            t + 20,
            "kernel",
            "NVRM: Xid (PCI:0009:06:00): 149, NETIR_BER_EVENT Nonfatal XC1 i0 Link 12 (0x00000016 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)",
        ),
        (
            t + 30,
            "kernel",
            "NVRM: Xid (PCI:0018:06:00): 146, TLW_RX_PIPE0 Fatal XC0 i1 Link 07 (0x00000004 0x00000004 0x00000000 0x00000000 0x00000000 0x00000000)",
        ),
    ]


def scenario_node06(t: float) -> list[Event]:
    """kmsg records (microseconds since boot): an XID 64 and a 'fallen off the bus' with no XID."""
    return [
        (t + 5, "kernel", xid("3a", 64, "Row Remapper: Failed to remap a row, reset gpu to activate.")),
        (t + 15, "kernel", "NVRM: GPU 0000:ab:00.0: GPU has fallen off the bus."),
    ]


def scenario_node07(t: float) -> list[Event]:
    """RFC 5424 across rotated files: NIC module error, cable unplugged then plugged, NIC AER fatal error."""
    k = "kernel"
    return [
        (
            t + 100,
            k,
            "mlx5_core 0000:5e:00.0: mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, Bus stuck (I2C or data shorted)",
        ),
        (
            t + 5000,
            k,
            "mlx5_core 0000:5e:00.1: mlx5_port_module_event:1110:(pid 0): Port module event: module 1, Cable unplugged",
        ),
        (
            t + 5600,
            k,
            "mlx5_core 0000:5e:00.1: mlx5_port_module_event:1110:(pid 0): Port module event: module 1, Cable plugged",
        ),
        (
            t + 9000,
            k,
            "mlx5_core 0000:5e:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)",
        ),
    ]


def write_text(path: Path, lines: list[str], gz: bool = False) -> None:
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if gz:
        path.write_bytes(gzip.compress(data, mtime=0))
    else:
        path.write_bytes(data)


def write_export(path: Path, records: list[dict[str, str]]) -> None:
    out = bytearray()
    for rec in records:
        for key, value in rec.items():
            raw = value.encode("utf-8")
            if "\n" in value:
                out += key.encode() + b"\n" + struct.pack("<Q", len(raw)) + raw + b"\n"
            else:
                out += f"{key}=".encode() + raw + b"\n"
        out += b"\n"
    path.write_bytes(bytes(out))


def sample(directory: Path, seed: int = 7) -> int:
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    total = 0
    span = 4 * 3600

    def render(events: list[Event], host: str, writer: Callable[[float, str, str, str], str]) -> list[str]:
        return [writer(ts, host, tag, msg) for ts, tag, msg in events]

    for name, host, scen, writer, n in (
        ("gpu-node-01.syslog", "gpu-node-01", scenario_node01, rfc3164, 900),
        ("gpu-node-02.log", "gpu-node-02", scenario_node02, iso, 500),
    ):
        lines = render(with_noise(rng, scen(T0), T0, T0 + span, n), host, writer)
        write_text(directory / name, lines)
        total += len(lines)
    boot = T0 - 3600
    events = with_noise(rng, scenario_node03(T0), T0, T0 + span, 400)
    json_lines = [json.dumps(journal_fields(ts, "gpu-node-03", tag, msg, boot)) for ts, tag, msg in events]
    write_text(directory / "gpu-node-03.json", json_lines)
    total += len(json_lines)
    events = with_noise(rng, scenario_node04(T0), T0, T0 + span, 300)
    records = [journal_fields(ts, "gpu-node-04", tag, msg, boot) for ts, tag, msg in events]
    records[3]["MESSAGE"] = "multi-line\nmessage stored as a binary field"
    write_export(directory / "gpu-node-04.export", records)
    total += len(records)
    events = with_noise(rng, scenario_node05(T0), T0, T0 + 600, 200)
    dmesg = []
    for ts, _tag, msg in events:
        t = datetime.fromtimestamp(ts, tz=UTC)
        body = msg.split("] ", 1)[1] if msg.startswith("[") else msg
        dmesg.append(f"{t:%Y-%m-%dT%H:%M:%S},{t.microsecond:06d}+00:00 {body}")
    write_text(directory / "gpu-node-05.dmesg", dmesg)
    total += len(dmesg)
    kboot = calendar.timegm((2026, 11, 30, 0, 0, 0, 0, 0, 0))  # tests pass --boot-time 2026-11-30T00:00:00
    events = with_noise(rng, scenario_node06(kboot + 3600), kboot + 3600, kboot + 4200, 150)
    kmsg = []
    for seq, (ts, _tag, msg) in enumerate(events):
        body = msg.split("] ", 1)[1] if msg.startswith("[") else msg
        kmsg.append(f"6,{seq + 1000},{int((ts - kboot) * 1e6)},-;{body}")
    write_text(directory / "gpu-node-06.kmsg", kmsg)
    total += len(kmsg)
    events = with_noise(rng, scenario_node07(T0), T0, T0 + 3 * span, 600)
    lines = render(events, "gpu-node-07", rfc5424)
    third = len(lines) // 3
    write_text(directory / "gpu-node-07.syslog.2.gz", lines[:third], gz=True)
    write_text(directory / "gpu-node-07.syslog.1", lines[third : 2 * third])
    write_text(directory / "gpu-node-07.syslog", lines[2 * third :])
    total += len(lines)
    return total


# ---- the large corpus -------------------------------------------------------------------------------
def large_lines(n: int, *, seed: int = 11, gpu_share: float = 0.03, nodes: int = 64) -> Iterator[str]:
    """A day of logs from `nodes` hosts: mostly noise, `gpu_share` GPU/NIC lines of which most come in
    floods (XID 45 teardown bursts, XID 13 storms, link flaps) and a few are one-off hard faults."""
    rng = random.Random(seed)
    hosts = [f"gpu-node-{i:03d}" for i in range(nodes)]
    step = 86400.0 / max(n, 1)
    t = T0
    flood: list[str] = []
    i = 0
    while i < n:
        t += step
        host = hosts[i % nodes]
        if flood:
            line = rfc3164(t, host, "kernel", flood.pop())
        elif rng.random() < gpu_share / 20:
            bus = rng.choice(GPU_BUSES)
            kind = rng.random()
            if kind < 0.4:
                flood = [xid(bus, 45, f"Ch {rng.randint(1, 64):08x}")] * rng.randint(10, 40)
            elif kind < 0.7:
                flood = [
                    xid(bus, 13, "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address")
                ] * rng.randint(5, 30)
            elif kind < 0.9:
                nic = f"ibp{rng.randint(1, 16)}s0"
                flood = [
                    f"mlx5_core 0000:0c:00.0 {nic}: Link {'up' if j % 2 else 'down'}"
                    for j in range(rng.randint(4, 20))
                ]
            else:
                flood = [rng.choice([
                    xid(bus, 79, "GPU has fallen off the bus."),
                    xid(bus, 48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."),
                    "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
                    f"NVRM: GPU 0000:{bus}:00.0: RmInitAdapter failed! (0x26:0x56:1474)",
                ])]  # fmt: skip
            line = rfc3164(t, host, "kernel", flood.pop())
        else:
            tag, msg = noise(rng)
            line = rfc3164(t, host, tag, msg)
        yield line
        i += 1


def large(path: Path, n: int, *, seed: int = 11, gpu_share: float = 0.03, nodes: int = 64) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf: list[str] = []
    with path.open("w", encoding="utf-8") as fh:
        for line in large_lines(n, seed=seed, gpu_share=gpu_share, nodes=nodes):
            buf.append(line)
            if len(buf) >= 65536:
                fh.write("\n".join(buf) + "\n")
                buf.clear()
        if buf:
            fh.write("\n".join(buf) + "\n")
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="write the sample corpus into DIR")
    s.add_argument("dir", type=Path)
    s.add_argument("--seed", type=int, default=7)
    g = sub.add_parser("large", help="write a large RFC 3164 corpus to FILE")
    g.add_argument("file", type=Path)
    g.add_argument("--lines", type=int, default=1_000_000)
    g.add_argument("--gpu-share", type=float, default=0.03, help="share of GPU/NIC lines (default 3%%)")
    g.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    if args.cmd == "sample":
        n = sample(args.dir, args.seed)
        print(f"wrote {n} lines of sample corpus to {args.dir}", file=sys.stderr)
    else:
        n = large(args.file, args.lines, seed=args.seed, gpu_share=args.gpu_share)
        print(f"wrote {n} lines to {args.file}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
