"""Each journal is its own stream: one failing journal does not stall the others; a checkpoint is bound to
the journal it was taken of; an invalid write from the mapper is located (real servers, both journal kinds)."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Insert, JournalMismatchError, MapperError, PollError
from zcluster.journal import FileJournals, RedisJournals
from zcluster.journal._filefmt import META_NAME
from zcluster.journal.store import JournalStore
from zcluster.message import Flags, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.state import Consumer, StateStore
from zcluster.testing import LocalShards

_ids = itertools.count()
_clock = itertools.count(1000)
PRODUCER = b"\x05" * 6


def publish(store: JournalStore, journal: str, docs: list[dict[str, Any]]) -> list[int]:
    """Append one committed message per doc; returns each frame's begin offset."""
    frames = []
    for doc in docs:
        uuid = format_uuid(build_uuid(PRODUCER, next(_clock) << 4, Flags.OUTSIDE_TXN))
        frames.append((json.dumps({"UUID": uuid, **doc}) + "\n").encode())
    return [r.begin for r in store.append_many(journal, frames)]


def create(store: JournalStore, journal: str) -> None:
    store.create(JournalSpec(journal, {"content-type": CONTENT_TYPE_NDJSON}))


def mapper(message: Any) -> list[Insert]:
    doc = message.doc
    if doc.get("boom"):
        raise RuntimeError(f"cannot map {doc['id']}")
    return [Insert(f"k:{doc['j']}", float(doc.get("score", 1.0)), doc["id"])]


def members(cluster: Cluster, key: str) -> list[str]:
    return sorted(str(t.member) for t in cluster.select([key], limit=1000)[key])


@pytest.fixture(params=["file", "stream"])
def store(request: pytest.FixtureRequest, tmp_path: Path, shards: LocalShards) -> Iterator[Any]:
    if request.param == "file":
        s: Any = FileJournals(tmp_path / "journals")
    else:
        s = RedisJournals.from_url(f"{shards.urls[0]}?prefix=cj{next(_ids)}:")
    yield s
    s.close()


@pytest.fixture
def app() -> str:
    return f"app{next(_ids)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def cluster(shards: LocalShards) -> Iterator[Cluster]:
    with Cluster.from_urls(shards.urls, prefix=f"cj{next(_ids)}:") as c:
        yield c


def test_one_failing_journal_does_not_stall_the_others(app: str, store: Any, cluster: Cluster) -> None:
    names = ["a", "b", "c"]
    for n in names:
        create(store, n)
        publish(store, n, [{"j": n, "id": f"{n}{i}"} for i in range(3)])
    bad = publish(store, "a", [{"j": "a", "id": "a3", "boom": True}])[0]
    publish(store, "a", [{"j": "a", "id": "a4"}])
    for n in ("b", "c"):
        publish(store, n, [{"j": n, "id": f"{n}3"}])
    consumer = Consumer(cluster, store, mapper, app)
    state = StateStore(cluster, app)
    for round_ in range(2):  # reported on every poll, and the others go on each time
        publish(store, "b", [{"j": "b", "id": f"new{round_}"}])
        with pytest.raises(PollError) as info:
            consumer.poll()
        (failure,) = info.value.failures
        assert failure.journal == "a" and failure.offset == 0  # "a" keeps its checkpoint
        assert isinstance(failure.error, MapperError) and f"journal a offset {bad}" in str(failure.error)
        assert info.value.exceptions == (failure.error,)
        assert f"new{round_}" in members(cluster, "k:b") and members(cluster, "k:c") == ["c0", "c1", "c2", "c3"]
        assert state.load_journal("b").offset == store.end("b") and state.load_journal("c").offset == store.end("c")
    Consumer(cluster, store, lambda m: [] if m.doc.get("boom") else mapper(m), app).poll()
    assert members(cluster, "k:a") == ["a0", "a1", "a2", "a4"]
    assert members(cluster, "k:b") == ["b0", "b1", "b2", "b3", "new0", "new1"]


