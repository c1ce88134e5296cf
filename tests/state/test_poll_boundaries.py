"""Exactly once whatever the poll (or micro-batch) boundaries: a history read in pieces delivers exactly what
one uninterrupted read delivers, in the same order, for the plain consumer's applier and the Spark sink's
task code, on file and Redis-stream journals (real servers).

The regression that started it: a transaction rolled back in a later poll than its messages was delivered
once the same producer committed again (the checkpoint kept the open span's state: it ranked states by clock,
and a rollback lowers a producer's max clock)."""

from __future__ import annotations

import itertools
import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zcluster import Cluster, Insert
from zcluster.journal import FileJournals, RedisJournals
from zcluster.journal.store import JournalStore
from zcluster.message import Flags, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.spark.sink import _Job
from zcluster.spark.source import RANGE_COLUMNS
from zcluster.state import Applier, BatchStats, StateStore
from zcluster.testing import LocalShards

_ids = itertools.count()
CT = CONTENT_TYPE_NDJSON


def _frame(producer: bytes, clock: int, flags: int, ident: str) -> bytes:
    doc = {"UUID": format_uuid(build_uuid(producer, clock, flags)), "id": ident}
    return (json.dumps(doc) + "\n").encode()


@dataclass
class History:
    """Frames of one journal from several producers, and the ids exactly-once delivery gives, in order."""

    frames: list[bytes] = field(default_factory=list)
    delivered: list[str] = field(default_factory=list)
    rolled_back: int = 0


def make_history(seed: int, steps: int) -> History:
    """Committed messages, transactions that commit or roll back (interleaved across producers, with other
    producers' messages between a transaction's messages and its ACK), and duplicated appends (committed
    frames later on, open-transaction frames while it is open; never a rolled-back frame after its rollback,
    as producers do not re-send those)."""
    rng = random.Random(seed)
    h = History()
    producers = [bytes([p + 1]) * 6 for p in range(rng.randint(1, 3))]
    clock = {p: 100 for p in producers}  # a zero clock opts out of sequencing: keep rollback ACKs above it
    last_ack: dict[bytes, int] = {}
    open_txn: dict[bytes, list[tuple[str, bytes]]] = {}
    resendable: list[bytes] = []
    n = 0
    for _ in range(steps):
        p = rng.choice(producers)
        clock[p] += 1
        op = rng.random()
        if p in open_txn and op < 0.3:  # close the transaction
            span = open_txn.pop(p)
            if rng.random() < 0.4:
                h.frames.append(_frame(p, last_ack[p], Flags.ACK_TXN, "ack"))
                h.rolled_back += len(span)
            else:
                h.frames.append(_frame(p, clock[p], Flags.ACK_TXN, "ack"))
                last_ack[p] = clock[p]
                h.delivered += [ident for ident, _ in span]
                resendable += [frame for _, frame in span]
        elif op < 0.65:  # a transaction's message (opens one if needed)
            ident = f"m{n}"
            n += 1
            frame = _frame(p, clock[p], Flags.CONTINUE_TXN, ident)
            open_txn.setdefault(p, []).append((ident, frame))
            last_ack.setdefault(p, clock[p] - 1)
            h.frames.append(frame)
            if rng.random() < 0.15:
                h.frames.append(frame)  # retried while the transaction is open
        elif op < 0.9 and p not in open_txn:  # a message committed by itself
            ident = f"m{n}"
            n += 1
            frame = _frame(p, clock[p], Flags.OUTSIDE_TXN, ident)
            last_ack[p] = clock[p]
            h.frames.append(frame)
            h.delivered.append(ident)
            resendable.append(frame)
        elif resendable:  # a late copy of a committed frame
            h.frames.append(rng.choice(resendable))
    return h


def the_rollback_of_the_issue() -> History:
    """Poll 1: a transaction's message; poll 2: its rollback; poll 3: a new transaction that commits."""
    p = b"\x07" * 6
    h = History()
    h.frames = [
        _frame(p, 1, Flags.OUTSIDE_TXN, "first"),
        _frame(p, 2, Flags.CONTINUE_TXN, "rolled-back"),
        _frame(p, 1, Flags.ACK_TXN, "ack"),
        _frame(p, 4, Flags.CONTINUE_TXN, "committed"),
        _frame(p, 5, Flags.ACK_TXN, "ack"),
    ]
    h.delivered, h.rolled_back = ["first", "committed"], 1
    return h


