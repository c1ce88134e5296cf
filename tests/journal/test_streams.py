"""Redis Streams journals on a standalone server and a Redis Cluster: offsets, groups, recovery, retention."""

from __future__ import annotations

import itertools
import json
import threading

import pytest
from journal_helpers import ndjson, read_all, run_proc

from zcluster.journal import RedisJournals
from zcluster.message import JournalExistsError, JournalNotFoundError, OffsetOutOfRangeError


def test_create_list_info_destroy(rj: RedisJournals) -> None:
    rj.create(ndjson("pv/part-000", topic="pv"), {"owner": "me"})
    rj.create(ndjson("pv/part-001", topic="pv"))
    rj.create(ndjson("x", topic="x"))
    assert [s.name for s in rj.list("topic=pv")] == ["pv/part-000", "pv/part-001"]
    assert rj.info("pv/part-000").metadata == {"owner": "me"}
    rj.update_metadata("pv/part-000", {"description": "d"})
    assert rj.info("pv/part-000").metadata == {"owner": "me", "description": "d"}
    with pytest.raises(JournalExistsError):
        rj.create(ndjson("x"))
    rj.destroy("x")
    assert [s.name for s in rj.list("")] == ["pv/part-000", "pv/part-001"]
    with pytest.raises(JournalNotFoundError, match="'x'"):
        rj.append("x", b"1")
    with pytest.raises(JournalNotFoundError):
        rj.end("x")


def test_stream_and_metadata_share_a_hash_tag(rj: RedisJournals) -> None:
    rj.create(ndjson("a/b"))
    rj.append("a/b", b"x")
    key = rj.stream_key("a/b")
    assert key.startswith("{" + rj.prefix + "a/b}")
    assert rj.client.exists(key) == 1


def test_offsets_ordering_and_reads_from_any_offset(rj: RedisJournals) -> None:
    rj.create(ndjson("j"))
    expected = b""
    for i in range(50):
        data = b"m%d\n" % i
        assert rj.append("j", data) == (len(expected), len(expected) + len(data))
        expected += data
    n = len(expected)
    many = rj.append_many("j", [b"ab", b"", b"c\n"])
    assert [tuple(r) for r in many] == [(n, n + 2), (n + 2, n + 2), (n + 2, n + 4)]
    expected += b"abc\n"
    assert rj.end("j") == len(expected)
    assert read_all(rj, "j") == expected
    for off in (0, 1, 57, len(expected) - 1, len(expected)):
        chunks = list(rj.read("j", off))
        assert b"".join(c for _, c in chunks) == expected[off:]
        assert all(b == off + sum(len(c) for _, c in chunks[:i]) for i, (b, _) in enumerate(chunks))
    with pytest.raises(OffsetOutOfRangeError):
        rj.read("j", len(expected) + 1)


def test_concurrent_appenders_get_disjoint_contiguous_ranges(rj: RedisJournals) -> None:
    rj.create(ndjson("j"))
    results: list[tuple[int, int, bytes]] = []
    lock = threading.Lock()

    def worker(tag: int) -> None:
        for i in range(100):
            data = b"<%d:%d>" % (tag, i)
            r = rj.append("j", data)
            with lock:
                results.append((r.begin, r.end, data))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.sort()
    content = read_all(rj, "j")
    assert all(a[1] == b[0] for a, b in itertools.pairwise(results))
    assert all(content[b:e] == d for b, e, d in results) and len(content) == results[-1][1]


def test_blocking_reader_sees_later_appends(rj: RedisJournals) -> None:
    rj.create(ndjson("j"))
    got = bytearray()

    def reader() -> None:
        for _, chunk in rj.read("j", 0, block=True, timeout=120):  # returns at "end": only a bound
            got.extend(chunk)
            if got.endswith(b"end\n"):
                return

    t = threading.Thread(target=reader)
    t.start()
    for i in range(20):
        rj.append("j", b"%d\n" % i)
    rj.append("j", b"end\n")
    t.join(120)
    assert bytes(got) == b"".join(b"%d\n" % i for i in range(20)) + b"end\n"
    assert list(rj.read("j", rj.end("j"), block=True, timeout=0.05)) == []


