"""Lost ranges of file journals: the applier stops before one (everything before it delivered and
checkpointed), an operator skips exactly it (audited, anything else refused), or fail_on_data_loss=False skips
it by itself (logged, counted, audited). Real servers, real file journals damaged on disk."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, ConfigError, Insert, PollError
from zcluster.journal import FileJournals
from zcluster.journal._filefmt import find_fragment
from zcluster.journal.frames import read_frames
from zcluster.message import Flags, OffsetOutOfRangeError, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.state import Applier, BatchStats, Consumer, StateStore, progress
from zcluster.testing import LocalShards

CT = CONTENT_TYPE_NDJSON
P1, P2 = b"\x01" * 6, b"\x02" * 6


def frame(ident: str, producer: bytes = P1, clock: int = 0, flags: int = Flags.OUTSIDE_TXN) -> bytes:
    doc = {"UUID": format_uuid(build_uuid(producer, clock << 4, flags)), "id": ident}
    return (json.dumps(doc) + "\n").encode()


def committed(n: int) -> list[bytes]:
    return [frame(f"m{i}", clock=100 + i) for i in range(n)]


def damage(root: Path, frames: list[bytes], lost: set[int]) -> tuple[FileJournals, list[tuple[int, int]]]:
    """Journal "j" with one fragment file per append (one per frame), the files of the appends in ``lost``
    cut short; returns the store reopened (recovered: those appends are lost ranges) and each append's range."""
    with FileJournals(root, fragment_bytes=1) as fj:
        fj.create(JournalSpec("j", {"content-type": CT}))
        ranges = [(r.begin, r.end) for r in (fj.append("j", f) for f in frames)]
    for i in lost:
        path = root / "j" / find_fragment(root / "j", *ranges[i])
        path.write_bytes(path.read_bytes()[:-3])
    store = FileJournals(root, fragment_bytes=1)
    assert [(r.begin, r.end) for r in store.lost_ranges("j")] == sorted(ranges[i] for i in lost)
    return store, ranges


def mapper(message: Any) -> list[Insert]:
    return [Insert("k", 1.0, message.doc["id"])]


def members(cluster: Cluster) -> list[str]:
    return sorted(str(t.member) for t in cluster.select(["k"], limit=1000)["k"])


@pytest.fixture
def cluster(shards: LocalShards) -> Iterator[Cluster]:
    with Cluster.from_urls(shards.urls, prefix=f"lr{uuid.uuid4().hex[:8]}:") as c:
        yield c


@pytest.fixture
def app() -> str:
    return f"lost{uuid.uuid4().hex[:8]}"


def test_the_consumer_stops_before_a_lost_range_until_an_operator_skips_exactly_it(
    tmp_path: Path, cluster: Cluster, app: str
) -> None:
    store, ranges = damage(tmp_path / "journals", committed(10), {4})
    b, e = ranges[4]
    consumer = Consumer(cluster, store, mapper, app)
    state = StateStore(cluster, app)
    for _ in range(2):  # on every poll, and nothing moves
        with pytest.raises(PollError) as info:
            consumer.poll()
        (failure,) = info.value.failures
        error = failure.error
        assert isinstance(error, OffsetOutOfRangeError)
        assert (error.journal, error.lost, error.lost_begin, error.lost_end, error.resume_offset) == (
            "j",
            (b, e),
            b,
            e,
            e,
        )
        assert f"stays at offset {b}" in str(error) and f"zcluster consumers {app} skip-lost j" in str(error)
        assert failure.offset == b  # everything before the lost range was delivered and checkpointed
        assert members(cluster) == ["m0", "m1", "m2", "m3"]
    (seen,) = progress(cluster, app, store)
    assert seen.offset == b and seen.lost == ((b, e, seen.lost[0][2]),) and "skip-lost j" in (seen.error or "")
    assert seen.lag_bytes == store.end("j") - b

    # Refused: another range, an application that has not reached it, a store that keeps no lost ranges.
    for begin, end in ((b + 1, e), (b, e + 1), ranges[5]):
        with pytest.raises(ConfigError, match="not a lost range"):
            state.skip_lost(store, "j", begin, end, reason="wrong")
    with pytest.raises(ConfigError, match="not applied yet"):
        StateStore(cluster, app + "x").skip_lost(store, "j", b, e)
    with pytest.raises(ConfigError, match="keeps no lost ranges"):
        state.skip_lost(object(), "j", b, e)
    assert state.load_journal("j").offset == b and state.audit() == []

    moved = state.skip_lost(store, "j", b, e, reason="disk damage, ticket 7")
    assert moved.offset == e and state.load_journal("j").offset == e
    (entry,) = state.audit()
    assert (entry["action"], entry["journal"], entry["begin"], entry["end"], entry["offset"], entry["by"]) == (
        "skip",
        "j",
        b,
        e,
        b,
        "operator",
    )
    assert entry["reason"] == "disk damage, ticket 7" and isinstance(entry["at"], float)
    stats = consumer.poll()
    assert stats.delivered == 5 and stats.lost_skipped == 0
    assert members(cluster) == [f"m{i}" for i in range(10) if i != 4]
    assert state.load_journal("j").offset == store.end("j")
    with pytest.raises(ConfigError, match="already past"):
        state.skip_lost(store, "j", b, e)
    (seen,) = progress(cluster, app, store)
    assert seen.error is None and seen.lost == () and seen.lag_bytes == 0
    (skipped,) = seen.skipped
    assert (skipped.begin, skipped.end, skipped.offset, skipped.by) == (b, e, b, "operator")
    assert skipped.reason == "disk damage, ticket 7" and skipped.at == entry["at"]


