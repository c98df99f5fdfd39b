"""Fuzzing the NIC source's reading of sysfs (`sources.nic`): whatever the port files hold (any bytes, not
UTF-8, numbers no int() takes, huge counters), a poll reports changes as the messages the `nic` pack
reads and never raises: a file it cannot make sense of is no evidence. The files live in a real
directory tree, rewritten for each example."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from patterns.compiler import CompiledPacks
from sources.nic import IB_COUNTERS, NicWatcher
from tests.unit.fuzzing import NASTY, fuzz

PORTS = ("mlx5_0/1", "mlx5_1/1")
IFACES = ("eth0", "ens1")
MESSAGE = re.compile(r"nic (mlx5_[01]/1|eth0|ens1): (link (up|down)|counter (\w+) \+[1-9][0-9]*)")


@pytest.fixture(scope="module")
def sysfs() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        for port in PORTS:
            dev, num = port.split("/")
            (root / "class" / "infiniband" / dev / "ports" / num / "counters").mkdir(parents=True)
        for iface in IFACES:
            (root / "class" / "net" / iface / "device").mkdir(parents=True)
        yield root


contents = st.one_of(
    st.sampled_from(
        (
            b"4: ACTIVE\n",
            b"1: DOWN\n",
            b"0\n",
            b"1\n",
            b"7\n",
            b"up\n",
            b"down\n",
            b"unknown\n",
            b"18446744073709551615\n",
            b"\xb2\n",
            "\u00b2\n".encode(),
            "\u0663\n".encode(),
            b"",
        )
    ),
    st.sampled_from(NASTY).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.binary(max_size=12),
    st.integers(0, 10**30).map(lambda n: f"{n}\n".encode()),
)
FILES = (
    *(f"class/infiniband/{p.split('/')[0]}/ports/1/state" for p in PORTS),
    *(f"class/infiniband/{p.split('/')[0]}/ports/1/counters/{c}" for p in PORTS for c in IB_COUNTERS),
    *(f"class/net/{i}/{f}" for i in IFACES for f in ("carrier", "operstate")),
)


@fuzz(600)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(FILES), contents | st.none(), max_size=8), min_size=1, max_size=3
    )
)
@example([{FILES[2]: b"\xff\xfe\n"}])  # not UTF-8: UnicodeDecodeError
@example([{FILES[2]: "\u00b2\n".encode()}, {FILES[2]: b"3\n"}])  # '²'.isdigit(), int('²') refuses it
def test_polls_report_changes_from_any_file_content(
    builtin: CompiledPacks, sysfs: Path, polls: list[dict[str, bytes | None]]
) -> None:
    watcher = NicWatcher(sysfs)
    for changes in polls:
        for name, data in changes.items():
            path = sysfs / name
            if data is None:
                path.unlink(missing_ok=True)  # a file that went away (a port removed)
            else:
                path.write_bytes(data)
        for message in watcher.poll():
            m = MESSAGE.fullmatch(message)
            assert m, message
            for hit in builtin.match("nic", message):  # the port it is about, as the NIC entity
                assert (hit.component, hit.entity_type, hit.entity_id) == ("NIC", "NIC", m.group(1)), (
                    message,
                    hit,
                )
