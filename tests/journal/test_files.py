"""File-fragment journals: offsets, ordering, locking across processes, roll-over, crash recovery."""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from pathlib import Path

import pytest
from journal_helpers import ndjson, read_all, run_proc, start_proc

from zcluster.journal import FileJournals
from zcluster.journal._filefmt import OPEN_NAME, find_fragment, parse_fragment_name
from zcluster.message import JournalExistsError, JournalNotFoundError, OffsetOutOfRangeError


@pytest.fixture
def fj(tmp_path: Path) -> FileJournals:
    with FileJournals(tmp_path / "root", fragment_bytes=256) as j:
        yield j


def fragments(d: Path) -> list[tuple[int, int]]:
    out = []
    for p in d.iterdir():
        r = parse_fragment_name(p.name)
        if r is not None:
            out.append(r[:2])
    return sorted(out)


def test_create_list_info_and_errors(fj: FileJournals) -> None:
    fj.create(ndjson("pv/part-000", topic="pv"), {"owner": "me"})
    fj.create(ndjson("pv/part-001", topic="pv"))
    fj.create(ndjson("other", topic="x"))
    assert [s.name for s in fj.list("topic=pv")] == ["pv/part-000", "pv/part-001"]
    assert [s.name for s in fj.list("")] == ["other", "pv/part-000", "pv/part-001"]
    info = fj.info("pv/part-000")
    assert info.metadata == {"owner": "me"} and info.labels["topic"] == "pv"
    fj.update_metadata("pv/part-000", {"description": "d"})
    assert fj.info("pv/part-000").metadata == {"owner": "me", "description": "d"}
    with pytest.raises(JournalExistsError, match="already exists"):
        fj.create(ndjson("pv/part-000"))
    with pytest.raises(JournalExistsError, match="inside journal"):
        fj.create(ndjson("other/sub"))
    with pytest.raises(JournalExistsError, match="collides"):
        fj.create(ndjson("pv"))
    with pytest.raises(ValueError, match="content-type"):
        fj.create(ndjson("x").__class__("y", {}))
    with pytest.raises(ValueError, match="segment"):
        fj.create(ndjson("../escape"))
    with pytest.raises(JournalNotFoundError, match="nope"):
        fj.append("nope", b"x")
    fj.destroy("pv/part-000")
    fj.destroy("pv/part-001")
    assert [s.name for s in fj.list("")] == ["other"]
    assert not (fj.root / "pv").exists()


def test_appends_are_ordered_with_byte_offsets_and_roll_over_by_size(fj: FileJournals) -> None:
    fj.create(ndjson("j"))
    expected = b""
    for i in range(200):
        data = b"m%d\n" % i
        r = fj.append("j", data)
        assert (r.begin, r.end) == (len(expected), len(expected) + len(data))
        expected += data
    assert fj.end("j") == len(expected)
    assert read_all(fj, "j") == expected
    assert read_all(fj, "j", 777) == expected[777:]
    frags = fragments(fj.root / "j")
    assert len(frags) == 3
    assert all(a[1] == b[0] for a, b in itertools.pairwise(frags)) and frags[0][0] == 0
    for b, e in frags:  # each fragment holds whole appends, hence whole lines
        data = (fj.root / "j" / find_fragment(fj.root / "j", b, e)).read_bytes()
        assert data == expected[b:e] and data.endswith(b"\n")
    with pytest.raises(OffsetOutOfRangeError):
        fj.read("j", len(expected) + 1)
    n = len(expected)
    many = fj.append_many("j", [b"a", b"bc", b""])
    assert [(r.begin, r.end) for r in many] == [(n, n + 1), (n + 1, n + 3), (n + 3, n + 3)]
    assert read_all(fj, "j", n) == b"abc"


def test_roll_over_by_age(tmp_path: Path) -> None:
    with FileJournals(tmp_path, fragment_age=0.01) as fj:
        fj.create(ndjson("j"))
        fj.append("j", b"one\n")
        assert fragments(tmp_path / "j") == []
        time.sleep(0.05)
        assert fj.roll_aged() == ["j"]
        assert fragments(tmp_path / "j") == [(0, 4)]
        fj.append("j", b"two\n")
        time.sleep(0.05)
        fj.append("j", b"three\n")  # the aged open fragment rolls before this append
        assert fragments(tmp_path / "j") == [(0, 4), (4, 8)]
        assert read_all(fj, "j") == b"one\ntwo\nthree\n"


