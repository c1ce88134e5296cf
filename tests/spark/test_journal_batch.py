"""``spark.read.format("zcluster-journal")``: journals as a batch source, read-committed as the sink sees them.

Real file journals holding committed, rolled-back and duplicated messages (zcluster.testing.traffic); the
batch read is checked against Traffic's model and against what a real applier's mapper is given."""

from __future__ import annotations

import itertools
import json
import traceback
import uuid
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster
from zcluster.errors import ConfigError
from zcluster.journal._filefmt import HEADER, OPEN_NAME, RECORD
from zcluster.journal.files import FileJournals
from zcluster.journal.streams import RedisJournals
from zcluster.journal.urls import open_store
from zcluster.message import Flags, build_uuid, format_uuid
from zcluster.message.errors import OffsetOutOfRangeError
from zcluster.message.framing import CONTENT_TYPE_NDJSON, CONTENT_TYPE_PROTO_FIXED
from zcluster.message.journals import JournalSpec
from zcluster.spark import batch_source
from zcluster.spark.batch_source import JournalBatchReader, JournalDataSource, read_committed
from zcluster.spark.source import MESSAGES_SCHEMA, JournalRange
from zcluster.state import Consumer
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish

NAMES = [f"timelines/part-{i}" for i in range(2)]
COLUMNS = [c.split()[0] for c in MESSAGES_SCHEMA.split(", ")]
_apps = itertools.count()


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Traffic, dict[str, int]]:
    root = tmp_path_factory.mktemp("journals")
    with FileJournals(root, fragment_bytes=4096) as store:  # several fragment files per journal
        create_journals(store, NAMES)
        model = publish(store, Traffic(list(NAMES)), producers=4, messages=60, seed=7)
        ends = {n: store.end(n) for n in NAMES}
    assert model.duplicates > 0 and model.rolled_back > 0 and model.transactions > 0
    return f"file://{root}", model, ends


def _committed(url: str, ends: dict[str, int], start: dict[str, int] | None = None) -> list[tuple[Any, ...]]:
    start = start or {}
    return [
        row
        for n in NAMES
        for row in read_committed(url, JournalRange(n, CONTENT_TYPE_NDJSON, start.get(n, 0), ends[n]))
    ]


def _model(docs: list[dict[str, Any]], names: list[str]) -> Traffic:
    folded = Traffic(names)
    for doc in docs:
        folded.apply(doc)
    return folded


def test_a_batch_read_gives_exactly_the_committed_messages(spark: Any, traffic: Any) -> None:
    url, model, ends = traffic
    df = spark.read.format("zcluster-journal").option("journals", url).option("rows", "messages").load()
    assert df.columns == COLUMNS
    rows = [tuple(r) for r in df.collect()]
    assert len(rows) == model.committed  # not the duplicates, not the rolled-back, not the ACKs
    assert all(r[COLUMNS.index("error")] is None for r in rows)
    assert len({r[COLUMNS.index("uuid")] for r in rows}) == len(rows)
    folded = _model([json.loads(r[COLUMNS.index("message")]) for r in rows], NAMES)
    assert folded.expected() == model.expected() and folded.events == model.events
    assert sorted(rows) == sorted(_committed(url, ends))  # the Spark read is the partitions' rows
    for name in NAMES:  # delivery order per journal: by the committing frame, then the message's offset
        mine = [r for r in _committed(url, ends) if r[0] == name]
        assert [(r[3], r[1]) for r in mine] == sorted((r[3], r[1]) for r in mine)
        assert all(r[1] < r[2] <= ends[name] and r[1] <= r[3] for r in mine)


def test_the_rows_are_what_the_sinks_mapper_is_given(shards: Any, traffic: Any) -> None:
    url, _, ends = traffic
    seen: list[str] = []

    def mapper(message: Any) -> list[Any]:
        seen.append(json.dumps(message.doc, sort_keys=True))
        return []

    with (
        Cluster.from_urls(shards.urls, prefix=f"batch{next(_apps)}:") as cluster,
        Consumer(cluster, url, mapper, "audit") as consumer,
    ):
        consumer.poll()
    mine = [json.dumps(json.loads(r[COLUMNS.index("message")]), sort_keys=True) for r in _committed(url, ends)]
    assert mine == seen  # the same messages, in the same order (the consumer polls journals in name order)


def test_spans_that_leave_the_ring_are_replayed_from_the_journal(traffic: Any, monkeypatch: Any) -> None:
    url, _, ends = traffic
    whole = _committed(url, ends)
    replays: list[tuple[int, int]] = []
    replay = batch_source._replay

    def counted(*args: Any) -> Any:
        replays.append(args[-2:])
        return replay(*args)

    monkeypatch.setattr(batch_source, "_RING", 2)  # every transaction of 3-6 messages leaves the ring
    monkeypatch.setattr(batch_source, "_replay", counted)
    assert _committed(url, ends) == whole
    assert replays


