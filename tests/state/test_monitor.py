"""How far behind is it: applications() and progress() over real servers and both journal kinds; the
checkpoint record's save time (v3) and the v2 records still read."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Insert, KeyScoreMember
from zcluster.journal import FileJournals, RedisJournals
from zcluster.journal.store import JournalStore
from zcluster.message import Flags, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.sequencer import ProducerState
from zcluster.message.uuid import ProducerID
from zcluster.state import Consumer, StateStore, applications, checkpointed_journals, progress
from zcluster.testing import LocalShards

P1, P2 = b"\x01" * 6, b"\x02" * 6


def frame(ident: str, producer: bytes, clock: int, flags: int = Flags.OUTSIDE_TXN) -> bytes:
    doc = {"UUID": format_uuid(build_uuid(producer, clock << 4, flags)), "id": ident}
    return (json.dumps(doc) + "\n").encode()


def mapper(message: Any) -> list[Insert]:
    return [Insert("k", 1.0, message.doc["id"])]


@pytest.fixture
def cluster(shards: LocalShards) -> Iterator[Cluster]:
    with Cluster.from_urls(shards.urls, prefix=f"mon{uuid.uuid4().hex[:8]}:") as c:
        yield c


@pytest.fixture(params=["file", "stream"])
def store(request: pytest.FixtureRequest, tmp_path: Path, shards: LocalShards) -> Iterator[Any]:
    if request.param == "file":
        s: Any = FileJournals(tmp_path / "journals")
    else:
        s = RedisJournals.from_url(f"{shards.urls[0]}?prefix=mon{uuid.uuid4().hex[:8]}:")
    yield s
    s.close()


def create(store: JournalStore, *names: str, labels: dict[str, str] | None = None) -> None:
    for name in names:
        store.create(JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON, **(labels or {})}))


def test_progress_shows_offsets_ends_lags_producers_and_open_transactions(store: Any, cluster: Cluster) -> None:
    app = f"mon{uuid.uuid4().hex[:8]}"
    create(store, "a/1", "b")
    create(store, "c", labels={"team": "other"})
    store.append_many("a/1", [frame("x1", P1, 101), frame("t1", P2, 101, Flags.CONTINUE_TXN)])  # P2's stays open
    store.append("b", frame("y1", P1, 101))
    started = time.time()
    Consumer(cluster, store, mapper, app, selector="team!=other").poll()
    assert app in applications(cluster) and checkpointed_journals(cluster, app) == ["a/1", "b"]
    more = store.append_many("b", [frame("y2", P1, 102), frame("y3", P1, 103)])

    seen = {p.journal: p for p in progress(cluster, app, store, frames=True)}
    assert list(seen) == ["a/1", "b"]  # the journals it holds checkpoints of
    a, b = seen["a/1"], seen["b"]
    assert (a.offset, a.end, a.lag_bytes, a.lag_frames, a.producers, a.open_transactions) == (
        store.end("a/1"),
        store.end("a/1"),
        0,
        0,
        2,
        1,
    )
    assert (b.offset, b.end, b.lag_bytes, b.lag_frames, b.producers, b.open_transactions) == (
        more[0].begin,
        more[1].end,
        more[1].end - more[0].begin,
        2,
        1,
        0,
    )
    assert a.checkpointed and a.error is None and a.lost == () and a.skipped == ()
    assert a.journal_id == store.info("a/1").uid
    assert a.last_moved is not None and started - 1 <= a.last_moved <= time.time() + 1

    # A poll that finds nothing new does not move the checkpoint, nor its time.
    time.sleep(0.01)
    Consumer(cluster, store, mapper, app, selector="team!=other").poll()
    again = {p.journal: p for p in progress(cluster, app, store)}
    assert again["a/1"].last_moved == a.last_moved and again["a/1"].lag_frames is None
    assert again["b"].last_moved is not None and again["b"].last_moved > a.last_moved and again["b"].lag_bytes == 0

    # With a selector, the store's journals it has not read yet show at offset 0.
    everything = {p.journal: p for p in progress(cluster, app, store, selector="")}
    assert list(everything) == ["a/1", "b", "c"]
    c = everything["c"]
    assert (c.offset, c.lag_bytes, c.checkpointed, c.last_moved) == (0, 0, False, None)

    # Without a journal store only the checkpoints are known; a journal gone from the store is named.
    bare = {p.journal: p for p in progress(cluster, app)}
    assert bare["b"].offset == again["b"].offset and bare["b"].end is None and bare["b"].lag_bytes is None
    store.destroy("a/1")
    gone = {p.journal: p for p in progress(cluster, app, store)}
    assert "not in the journal store" in (gone["a/1"].error or "") and gone["a/1"].lag_bytes is None


def test_progress_names_a_journal_created_again(tmp_path: Path, cluster: Cluster) -> None:
    app = f"mon{uuid.uuid4().hex[:8]}"
    store = FileJournals(tmp_path / "journals")
    create(store, "j")
    store.append("j", frame("x", P1, 101))
    Consumer(cluster, f"file://{tmp_path / 'journals'}", mapper, app).poll()
    store.destroy("j")
    create(store, "j")
    (seen,) = progress(cluster, app, f"file://{tmp_path / 'journals'}")
    assert "created again" in (seen.error or "") and "restart_journal" in (seen.error or "")


def test_checkpoints_in_the_v2_layout_are_read_without_a_time_and_saved_as_v3(cluster: Cluster) -> None:
    app = f"mon{uuid.uuid4().hex[:8]}"
    state = StateStore(cluster, app)
    producer = ProducerState("j", ProducerID(P1), last_ack=7, begin=-1, max_clock=7)
    key = f"{app}/journal/j"
    state.cluster.insert([KeyScoreMember(key, 40.0, f"v2|id1|0|40|{P1.hex()}:7:-1:7")])
    timed = state.load_journal_timed("j")
    assert timed.checkpoint == (40, [producer], "id1", 0) and timed.saved_at is None
    (seen,) = progress(cluster, app)
    assert seen.offset == 40 and seen.last_moved is None and seen.checkpointed
    assert state.save_journal("j", 40, [producer], journal_id="id1") is False  # not forward: nothing written
    assert state.save_journal("j", 50, [producer], journal_id="id1") is True
    (record,) = state.cluster.select([key], limit=10)[key]
    assert str(record.member).startswith("v3|id1|0|50|")
    timed = state.load_journal_timed("j")
    assert timed.checkpoint == (50, [producer], "id1", 0) and timed.saved_at is not None
