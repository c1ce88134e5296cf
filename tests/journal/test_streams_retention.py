"""Issue 39 item 9: a Redis Streams journal trimmed by retention failed every ``rows=messages`` batch read
("offset 0 was trimmed by retention"), whatever ``failOnDataLoss`` said or where the read started. The
trimmed bytes are now the journal's lost range [0, oldest entry), met by readers as a file journal's lost
range is: ``failOnDataLoss``/``fail_on_data_loss`` false skips it (logged, counted, audited), true fails
naming the journal and the bytes, and ``skip-lost`` accepts it. Real redis-server, no Spark session (the
batch read's reading function is called directly; tests/spark/test_journal_batch.py reads through Spark)."""

from __future__ import annotations

import itertools
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from journal_helpers import ndjson

from zcluster import Cluster, Insert, PollError
from zcluster.journal import RedisJournals
from zcluster.message import Flags, OffsetOutOfRangeError, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.spark.batch_source import plan_range, read_committed
from zcluster.state import Consumer, StateStore
from zcluster.testing import LocalShards

_ids = itertools.count()
J = "trimmed/part-0"


def _frame(i: int) -> bytes:
    doc = {"UUID": format_uuid(build_uuid(b"\x01" * 6, (100 + i) << 4, Flags.OUTSIDE_TXN)), "i": i}
    return (json.dumps(doc) + "\n").encode()


@pytest.fixture
def trimmed(shards: LocalShards) -> Iterator[tuple[RedisJournals, str, int]]:
    """A journal of 200 committed messages (one an append) of which retention kept about the last 2,000
    bytes: (store, its URL, where the kept bytes begin)."""
    prefix = f"ret-{uuid.uuid4().hex[:12]}:"  # unique on the session's shared servers
    rj = RedisJournals.from_url(shards.urls[0], prefix=prefix, retain_bytes=2000)
    rj.create(ndjson(J))
    for i in range(200):
        rj.append(J, _frame(i))
    ((oldest, _),) = rj.client.xrange(rj.stream_key(J), count=1)
    kept = int(oldest.decode().partition("-")[0])
    assert 0 < kept < rj.end(J) - 1000
    yield rj, f"{shards.urls[0]}?prefix={prefix}", kept
    rj.close()


def _kept(rj: RedisJournals, start: int) -> list[int]:
    """The "i" of every message appended at or after offset ``start`` (its entry still there)."""
    out, pos = [], 0
    for i in range(200):
        if pos >= start:
            out.append(i)
        pos += len(_frame(i))
    return out


def test_reads_meet_the_trimmed_bytes_as_a_lost_range(trimmed: Any) -> None:
    rj, _, kept = trimmed
    assert [tuple(r[:3]) for r in rj.lost_ranges(J)] == [(0, kept, "trimmed by retention")]
    with pytest.raises(OffsetOutOfRangeError) as info:
        list(rj.read(J, 0))
    assert info.value.lost == (0, kept) and info.value.resume_offset == kept and info.value.journal == J
    assert f"bytes 0..{kept}" in str(info.value) and "trimmed by retention" in str(info.value)
    assert next(iter(rj.read(J, kept)))[0] == kept
    # Trimmed under a reader: the read reaching the trimmed bytes raises the lost range as it is now.
    reading = iter(rj.read(J, kept))
    next(reading)
    later = rj.end(J) - 300
    assert rj.trim(J, later) > 0
    with pytest.raises(OffsetOutOfRangeError) as info:
        list(reading)
    (now,) = rj.lost_ranges(J)
    assert info.value.lost == (0, now.end) and now.end > kept


def test_a_batch_read_of_a_trimmed_journal_follows_fail_on_data_loss(
    trimmed: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rj, url, kept = trimmed
    end = rj.end(J)
    whole = plan_range(rj, J, CONTENT_TYPE_NDJSON, 0, end, end)
    with pytest.raises(OffsetOutOfRangeError, match=f"journal {J}: bytes 0..{kept} are lost"):
        list(read_committed(url, whole))
    with caplog.at_level(logging.WARNING, logger="zcluster.spark.batch_source"):
        rows = list(read_committed(url, whole, fail_on_data_loss=False))
    (lost,) = [r for r in rows if r[8] is not None]
    assert lost[1:3] == (0, kept) and lost[8].startswith("lost range: ")
    assert [json.loads(r[7])["i"] for r in rows if r[8] is None] == _kept(rj, kept)
    assert any(f"lost bytes 0..{kept}" in r.getMessage() for r in caplog.records)
    # A start past the trim: the kept messages from there, no error row; true still fails (as on file
    # journals: producer states are read from offset 0, through the lost range).
    start = plan_range(rj, J, CONTENT_TYPE_NDJSON, kept + 500, end, end)
    rows = list(read_committed(url, start, fail_on_data_loss=False))
    assert rows and all(r[8] is None for r in rows)
    assert [json.loads(r[7])["i"] for r in rows] == _kept(rj, start.begin)
    with pytest.raises(OffsetOutOfRangeError):
        list(read_committed(url, start))


def test_a_consumer_of_a_trimmed_journal_skips_or_stops_as_on_file_journals(trimmed: Any, shards: LocalShards) -> None:
    rj, _, kept = trimmed
    app = f"ret{next(_ids)}"
    with Cluster.from_urls(shards.urls, prefix=f"{app}:") as cluster:
        mapper = lambda m: [Insert("k", 1.0, str(m.doc["i"]))]  # noqa: E731
        stats = Consumer(cluster, rj, mapper, f"{app}-skips", fail_on_data_loss=False).poll()
        assert (stats.lost_skipped, stats.lost_bytes, stats.delivered) == (1, kept, len(_kept(rj, kept)))
        (entry,) = StateStore(cluster, f"{app}-skips").audit()
        assert (entry["begin"], entry["end"], entry["by"]) == (0, kept, "applier")

        stopping = Consumer(cluster, rj, mapper, f"{app}-stops")
        with pytest.raises(PollError) as info:
            stopping.poll()
        error = info.value.failures[0].error
        assert isinstance(error, OffsetOutOfRangeError) and error.lost == (0, kept)
        StateStore(cluster, f"{app}-stops").skip_lost(rj, J, 0, kept, reason="retention")  # the audited way past
        assert stopping.poll().delivered == len(_kept(rj, kept))
