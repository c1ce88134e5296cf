"""Async publishing and end to end: committed + transactional publishers with duplicates, read committed."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis
from journal_helpers import ndjson

from zcluster.journal import AsyncPublisher, FileJournals, JournalStore, RedisJournals
from zcluster.message import (
    AppendResult,
    JsonMessage,
    ReadCommittedIter,
    Sequencer,
    modulo_mapping,
    partitions_from,
)

JOURNALS = [f"e2e/part-{i:03d}" for i in range(4)]


class FlakyStore:
    """Wraps a store: some appends succeed but report a connection error (so the publisher retries and
    duplicates them), others fail before appending."""

    transient_errors = (redis.ConnectionError,)  # what it injects: the publisher's default retries them

    def __init__(self, inner: JournalStore, seed: int) -> None:
        self.inner = inner
        self.rng = random.Random(seed)
        self.duplicated = 0
        self.failed = 0

    def append_many(self, journal: str, items: Sequence[bytes]) -> list[AppendResult]:
        roll = self.rng.random()
        if roll < 0.1:
            self.failed += 1
            raise redis.ConnectionError("injected: failed before appending")
        out = self.inner.append_many(journal, items)
        if roll < 0.25:
            self.duplicated += 1
            raise redis.ConnectionError("injected: appended, but the reply was lost")
        return out


def make(kind: str, tmp_path: Path, request: pytest.FixtureRequest, prefix: str) -> JournalStore:
    if kind == "file":
        return FileJournals(tmp_path / "j", fragment_bytes=2048)
    return RedisJournals.from_url(request.getfixturevalue("redis_cluster").url, cluster=True, prefix=prefix)


def test_async_publisher_futures_barrier_and_retries(tmp_path: Path) -> None:
    with FileJournals(tmp_path) as fj:
        fj.create(ndjson("j"))
        flaky = FlakyStore(fj, seed=1)
        with AsyncPublisher(flaky, max_batch=7, backoff=0) as pub:  # type: ignore[arg-type]
            futs = [
                pub.publish_committed(lambda m: ("j", "application/x-ndjson"), JsonMessage({"i": i}))
                for i in range(100)
            ]
            pub.barrier()
            assert all(f.done() and f.exception() is None for f in futs)
            ranges = [f.result() for f in futs]
        assert ranges == sorted(ranges) and all(r.end > r.begin for r in ranges)
        assert flaky.failed > 0 and flaky.duplicated > 0
        content = b"".join(c for _, c in fj.read("j", 0))
        assert all(content[r.begin : r.end].startswith(b'{"i":%d,' % i) for i, r in enumerate(ranges))

        broken = FlakyStore(fj, seed=2)
        broken.rng.random = lambda: 0.0  # type: ignore[method-assign]
        with AsyncPublisher(broken, retries=2, backoff=0) as pub:  # type: ignore[arg-type]
            fut = pub.publish_committed(lambda m: ("j", "application/x-ndjson"), JsonMessage({"i": -1}))
            with pytest.raises(redis.ConnectionError, match="injected"):
                pub.barrier()
            assert isinstance(fut.exception(), redis.ConnectionError)


@pytest.mark.parametrize("kind", ["file", "redis-cluster"])
def test_read_committed_delivers_exactly_the_committed_messages_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, prefix: str
) -> None:
    store = make(kind, tmp_path, request, prefix)
    for name in JOURNALS:
        store.create(ndjson(name, topic="e2e"))
    mapping = modulo_mapping(lambda m: str(m.doc["id"]), partitions_from(store, "topic=e2e"))
    committed: list[str] = []

    flaky = [FlakyStore(store, seed=3), FlakyStore(store, seed=4)]
    committing = AsyncPublisher(flaky[0], max_batch=16, backoff=0)  # type: ignore[arg-type]
    txn = AsyncPublisher(flaky[1], max_batch=16, backoff=0)  # type: ignore[arg-type]
    for i in range(120):
        committing.publish_committed(mapping, JsonMessage({"id": f"c{i}"}))
        committed.append(f"c{i}")
        if i % 40 == 39:  # three transactions: commit, roll back, commit
            for j in range(15):
                txn.publish_uncommitted(mapping, JsonMessage({"id": f"t{i}-{j}"}))
            if i == 79:
                txn.rollback()
            else:
                txn.commit()
                committed.extend(f"t{i}-{j}" for j in range(15))
    committing.close()
    txn.close()
    committing.barrier()
    txn.barrier()

    delivered: list[str] = []
    for name in JOURNALS:
        seq = Sequencer(buffer=8)  # small ring: exercises replays too
        for env in ReadCommittedIter(store, store.info(name).spec, seq):
            if not env.is_ack:
                delivered.append(env.message.doc["id"])
    assert all(f.duplicated > 0 for f in flaky)  # both publishers really appended duplicate batches
    assert sorted(delivered) == sorted(committed)
    assert len(delivered) == len(set(delivered))
    assert isinstance(store, FileJournals | RedisJournals)
    store.close()