def test_consumer_groups_ack_and_pending(rj: RedisJournals) -> None:
    rj.create(ndjson("j"))
    rj.append_many("j", [b"a\n", b"b\n", b"c\n"])
    assert rj.group_create("j", "g")
    assert not rj.group_create("j", "g")
    first = rj.group_read("j", "g", "c1", count=2)
    second = rj.group_read("j", "g", "c2", count=5)
    assert [e.data for e in first] == [b"a\n", b"b\n"] and [e.data for e in second] == [b"c\n"]
    assert [(e.begin, e.end) for e in first + second] == [(0, 2), (2, 4), (4, 6)]
    assert rj.group_pending("j", "g") == {"c1": 2, "c2": 1}
    assert rj.group_ack("j", "g", [e.id for e in first]) == 2
    assert rj.group_pending("j", "g") == {"c2": 1}
    assert rj.group_read("j", "g", "c1") == []
    assert rj.group_create("j", "late", offset=2)
    assert [e.data for e in rj.group_read("j", "late", "c")] == [b"b\n", b"c\n"]


def test_entries_of_a_dead_consumer_process_are_claimed_and_redelivered(
    rj: RedisJournals, request: pytest.FixtureRequest
) -> None:
    rj.create(ndjson("j"))
    rj.append_many("j", [b"%d\n" % i for i in range(6)])
    rj.group_create("j", "g")
    kind = "cluster" if "cluster" in request.node.callspec.id else "standalone"
    url = (
        request.getfixturevalue("redis_cluster").url if kind == "cluster" else request.getfixturevalue("shards").urls[0]
    )
    proc = run_proc("stream_group_consume_and_die", url, kind, rj.prefix, "j", "g", "4", check=False)
    assert proc.returncode == -9, proc.stderr
    taken = json.loads(proc.stdout)
    assert len(taken) == 4 and rj.group_pending("j", "g") == {"doomed": 4}
    fresh = rj.group_read("j", "g", "alive")
    assert [e.data for e in fresh] == [b"4\n", b"5\n"]
    assert rj.group_ack("j", "g", [e.id for e in fresh]) == 2
    claimed = rj.group_claim("j", "g", "alive", min_idle=0)
    assert [e.id for e in claimed.entries] == taken and claimed.deleted == []
    assert [e.data for e in claimed.entries] == [b"%d\n" % i for i in range(4)]
    assert rj.group_pending("j", "g") == {"alive": 4}
    assert rj.group_ack("j", "g", taken) == 4 and rj.group_pending("j", "g") == {}


def test_retention_trims_old_entries(rj: RedisJournals, prefix: str) -> None:
    client = rj.client
    kept = RedisJournals(client, prefix=prefix, retain_bytes=100)
    kept.create(ndjson("j"))
    for i in range(300):
        kept.append("j", b"%04d\n" % i)
    assert kept.end("j") == 1500
    assert client.xlen(rj.stream_key("j")) < 300
    assert read_all(kept, "j", 1400) == b"".join(b"%04d\n" % i for i in range(280, 300))
    with pytest.raises(OffsetOutOfRangeError, match="trimmed"):
        kept.read("j", 0)
    assert kept.trim("j", 1450) > 0
    assert read_all(kept, "j", 1450) == b"0290\n0291\n0292\n0293\n0294\n0295\n0296\n0297\n0298\n0299\n"
    with pytest.raises(OffsetOutOfRangeError):
        kept.read("j", 1445)


@pytest.mark.parametrize(
    "url",
    [
        "redis://:p@ss/w0rd@127.0.0.1:6379?prefix=x",  # an unescaped "/" once sent redis-py to host "ss"
        "redis://:s3cret@127.0.0.1:notaport",
        "redis+cluster://:s3cret@[::1:7000",
        "redis://:s3cret@127.0.0.1:1?foo=bar",
    ],
)
def test_a_bad_journal_store_url_is_a_config_error_without_the_password(url: str) -> None:
    from zcluster import ConfigError
    from zcluster.journal.urls import open_store

    with pytest.raises(ConfigError) as caught:
        open_store(url)
    assert "s3cret" not in str(caught.value) and "w0rd" not in str(caught.value) and "ss/" not in str(caught.value)


def test_a_journal_store_url_keeps_its_prefix_and_reaches_the_server(shards: object, prefix: str) -> None:
    from zcluster.journal.urls import open_store

    url = shards.urls[0]  # type: ignore[attr-defined]
    with open_store(f"{url}?prefix={prefix}j:") as store:
        assert isinstance(store, RedisJournals) and store.prefix == f"{prefix}j:"
        assert store.list("") == []
