"""The disk spool: order, durability across reopen and crashes, one owner."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ablab.streaming.kafka.spool import Spool, SpoolLockedError, SpoolRecord


def records(n: int, start: int = 0) -> list[SpoolRecord]:
    return [SpoolRecord("ablab.rum", f"k{i}".encode(), f'{{"i":{i},"txt":"é\\n\\t"}}'.encode()) for i in range(start, start + n)]


def read_all(spool: Spool) -> list[SpoolRecord]:
    spool.seal()
    return [r for path in spool.sealed_segments() for r in spool.read_segment(path)]


def test_records_come_back_byte_exact_and_in_order(tmp_path) -> None:
    spool = Spool(tmp_path, segment_bytes=500)  # forces many segments
    written = records(50)
    for chunk in range(0, 50, 7):
        spool.append_many(written[chunk:chunk + 7])
    assert spool.pending == 50
    assert read_all(spool) == written
    assert len(spool.sealed_segments()) > 3
    spool.close()


def test_none_key_and_non_ascii_survive(tmp_path) -> None:
    spool = Spool(tmp_path)
    record = SpoolRecord("ablab.deadletter", None, "{\"raw\":\"\u00ff\u4e2d\"}".encode())
    spool.append(record)
    assert read_all(spool) == [record]
    spool.close()


def test_reopen_sees_pending_records_and_appends_after_them(tmp_path) -> None:
    spool = Spool(tmp_path)
    spool.append_many(records(10))
    spool.close()
    reopened = Spool(tmp_path)
    assert reopened.pending == 10
    reopened.append_many(records(5, start=10))
    assert [int(r.key[1:]) for r in read_all(reopened)] == list(range(15))
    reopened.close()


def test_deleting_acknowledged_segments_empties_the_spool(tmp_path) -> None:
    spool = Spool(tmp_path, segment_bytes=200)
    spool.append_many(records(3))
    spool.append_many(records(3, start=3))
    spool.seal()
    for path in spool.sealed_segments():
        spool.delete_segment(path, records=len(spool.read_segment(path)))
    assert spool.empty() and spool.sealed_segments() == []
    spool.close()


def test_a_second_owner_is_refused(tmp_path) -> None:
    spool = Spool(tmp_path)
    with pytest.raises(SpoolLockedError, match="in use"):
        Spool(tmp_path)
    spool.close()
    Spool(tmp_path).close()  # free again once closed


def test_killed_writer_loses_nothing_already_appended(tmp_path) -> None:
    """SIGKILL a process right after it appends (fsync=never): the OS still has the data."""
    script = textwrap.dedent(f"""
        import os, signal
        from ablab.streaming.kafka.spool import Spool, SpoolRecord
        spool = Spool({str(tmp_path)!r}, fsync="never")
        for i in range(1000):
            spool.append(SpoolRecord("t", b"k", b'{{"i":%d}}' % i))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == -9
    spool = Spool(tmp_path)
    assert spool.pending == 1000
    assert [r.value for r in read_all(spool)] == [b'{"i":%d}' % i for i in range(1000)]
    spool.close()


def test_torn_last_line_is_skipped_and_counted(tmp_path) -> None:
    spool = Spool(tmp_path)
    spool.append_many(records(3))
    spool.close()
    segment = sorted(tmp_path.glob("seg-*.jsonl"))[-1]
    with open(segment, "ab") as handle:
        handle.write(b'{"topic":"ablab.rum","key":"k9","val')  # a crash mid-write
    spool = Spool(tmp_path)
    assert spool.pending == 3
    assert len(read_all(spool)) == 3 and spool.corrupt_lines == 1
    spool.close()


def test_bad_fsync_policy_is_named(tmp_path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        Spool(tmp_path, fsync="sometimes")  # type: ignore[arg-type]
    assert not os.path.exists(tmp_path / ".lock")