class Recorder:
    """A mapper that records the ids it sees and writes one insert per message."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, message: Any) -> list[Insert]:
        ident = message.doc["id"]
        self.seen.append(ident)
        return [Insert("delivered", float(len(ident)), ident)]


def write_journal(store: JournalStore, h: History) -> tuple[str, list[int]]:
    """A new journal holding ``h``'s frames, one append each; returns its name and the frame boundaries."""
    name = f"hist/{next(_ids)}"
    store.create(JournalSpec(name, {"content-type": CT}))
    ends = [r.end for r in store.append_many(name, h.frames)]
    return name, ends


def cuts_of(ends: list[int]) -> Iterator[list[int]]:
    """Every single boundary, and every frame a poll of its own."""
    for end in ends[:-1]:
        yield [end, ends[-1]]
    yield list(ends)


def read_in_polls(cluster: Cluster, store: JournalStore, name: str, polls: list[int], ring: int) -> list[str]:
    mapper = Recorder()
    applier = Applier(cluster, f"app{next(_ids)}-{uuid.uuid4().hex[:8]}", mapper, store, ring=ring, flush=3)
    for end in polls:
        applier.apply_range(store, name, CT, 0, end, BatchStats())  # a poll reads from its checkpoint on
    return mapper.seen


def sink_in_batches(urls: list[str], journals_url: str, name: str, polls: list[int], ring: int, rows: str) -> list[str]:
    """The sink's task code (what ``mapInArrow`` runs on an executor), one micro-batch per poll."""
    mapper = Recorder()
    job = _Job(_config(urls), f"app{next(_ids)}-{uuid.uuid4().hex[:8]}", journals_url, mapper, None, ring, 3, 2, None)
    begin = 0
    store = _open(journals_url)
    try:
        for end in polls:
            if rows == "ranges":
                batch = pa.RecordBatch.from_pydict(
                    dict(zip(RANGE_COLUMNS, ([name], [CT], [begin], [end]), strict=True))
                )
            else:
                frames = list(_frames_of(store, name, begin, end))
                batch = pa.RecordBatch.from_pylist(frames)
            out = list(job.run(iter([batch])))
            assert len(out) == 1
            begin = end
    finally:
        store.close()  # type: ignore[attr-defined]
    return mapper.seen


def _config(urls: list[str]) -> Any:
    from zcluster.config import store_config

    return store_config(urls, prefix=f"pb{next(_ids)}:")


def _open(url: str) -> JournalStore:
    from zcluster.journal.urls import open_store

    return open_store(url, recover=False)


def _frames_of(store: JournalStore, name: str, begin: int, end: int) -> Iterator[dict[str, Any]]:
    from zcluster.journal.frames import read_frames

    for f in read_frames(store, name, CT, begin, end):
        yield f._asdict()


@pytest.fixture(params=["file", "stream"])
def journal_store(request: pytest.FixtureRequest, tmp_path: Path, shards: LocalShards) -> Iterator[tuple[Any, str]]:
    if request.param == "file":
        store: Any = FileJournals(tmp_path / "journals")
        url = f"file://{tmp_path / 'journals'}"
    else:
        prefix = f"pbj{next(_ids)}:"
        store = RedisJournals.from_url(f"{shards.urls[0]}?prefix={prefix}")
        url = f"{shards.urls[0]}?prefix={prefix}"
    yield store, url
    store.close()


def test_a_rollback_read_in_a_later_poll_is_never_delivered(
    journal_store: tuple[Any, str], shards: LocalShards
) -> None:
    store, _ = journal_store
    h = the_rollback_of_the_issue()
    name, ends = write_journal(store, h)
    with Cluster.from_urls(shards.urls, prefix=f"pb{next(_ids)}:") as cluster:
        # The issue's own polls: [message], [rollback], [new transaction + its commit]
        assert read_in_polls(cluster, store, name, [ends[1], ends[2], ends[4]], ring=8192) == ["first", "committed"]
        for polls in cuts_of(ends):
            assert read_in_polls(cluster, store, name, polls, ring=8192) == h.delivered, polls


