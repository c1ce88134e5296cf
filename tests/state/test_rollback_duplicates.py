"""A late copy of a rolled-back message (a retried or re-routed append landing after the rollback ACK) is
never delivered, also when the same publisher commits its next transaction: a rollback retires the
producer id (``zcluster.message.producer``). Real file journals; the pure Sequencer restored from a
checkpoint at every envelope, and a real Consumer on real Redis servers polling before and after the
commit."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zcluster import Cluster
from zcluster.journal import AsyncPublisher, FileJournals
from zcluster.message import Envelope, JsonMessage, QueueOutcome, ReadUncommittedIter, Sequencer, framing_for
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.state import Consumer
from zcluster.testing.traffic import create_journals

_names = itertools.count()
JOURNAL = "txn/part-000"


def _to_journal(msg: Any) -> tuple[str, str]:
    return JOURNAL, CONTENT_TYPE_NDJSON


def _reproduce(store: FileJournals, between: Callable[[], None] = lambda: None) -> tuple[bytes, bytes]:
    """The one-message reproduction: c0 committed; a transaction of r1 and r2 rolled back (its ACK
    appended); the exact bytes of r1's frame appended again; ``between()``; then the same publisher's next
    transaction (k1) committed. Returns the producer id before and after the rollback."""
    create_journals(store, [JOURNAL])
    framing = framing_for(CONTENT_TYPE_NDJSON)
    with AsyncPublisher(store) as pub:
        pub.publish_committed(_to_journal, JsonMessage({"n": "c0"}))
        r1 = JsonMessage({"n": "r1"})
        pub.publish_uncommitted(_to_journal, r1)
        pub.publish_uncommitted(_to_journal, JsonMessage({"n": "r2"}))
        old = pub.producer
        pub.rollback()
        pub.barrier()  # the rollback ACK is in the journal
        store.append(JOURNAL, framing.marshal(r1))  # a retried append of r1, after the ACK
        between()
        pub.publish_uncommitted(_to_journal, JsonMessage({"n": "k1"}))
        pub.commit()
        pub.barrier()
        return old, pub.producer


def _sequenced(store: FileJournals, seq: Sequencer, envs: list[Envelope], out: list[str]) -> None:
    for env in envs:
        if seq.queue_uncommitted(env) is QueueOutcome.ACK_COMMIT_REPLAY:
            _, begin, end = seq.replay_range()
            seq.start_replay(ReadUncommittedIter(store, store.spec(JOURNAL), begin, end=end))
        while (got := seq.step()) is not None:
            if not got.is_ack:
                out.append(got.message.doc["n"])


def test_a_late_copy_of_a_rolled_back_message_is_never_committed_by_the_sequencer(tmp_path: Path) -> None:
    store = FileJournals(tmp_path / "journals")
    old, new = _reproduce(store)
    spec = store.spec(JOURNAL)
    envs = list(ReadUncommittedIter(store, spec))
    assert [e.message.doc.get("n") for e in envs] == ["c0", "r1", "r2", None, "r1", "k1", None]
    for cut in range(len(envs) + 1):  # a reader that starts from a checkpoint taken at any envelope
        out: list[str] = []
        first = Sequencer()
        _sequenced(store, first, envs[:cut], out)
        cp = first.checkpoint()
        rest = [e for e in envs if e.begin >= cp.offsets.get(JOURNAL, 0)]
        _sequenced(store, Sequencer(cp.offsets, cp.states), rest, out)
        assert out == ["c0", "k1"], cut
    assert old != new  # why: the rollback retired the producer id


def test_a_late_copy_of_a_rolled_back_message_never_reaches_a_consumers_mapper(shards: Any, tmp_path: Path) -> None:
    store = FileJournals(tmp_path / "journals")
    seen: list[str] = []

    def mapper(message: Any) -> list[Any]:
        seen.append(message.doc["n"])
        return []

    app = f"rbdup{next(_names)}"
    with Cluster.from_urls(shards.urls, prefix=f"{app}:") as cluster:
        consumer = Consumer(cluster, store, mapper, app)
        # A poll between the copy and the commit: the next poll starts from that checkpoint.
        _reproduce(store, between=lambda: seen.append(f"poll:{consumer.poll().delivered}"))
        consumer.poll()
        assert seen == ["c0", "poll:1", "k1"]
        fresh: list[str] = []
        Consumer(cluster, store, lambda m: fresh.append(m.doc["n"]) or [], f"{app}-whole").poll()
        assert fresh == ["c0", "k1"]  # one poll over the whole journal