def test_offsets_bound_the_read_and_consecutive_reads_hold_each_message_once(spark: Any, traffic: Any) -> None:
    url, _, ends = traffic
    everything = _committed(url, ends)
    cut = {n: sorted({r[3] for r in everything if r[0] == n})[40] for n in NAMES}  # a committing frame's offset
    first = _committed(url, cut)
    second = _committed(url, ends, start=cut)
    assert first and second and first + second != everything  # journals interleave: compare per journal
    for name in NAMES:
        assert [r for r in first if r[0] == name] + [r for r in second if r[0] == name] == [
            r for r in everything if r[0] == name
        ]
    assert all(r[3] < cut[r[0]] for r in first) and all(r[3] >= cut[r[0]] for r in second)
    df = (
        spark.read.format("zcluster-journal")
        .options(journals=url, rows="messages", startingOffsets=json.dumps(cut))
        .option("endingOffsets", json.dumps({NAMES[0]: ends[NAMES[0]]}))
        .load()
    )
    assert sorted(tuple(r) for r in df.collect()) == sorted(second)
    frames = spark.read.format("zcluster-journal").options(journals=url, rows="frames").load()
    raw = frames.where("error is null").count()  # the streaming source's rows: every frame, ACKs and copies too
    assert raw > len(everything)


@pytest.mark.spark
def test_offsets_inside_frames_lose_nothing_and_give_no_fragment(spark: Any, traffic: Any) -> None:
    """Issue 39 item 3: ``endingOffsets`` inside a committing frame gave an error row and the next range
    lost that frame's messages; ``rows=frames`` from inside a frame gave its tail as a good row."""
    url, _, ends = traffic
    name = NAMES[0]
    everything = [r for r in _committed(url, ends) if r[0] == name]
    txn = next(r for r in everything if r[3] != r[1])  # a message committed by a later ACK frame
    cut = txn[3] + 3  # inside that ACK frame

    def read(option: str) -> Any:  # a DataFrameReader keeps its options: a fresh one per read
        reader = spark.read.format("zcluster-journal").options(journals=url, rows="messages")
        return reader.option(option, json.dumps({name: cut})).load().where(f"journal = '{name}'")

    first, second = read("endingOffsets"), read("startingOffsets")
    rows = sorted(tuple(r) for r in first.collect()) + sorted(tuple(r) for r in second.collect())
    assert all(r[8] is None for r in rows)
    assert sorted(rows) == sorted(everything)  # each message once: the straddling ACK's in the first range
    assert txn in sorted(tuple(r) for r in first.collect())
    frames = (
        spark.read.format("zcluster-journal")
        .options(journals=url, rows="frames", startingOffsets=json.dumps({name: cut}))
        .load()
        .where(f"journal = '{name}'")
        .orderBy("begin")
        .collect()
    )
    assert frames[0].begin > cut and all(f.error is None for f in frames)
    assert frames[0].data.startswith(b"{")  # a whole frame, not the ACK's tail


@pytest.mark.spark
def test_a_journal_trimmed_by_retention_reads_as_fail_on_data_loss_says(spark: Any, shards: Any) -> None:
    """Issue 39 item 9: a Redis Streams journal trimmed by retention failed every ``rows=messages`` read,
    ``failOnDataLoss=false`` too; the trimmed bytes are now a lost range, as on file journals."""
    prefix = f"ret-batch-{uuid.uuid4().hex[:12]}:"  # unique on the shared servers
    rj = RedisJournals.from_url(shards.urls[0], prefix=prefix, retain_bytes=1500)
    rj.create(JournalSpec("r/0", {"content-type": CONTENT_TYPE_NDJSON}))
    data = [b'{"UUID":"%s","i":%d}\n' % (_uuid(i).encode(), i) for i in range(1, 101)]
    for d in data:
        rj.append("r/0", d)
    (lost,) = rj.lost_ranges("r/0")
    rj.close()
    read = spark.read.format("zcluster-journal").options(journals=f"{shards.urls[0]}?prefix={prefix}", rows="messages")
    rows = read.option("failOnDataLoss", "false").load().orderBy("committed").collect()
    assert rows[0].error.startswith("lost range: ") and (rows[0].begin, rows[0].end) == (0, lost.end)
    offsets = itertools.accumulate(len(d) for d in data)
    kept = [i for i, at in zip(range(2, 101), offsets, strict=False) if at >= lost.end]
    assert [json.loads(r.message)["i"] for r in rows[1:]] == kept and all(r.error is None for r in rows[1:])
    failing = spark.read.format("zcluster-journal").options(journals=f"{shards.urls[0]}?prefix={prefix}")
    with pytest.raises(Exception, match=f"journal r/0: bytes 0..{lost.end} are lost"):
        failing.option("rows", "messages").load().collect()


