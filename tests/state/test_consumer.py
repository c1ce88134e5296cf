"""The plain Python exactly-once consumer (the applier without Spark), against real Redis servers."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Insert, MapperError, PollError
from zcluster.journal.files import FileJournals
from zcluster.journal.frames import RawFrame
from zcluster.message import Flags, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.state import Applier, BatchStats, Consumer, StateStore
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

_names = itertools.count()


def state_of(cluster: Cluster, keys: list[str]) -> dict[str, list[tuple[str, float]]]:
    return {k: [(t.member, t.score) for t in v] for k, v in cluster.select(keys, limit=100000).items()}


@pytest.fixture
def journals(tmp_path: Path) -> tuple[FileJournals, list[str], str]:
    root = tmp_path / "journals"
    store = FileJournals(root)
    names = [f"timelines/part-{i:03d}" for i in range(3)]
    create_journals(store, names)
    return store, names, f"file://{root}"


def test_consumer_applies_exactly_once_across_polls_and_restarts(
    shards: Any, journals: tuple[FileJournals, list[str], str]
) -> None:
    store, names, url = journals
    app = f"app{next(_names)}-{uuid.uuid4().hex[:8]}"
    traffic = Traffic(names)
    with Cluster.from_urls(shards.urls, prefix=f"cons{next(_names)}:") as cluster:
        delivered = 0
        for seed in range(3):  # each poll runs in a fresh consumer: a restarted process
            publish(store, traffic, producers=3, messages=100, seed=seed)
            with Consumer(cluster, url, timeline_mapper, app) as consumer:
                stats = consumer.poll()
                delivered += stats.delivered
                assert consumer.poll().delivered == 0  # nothing new: nothing delivered again
        assert traffic.duplicates > 0 and traffic.rolled_back > 0
        assert delivered == traffic.committed
        expected = traffic.expected()
        assert state_of(cluster, list(expected)) == expected
        assert all(StateStore(cluster, app).load_journal(n).offset == store.end(n) for n in names)


def test_a_mapper_failure_checkpoints_nothing_and_the_next_poll_is_exact(
    shards: Any, journals: tuple[FileJournals, list[str], str]
) -> None:
    store, names, _ = journals
    traffic = Traffic(names)
    publish(store, traffic, producers=2, messages=150, seed=7)
    calls = itertools.count()

    def flaky(message: Any) -> list[Insert]:
        if next(calls) == 40:
            raise RuntimeError("boom")
        return list(timeline_mapper(message))  # type: ignore[arg-type]

    app = f"app{next(_names)}-{uuid.uuid4().hex[:8]}"
    with Cluster.from_urls(shards.urls, prefix=f"cons{next(_names)}:") as cluster:
        with pytest.raises(PollError) as info:
            Consumer(cluster, store, flaky, app).poll()
        (failure,) = info.value.failures
        assert isinstance(failure.error, MapperError) and "boom" in str(failure.error)
        assert f"journal {failure.journal} offset" in str(failure.error) and failure.offset == 0
        stats = Consumer(cluster, store, timeline_mapper, app).poll()
        assert isinstance(stats, BatchStats) and stats.frames > 0
        expected = traffic.expected()
        assert state_of(cluster, list(expected)) == expected


def test_lines_the_fast_parser_refuses_are_decoded_by_json_or_reported(shards: Any) -> None:
    uuids = [format_uuid(build_uuid(b"\x01producer"[:6], clock << 4, Flags.OUTSIDE_TXN)) for clock in (1, 2, 3)]
    lines = [
        b'{"UUID":"%s","v":NaN}\n' % uuids[0].encode(),  # orjson refuses NaN, json does not
        b"not json\n",  # malformed: not JSON
        b"[1]\n",  # malformed: JSON, but not a message
        b'{"UUID":"%s","v":1e400}\n' % uuids[1].encode(),  # orjson refuses an infinite number, json does not
        b'{"UUID":"%s","v":1}\n' % uuids[2].encode(),
    ]
    frames, pos = [], 0
    for line in lines:
        frames.append(RawFrame("j", pos, pos + len(line), CONTENT_TYPE_NDJSON, line, None))
        pos += len(line)
    seen: list[Any] = []

    def mapper(message: Any) -> list[Insert]:
        seen.append(message.doc["v"])
        return []

    stats = BatchStats()
    with Cluster.from_urls(shards.urls, prefix=f"cons{next(_names)}:") as cluster:
        Applier(cluster, f"app{next(_names)}-{uuid.uuid4().hex[:8]}", mapper).apply("j", frames, stats)
    assert len(seen) == 3 and seen[0] != seen[0] and seen[1:] == [float("inf"), 1]
    assert (stats.frames, stats.delivered, stats.malformed) == (5, 3, 2)