def test_concurrent_appenders_threads_and_processes_never_interleave(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with FileJournals(root, fragment_bytes=4096) as fj:
        fj.create(ndjson("j"))
        procs = [start_proc("file_append", str(root), "j", f"p{i}", "300") for i in range(3)]

        def thread_append(tag: str) -> None:
            for i in range(300):
                fj.append("j", f"<{tag}:{i}:{'x' * (i % 37)}>".encode())

        threads = [threading.Thread(target=thread_append, args=(f"t{i}",)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        data = read_all(fj, "j")
        assert fj.end("j") == len(data)
    records = re.findall(rb"<([pt]\d):(\d+):(x*)>", data)
    assert b"".join(b"<%s:%s:%s>" % r for r in records) == data  # nothing interleaved or torn
    for tag in [f"{k}{i}".encode() for k in "pt" for i in range(3)]:
        assert [int(i) for t, i, _ in records if t == tag] == list(range(300))
    assert len(fragments(root / "j")) > 5


def test_blocking_reader_follows_appends_across_roll_over(fj: FileJournals) -> None:
    fj.create(ndjson("j"))
    fj.append("j", b"first\n")
    got = bytearray()
    done = threading.Event()

    def reader() -> None:
        for begin, chunk in fj.read("j", 0, block=True, timeout=120):  # ends at "last": only a bound
            assert begin == len(got)
            got.extend(chunk)
            if got.endswith(b"last\n"):
                break
        done.set()

    t = threading.Thread(target=reader)
    t.start()
    expected = b"first\n" + b"".join(b"line %d\n" % i for i in range(300)) + b"last\n"
    for i in range(300):
        fj.append("j", b"line %d\n" % i)
    fj.append("j", b"last\n")
    t.join(120)
    assert done.is_set() and bytes(got) == expected
    assert len(fragments(fj.root / "j")) > 5  # the reader crossed many roll-overs


def test_blocking_reader_sees_appends_of_another_process(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with FileJournals(root, fragment_bytes=1024) as fj:
        fj.create(ndjson("j"))
        chunks = fj.read("j", 0, block=True, timeout=120)  # a bound: the child may start slowly on a loaded machine
        proc = start_proc("file_append", str(root), "j", "p", "50")
        got = b""
        for _, chunk in chunks:
            got += chunk
            if b"<p:49:" in got and got.endswith(b">"):
                break
        proc.communicate(timeout=120)
    assert got.count(b"<p:") == 50


def test_non_blocking_read_stops_and_timeout_ends_blocking_read(fj: FileJournals) -> None:
    fj.create(ndjson("j"))
    assert list(fj.read("j", 0)) == []
    assert list(fj.read("j", 0, block=True, timeout=0.05)) == []
    fj.append("j", b"x\n")
    assert list(fj.read("j", 0, block=True, timeout=0.05)) == [(0, b"x\n")]


def test_crash_mid_append_leaves_no_torn_frame_and_recovery_quarantines_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with FileJournals(root) as fj:
        fj.create(ndjson("j"))
    proc = run_proc("file_crash_mid_append", str(root), "j", check=False)
    assert proc.returncode == -9
    opened = (root / "j" / OPEN_NAME).stat().st_size
    with FileJournals(root, recover=False) as reader:  # before any recovery: the torn record is invisible
        assert read_all(reader, "j") == b"whole-1\n" and reader.end("j") == 8
        assert (root / "j" / OPEN_NAME).stat().st_size == opened
    with FileJournals(root) as fj:
        [report] = fj.recovered
        assert report.journal == "j" and report.truncated_bytes > 0
        assert report.quarantined is not None and report.quarantined.read_bytes().startswith(b"\x00\x00\x00\x84")
        assert fj.append("j", b"whole-2\n") == (8, 16)
        assert read_all(fj, "j") == b"whole-1\nwhole-2\n"


def test_torn_tail_found_by_a_live_appender_is_cut_before_appending(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with FileJournals(root) as fj:
        fj.create(ndjson("j"))
        fj.append("j", b"a\n")
        run_proc("file_crash_mid_append", str(root), "j", check=False)
        assert fj.append("j", b"b\n").begin == 2 + 8  # after the crashed writer's whole record
        assert read_all(fj, "j") == b"a\nwhole-1\nb\n"
        assert len(fj.recovered) == 1 and fj.recovered[0].truncated_bytes > 0


def test_recovery_removes_an_open_fragment_already_rolled(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with FileJournals(root) as fj:
        fj.create(ndjson("j"))
        fj.append("j", b"abc\n")
        saved = (root / "j" / OPEN_NAME).read_bytes()
        assert fj.roll("j")
    (root / "j" / OPEN_NAME).write_bytes(saved)  # as if the roller died between rename and unlink
    (root / "j" / ".tmp-leftover").write_bytes(b"junk")
    with FileJournals(root) as fj:
        removed = {n for r in fj.recovered for n in r.removed}
        assert removed == {OPEN_NAME, ".tmp-leftover"}
        assert read_all(fj, "j") == b"abc\n" and fj.append("j", b"d\n") == (4, 6)


def test_positions_are_durable(tmp_path: Path) -> None:
    with FileJournals(tmp_path) as fj:
        fj.create(ndjson("j"))
        assert fj.load_position("j", "g") is None
        fj.store_position("j", "g", 42)
    with FileJournals(tmp_path) as fj:
        assert fj.load_position("j", "g") == 42 and fj.positions("j") == {"g": 42}
        with pytest.raises(ValueError, match="consumer group"):
            fj.store_position("j", "../g", 1)


def test_large_appends_bigger_than_the_read_chunk(tmp_path: Path) -> None:
    with FileJournals(tmp_path, chunk_size=1000, fragment_bytes=1 << 20) as fj:
        fj.create(ndjson("j"))
        big = os.urandom(5000)
        fj.append("j", big)
        fj.append("j", b"tail")
        chunks = list(fj.read("j", 10))
        assert all(len(c) <= 1000 for _, c in chunks)
        assert b"".join(c for _, c in chunks) == big[10:] + b"tail"
        assert fj.end("j") == 5004