def test_bad_options_and_unknown_journals_are_clear_errors(spark: Any, traffic: Any, tmp_path: Path) -> None:
    url, _, _ = traffic
    ok = {"journals": url, "rows": "messages"}
    with pytest.raises(ConfigError, match="know no option startingoffset; they know journals, selector, rows"):
        JournalBatchReader({**ok, "startingOffset": "{}"})
    with pytest.raises(ConfigError, match="needs the option rows: 'messages'"):
        JournalBatchReader({"journals": url})
    with pytest.raises(ConfigError, match="startingOffsets must be 'earliest' or a JSON object"):
        JournalBatchReader({**ok, "startingOffsets": '{"a": -1}'})
    with pytest.raises(ConfigError, match=r"ends at \d+, not 999999999"):
        JournalBatchReader({**ok, "endingOffsets": json.dumps({NAMES[0]: 999999999})}).partitions()
    with pytest.raises(ConfigError, match="rows=messages is for batch reads"):
        JournalDataSource(ok).streamReader(None)
    with FileJournals(tmp_path) as store:
        store.create(JournalSpec("proto", {"content-type": CONTENT_TYPE_PROTO_FIXED}))
    with pytest.raises(ConfigError, match="journal proto holds application/x-protobuf-fixed"):
        JournalBatchReader({"journals": f"file://{tmp_path}", "rows": "messages"}).partitions()
    df = spark.read.format("zcluster-journal").options(**ok, endingOffsets='{"timelines/nope": 0}').load()
    with pytest.raises(Exception, match=r"names journals that are not in .*: timelines/nope"):
        df.collect()


def test_a_lost_range_fails_the_read_naming_it_unless_told_to_skip(tmp_path: Path) -> None:
    data = [b'{"UUID":"%s","i":%d}\n' % (_uuid(i).encode(), i) for i in range(1, 21)]
    with FileJournals(tmp_path) as store:
        store.create(JournalSpec("j", {"content-type": CONTENT_TYPE_NDJSON}))
        for d in data:
            store.append("j", d)
        end = store.end("j")
    path = tmp_path / "j" / OPEN_NAME
    raw = bytearray(path.read_bytes())
    raw[HEADER.size + sum(RECORD.size + len(d) for d in data[:5]) + RECORD.size + 2] ^= 0x20  # the 6th record
    path.write_bytes(bytes(raw))
    lost = (sum(map(len, data[:5])), sum(map(len, data[:6])))
    part = JournalRange("j", CONTENT_TYPE_NDJSON, 0, end)
    with pytest.raises(OffsetOutOfRangeError, match=f"journal j: bytes {lost[0]}..{lost[1]} are lost"):
        list(read_committed(f"file://{tmp_path}", part))
    rows = list(read_committed(f"file://{tmp_path}", part, fail_on_data_loss=False))
    assert [json.loads(r[7])["i"] for r in rows if r[8] is None] == [i for i in range(1, 21) if i != 6]
    (skipped,) = [r for r in rows if r[8] is not None]
    assert skipped[1:3] == lost and skipped[8].startswith("lost range: ")


def _uuid(i: int) -> str:
    """An OUTSIDE_TXN UUID of one producer, clock ``i``: a message committed by itself."""
    return format_uuid(build_uuid(b"\x01\x02\x03\x04\x05\x06", i << 4, Flags.OUTSIDE_TXN))


def test_an_unknown_journal_of_a_password_store_is_named_without_the_password(spark: Any) -> None:
    """Issue 39, item 8: the error naming the journal store quoted its URL whole, password included."""
    secret = "pw-s3cret-39"
    with LocalShards(1, extra=["--requirepass", secret]) as secured:
        url = f"redis://:{secret}@127.0.0.1:{secured.servers[0].port}?prefix=pwj{next(_apps)}:"
        store = open_store(url)
        try:
            store.create(JournalSpec("j", {"content-type": CONTENT_TYPE_NDJSON}))
        finally:
            store.close()
        options = {"journals": url, "rows": "messages", "endingOffsets": '{"nope": 0}'}
        with pytest.raises(ConfigError) as direct:
            JournalBatchReader(options).partitions()
        df = spark.read.format("zcluster-journal").options(**options).load()
        with pytest.raises(Exception, match="names journals that are not in redis://\\*\\*\\*@") as through_spark:
            df.collect()
    for raised in (direct.value, through_spark.value):
        text = "".join(traceback.format_exception(raised))
        assert "nope" in text and secret not in text, text