def test_fail_on_data_loss_false_skips_each_lost_range_logged_counted_and_audited(
    tmp_path: Path, cluster: Cluster, app: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, ranges = damage(tmp_path / "journals", committed(12), {3, 4, 9})  # 3 and 4: adjacent ranges
    seen: list[tuple[str, BatchStats]] = []
    consumer = Consumer(cluster, store, mapper, app, fail_on_data_loss=False, metrics=lambda a, s: seen.append((a, s)))
    caplog.set_level(logging.WARNING, logger="zcluster.state")
    stats = consumer.poll()
    assert stats.lost_skipped == 3 and stats.lost_bytes == sum(ranges[i][1] - ranges[i][0] for i in (3, 4, 9))
    assert stats.delivered == 9 and stats.lag == {"j": 0}
    assert members(cluster) == sorted(f"m{i}" for i in range(12) if i not in (3, 4, 9))
    assert [a for a, _ in seen] == [app] and seen[0][1] is stats and stats.seconds > 0
    warned = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "skipping lost" in r.getMessage()
    ]
    assert len(warned) == 3 and f"{ranges[9][0]}..{ranges[9][1]}" in warned[2]
    audit = StateStore(cluster, app).audit()
    assert [(a["begin"], a["end"], a["by"]) for a in audit] == [(*ranges[i], "applier") for i in (3, 4, 9)]
    assert all("fail_on_data_loss=False" in str(a["reason"]) for a in audit)
    assert consumer.poll().lost_skipped == 0 and len(StateStore(cluster, app).audit()) == 3


def test_a_transaction_spanning_an_operators_skip_keeps_what_survives(
    tmp_path: Path, cluster: Cluster, app: str
) -> None:
    frames = [
        frame("t1", P1, 101, Flags.CONTINUE_TXN),  # P1's transaction opens before the lost range...
        frame("c1", P2, 101),  # ...this append is lost...
        frame("t2", P1, 102, Flags.CONTINUE_TXN),  # ...and goes on after it
        frame("ack", P1, 102, Flags.ACK_TXN),
        frame("c2", P2, 102),
    ]
    store, ranges = damage(tmp_path / "journals", frames, {1})
    consumer = Consumer(cluster, store, mapper, app)
    with pytest.raises(PollError):
        consumer.poll()
    held = StateStore(cluster, app).load_journal("j")
    assert held.offset == ranges[1][0] and [s.begin for s in held.states] == [0]  # the open span, kept
    StateStore(cluster, app).skip_lost(store, "j", *ranges[1], reason="test")
    assert StateStore(cluster, app).load_journal("j").states == held.states  # producer states as they were
    stats = consumer.poll()  # the ACK replays t1 from the journal: the replay steps over the lost range
    assert stats.replays == 1
    assert members(cluster) == ["c2", "t1", "t2"]


def test_a_lost_rollback_lets_the_producers_next_commit_deliver_the_span(
    tmp_path: Path, cluster: Cluster, app: str
) -> None:
    """What the docs say a skip means when the lost range held a transaction's ACK: the journal no longer
    says the span was rolled back, and the producer's next commit commits it."""
    frames = [
        frame("t1", P1, 101, Flags.CONTINUE_TXN),
        frame("ack", P1, 100, Flags.ACK_TXN),  # a rollback: lost
        frame("t3", P1, 103, Flags.CONTINUE_TXN),
        frame("ack", P1, 103, Flags.ACK_TXN),
    ]
    store, _ = damage(tmp_path / "journals", frames, {1})
    Consumer(cluster, store, mapper, app, fail_on_data_loss=False).poll()
    assert members(cluster) == ["t1", "t3"]


def test_the_applier_of_frame_rows_treats_a_lost_range_row_alike(tmp_path: Path, cluster: Cluster, app: str) -> None:
    """The Spark sink's frame rows (the source's failOnDataLoss=false gives a row per lost range)."""
    store, ranges = damage(tmp_path / "journals", committed(6), {2})
    rows = list(read_frames(store, "j", CT, 0, store.end("j"), lost_rows=True))
    assert [r.error is not None for r in rows] == [False, False, True, False, False, False]
    with pytest.raises(OffsetOutOfRangeError) as info:
        Applier(cluster, app, mapper, store).apply("j", iter(rows), BatchStats())
    assert info.value.lost == ranges[2] and StateStore(cluster, app).load_journal("j").offset == ranges[2][0]
    stats = BatchStats()
    Applier(cluster, app, mapper, store, fail_on_data_loss=False).apply("j", iter(rows), stats)
    assert stats.lost_skipped == 1 and members(cluster) == ["m0", "m1", "m3", "m4", "m5"]
    assert StateStore(cluster, app).load_journal("j").offset == store.end("j") and stats.lag == {"j": 0}