def test_a_rollback_read_in_a_later_micro_batch_is_never_delivered_by_the_sink(
    journal_store: tuple[Any, str], shards: LocalShards
) -> None:
    store, url = journal_store
    h = the_rollback_of_the_issue()
    name, ends = write_journal(store, h)
    for rows in ("ranges", "frames"):
        got = sink_in_batches(shards.urls, url, name, [ends[1], ends[2], ends[4]], 8192, rows)
        assert got == ["first", "committed"], rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(4, 24), ring=st.sampled_from([1, 2, 3, 8192]))
def test_any_poll_boundaries_deliver_what_one_uninterrupted_read_delivers(
    journal_store: tuple[Any, str], shards: LocalShards, seed: int, steps: int, ring: int
) -> None:
    store, _ = journal_store
    h = make_history(seed, steps)
    name, ends = write_journal(store, h)
    if not ends:
        return
    with Cluster.from_urls(shards.urls, prefix=f"pb{next(_ids)}:") as cluster:
        whole = read_in_polls(cluster, store, name, [ends[-1]], ring)
        assert whole == h.delivered  # the model: committed messages once, in commit order
        for polls in cuts_of(ends):
            assert read_in_polls(cluster, store, name, polls, ring) == whole, polls
        delivered = cluster.select(["delivered"], limit=10_000)["delivered"]
        assert sorted(t.member for t in delivered) == sorted(h.delivered)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(4, 16), ring=st.sampled_from([1, 8192]))
def test_any_micro_batch_boundaries_deliver_what_one_batch_delivers_through_the_sink(
    journal_store: tuple[Any, str], shards: LocalShards, seed: int, steps: int, ring: int
) -> None:
    store, url = journal_store
    h = make_history(seed, steps)
    name, ends = write_journal(store, h)
    if not ends:
        return
    for rows in ("ranges", "frames"):
        assert sink_in_batches(shards.urls, url, name, [ends[-1]], ring, rows) == h.delivered
        for polls in cuts_of(ends):
            assert sink_in_batches(shards.urls, url, name, polls, ring, rows) == h.delivered, (rows, polls)


def test_checkpoints_rank_by_position_not_by_clock(shards: LocalShards) -> None:
    """The stored state after a rollback (a lower max clock) supersedes the open span saved before it."""
    from zcluster.message.sequencer import ProducerState
    from zcluster.message.uuid import ProducerID

    p = ProducerID(b"\x01" * 6)
    with Cluster.from_urls(shards.urls, prefix=f"pb{next(_ids)}:") as cluster:
        state = StateStore(cluster, "ranks")
        open_span = ProducerState("j", p, last_ack=10, begin=100, max_clock=20)
        rolled_back = ProducerState("j", p, last_ack=10, begin=-1, max_clock=10)
        assert state.save_journal("j", 150, [open_span])
        assert state.save_journal("j", 200, [rolled_back])
        assert state.load_journal("j").states == [rolled_back]
        assert not state.save_journal("j", 150, [open_span])  # a zombie's older save is stale
        assert state.load_journal("j").states == [rolled_back]
        raw = state.cluster.select(["ranks/journal/j"], limit=100)["ranks/journal/j"]
        assert len(raw) == 1  # superseded snapshots are forgotten, not left as tombstones


def test_a_zero_clock_message_inside_a_span_is_delivered_once_whatever_the_polls(
    journal_store: tuple[Any, str], shards: LocalShards
) -> None:
    """A zero clock commits its message when read; the open span it sits in, of its own producer, is replayed
    from the journal when its ACK is read after a poll boundary (or past a small ring): the replay delivered it
    again (the pipeline differential test's find, reduced)."""
    store, _ = journal_store
    p = b"\x02" * 6
    h = History()
    h.frames = [
        _frame(p, 16, Flags.CONTINUE_TXN, "in-txn"),
        _frame(p, 0, Flags.OUTSIDE_TXN, "zero-clock"),
        _frame(p, 16, Flags.ACK_TXN, "ack"),
    ]
    name, ends = write_journal(store, h)
    with Cluster.from_urls(shards.urls, prefix=f"pb{next(_ids)}:") as cluster:
        for ring in (1, 8192):
            assert read_in_polls(cluster, store, name, [ends[-1]], ring) == ["zero-clock", "in-txn"], ring
            for polls in cuts_of(ends):
                assert read_in_polls(cluster, store, name, polls, ring) == ["zero-clock", "in-txn"], (ring, polls)