def test_run_reports_a_failing_journal_on_every_poll_and_keeps_going(
    app: str, store: Any, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    for n in ("a", "b"):
        create(store, n)
    publish(store, "a", [{"j": "a", "id": "a0", "boom": True}])
    publish(store, "b", [{"j": "b", "id": "b0"}])
    consumer = Consumer(cluster, store, mapper, app)
    stop = threading.Event()
    caplog.set_level(logging.ERROR, logger="zcluster.state")
    worker = threading.Thread(target=consumer.run, args=(stop,), kwargs={"interval": 0.02})
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            reports = [r for r in caplog.records if "journal a stays at offset 0" in r.getMessage()]
            if len(reports) >= 3 and "b1" in members(cluster, "k:b"):
                break
            if "b1" not in members(cluster, "k:b") and members(cluster, "k:b") == ["b0"]:
                publish(store, "b", [{"j": "b", "id": "b1"}])  # published while a is failing
            time.sleep(0.02)
    finally:
        stop.set()
        worker.join(120)
    assert not worker.is_alive()
    assert len([r for r in caplog.records if "journal a stays at offset 0" in r.getMessage()]) >= 3
    assert members(cluster, "k:b") == ["b0", "b1"] and members(cluster, "k:a") == []


def test_an_invalid_write_from_the_mapper_names_journal_offset_and_write(
    app: str, store: Any, cluster: Cluster
) -> None:
    create(store, "j")
    publish(store, "j", [{"j": "j", "id": f"m{i}"} for i in range(5)])
    nan_at = publish(store, "j", [{"j": "j", "id": "bad", "score": "nan"}])[0]
    publish(store, "j", [{"j": "j", "id": "m5"}])

    def nan_mapper(message: Any) -> list[Insert]:
        return [Insert("k:j", float(message.doc.get("score", 1.0)), message.doc["id"])]

    with pytest.raises(PollError) as info:
        Consumer(cluster, store, nan_mapper, app, flush=4).poll()
    error = info.value.failures[0].error
    assert isinstance(error, MapperError)
    assert f"journal j offset {nan_at}" in str(error) and "'bad'" in str(error) and "nan" in str(error)
    assert StateStore(cluster, app).load_journal("j").offset == 0  # nothing checkpointed
    assert "bad" not in members(cluster, "k:j")


def test_a_journal_created_again_under_its_name_is_refused_until_restarted(
    app: str, store: Any, cluster: Cluster
) -> None:
    create(store, "j")
    publish(store, "j", [{"j": "j", "id": f"old{i}"} for i in range(6)])
    consumer = Consumer(cluster, store, mapper, app)
    consumer.poll()
    old_id, old_end = store.info("j").uid, store.end("j")
    checkpoint = StateStore(cluster, app).load_journal("j")
    assert old_id and (checkpoint.offset, checkpoint.journal_id, len(checkpoint.states)) == (old_end, old_id, 1)
    store.destroy("j")  # or a Redis server restarted without persistence, and the journal made again
    create(store, "j")
    publish(store, "j", [{"j": "j", "id": f"new{i}"} for i in range(2)])  # ends below the old checkpoint
    assert store.info("j").uid != old_id and store.end("j") < old_end
    for _ in range(2):
        with pytest.raises(PollError) as info:
            consumer.poll()
        error = info.value.failures[0].error
        assert isinstance(error, JournalMismatchError)
        assert (error.journal, error.stored_id, error.current_id) == ("j", old_id, store.info("j").uid)
        assert "restart_journal('j')" in str(error)
    assert members(cluster, "k:j") == [f"old{i}" for i in range(6)]  # nothing of the new journal was skipped...
    state = StateStore(cluster, app)
    state.restart_journal("j", reason="journal j was re-created")
    consumer.poll()  # ...it is delivered from its start once an operator says so
    assert members(cluster, "k:j") == sorted([f"old{i}" for i in range(6)] + ["new0", "new1"])
    assert (
        state.load_journal("j").offset == store.end("j") and state.load_journal("j").journal_id == store.info("j").uid
    )
    (entry,) = state.audit()
    assert entry["action"] == "restart" and entry["journal"] == "j" and entry["offset"] == old_end
    assert entry["stored_id"] == old_id and entry["reason"] == "journal j was re-created"


def test_a_checkpoint_past_the_journals_end_is_refused(app: str, tmp_path: Path, cluster: Cluster) -> None:
    """A journal without an identity (made before identities existed) is still caught by its end."""
    store = FileJournals(tmp_path / "j")
    create(store, "j")
    publish(store, "j", [{"j": "j", "id": f"old{i}"} for i in range(4)])
    _forget_identity(tmp_path / "j" / "j")
    Consumer(cluster, store, mapper, app).poll()
    old_end = store.end("j")
    store.destroy("j")
    create(store, "j")
    _forget_identity(tmp_path / "j" / "j")
    publish(store, "j", [{"j": "j", "id": "new0"}])
    with pytest.raises(PollError) as info:
        Consumer(cluster, store, mapper, app).poll()
    error = info.value.failures[0].error
    assert isinstance(error, JournalMismatchError) and (error.offset, error.end) == (old_end, store.end("j"))
    assert f"checkpoint offset {old_end} of journal j lies past its end {store.end('j')}" in str(error)
    store.close()


def _forget_identity(journal_dir: Path) -> None:
    meta = journal_dir / META_NAME
    doc = json.loads(meta.read_text())
    del doc["uid"]
    meta.write_text(json.dumps(doc))
