"""Following a syslog file through rotation and truncation, and reading kmsg records once each."""

from __future__ import annotations

from pathlib import Path

from sources.follow import KmsgReader, SyslogFollower


def write(path: Path, text: str, mode: str = "a") -> None:
    with path.open(mode, encoding="utf-8") as fh:
        fh.write(text)


def test_follows_appends_partial_lines_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "syslog"
    write(log, "one\ntwo\n")
    follower = SyslogFollower(log)
    assert follower.poll() == ["one", "two"]
    write(log, "thr")
    assert follower.poll() == []  # half a line waits
    write(log, "ee\n")
    assert follower.poll() == ["three"]
    write(log, "four\n")
    log.rename(tmp_path / "syslog.1")  # logrotate: the old file keeps what was written last
    write(tmp_path / "syslog.1", "five\n")
    write(log, "six\n")  # the new file
    assert follower.poll() == ["four", "five", "six"]
    write(log, "", "w")  # copytruncate
    write(log, "seven\n")
    assert follower.poll() == ["seven"]
    follower.close()


def test_resumes_from_its_position_without_duplicates(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    write(log, "a\nb\n")
    first = SyslogFollower(log)
    assert first.poll() == ["a", "b"]
    inode, offset = first.position()
    first.close()
    write(log, "c\n")
    resumed = SyslogFollower(log, inode=inode, offset=offset)
    assert resumed.poll() == ["c"]
    resumed.close()


def test_a_missing_file_is_waited_for(tmp_path: Path) -> None:
    follower = SyslogFollower(tmp_path / "later.log")
    assert follower.poll() == []
    write(tmp_path / "later.log", "x\n")
    assert follower.poll() == ["x"]
    follower.close()


def test_kmsg_records_once_each_and_continuations_skipped(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,100,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        " SUBSYSTEM=pci\n"
        " DEVICE=+pci:0000:3b:00.0\n"
        "4,101,5100000,-;mlx5_core 0000:5e:00.0 ens5np0: Link down\n"
    )
    reader = KmsgReader(kmsg, boot_id="b1")
    assert [r.split(";")[0] for r in reader.poll()] == ["6,100,5000000,-", "4,101,5100000,-"]
    reader.close()
    again = KmsgReader(kmsg, boot_id="b1", last_seq=reader.last_seq)  # a restart
    with kmsg.open("a") as fh:
        fh.write("6,102,5200000,-;NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x56:1474)\n")
    assert [r.split(",")[1] for r in again.poll()] == ["102"]
    again.close()
