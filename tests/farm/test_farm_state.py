"""The state layer on a farm: checkpoints and batch progress survive the loss of a replica, dedup admits
each message once."""

from __future__ import annotations

from pathlib import Path

import pytest
from farm_helpers import farm_of

from zcluster import ConfigError
from zcluster.farm import SendAllReadAll
from zcluster.journal import FileJournals
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.sequencer import ProducerState
from zcluster.message.uuid import ProducerID, build_uuid
from zcluster.state import Consumer, DedupStore, StateStore
from zcluster.state.txn import TxnStore
from zcluster.testing import LocalShards

P1, P2 = ProducerID(bytes.fromhex("010203040506")), ProducerID(bytes.fromhex("0a0b0c0d0e0f"))


def test_checkpoints_on_a_farm_survive_a_lost_replica() -> None:
    with LocalShards(3) as s, farm_of(s.urls, read=SendAllReadAll()) as farm:
        store = StateStore(farm, "app")  # type: ignore[arg-type]
        first = [ProducerState("j", P1, 10, 5, 12), ProducerState("j", P2, 3, -1, 3)]
        assert store.save_journal("j", 100, first) is True
        ck = store.load_journal("j")
        assert ck.offset == 100 and set(ck.states) == set(first)
        assert store.commit_batch("q", 0) is True

        s.kill(0)  # a checkpoint saved while replica0 is down lands on the other two
        second = ProducerState("j", P1, 20, -1, 20)
        assert store.save_journal("j", 200, [second, first[1]]) is True  # a save holds every producer
        assert store.commit_batch("q", 1) is True
        ck = store.load_journal("j")
        assert ck.offset == 200 and set(ck.states) == {second, first[1]}

        s.start(0)  # back, empty; then replica1 dies: replica0 (empty) and replica2 answer
        s.kill(1)
        ck = store.load_journal("j")
        assert ck.offset == 200 and set(ck.states) == {second, first[1]}
        assert store.committed_batch("q") == 1
        assert store.save_journal("j", 150, [first[0]]) is False  # a zombie's older checkpoint changes nothing
        ck = store.load_journal("j")
        assert ck.offset == 200 and set(ck.states) == {second, first[1]}
        assert store.commit_batch("q", 0) is False

        # the reads above repaired replica0 from replica2: replica0 alone now answers the latest checkpoint
        s.kill(2)
        ck = store.load_journal("j")
        assert ck.offset == 200 and set(ck.states) == {second, first[1]}
        assert store.committed_batch("q") == 1


def test_dedup_on_a_farm_admits_once_while_a_replica_is_down() -> None:
    with LocalShards(3) as s, farm_of(s.urls) as farm:
        dedup = DedupStore(farm)
        uuids = [build_uuid(P1, 1000 + i, 0) for i in range(10)]
        assert dedup.admit_many([("j", u) for u in uuids[:5]]) == [True] * 5
        s.kill(2)
        assert dedup.admit_many([("j", u) for u in uuids]) == [False] * 5 + [True] * 5
        assert dedup.admit_many([("j", u) for u in uuids]) == [False] * 10
        s.start(2)  # empty
        assert dedup.admit_many([("j", u) for u in uuids]) == [False] * 10  # never admitted twice
        assert dedup.prune("j", 1004) == 5
        assert dedup.admit("j", uuids[0]) is False  # pruned: refused, not admitted again
        assert dedup.admit("j", build_uuid(P2, 2000, 0)) is True


def test_a_publishing_application_on_a_farm_is_refused(tmp_path: Path) -> None:
    """Its fenced checkpoints need reads that see every acknowledged write; a farm's read answers from one
    replica when the others are down (shown here), so the consumer and the fenced checkpoints refuse a farm."""
    with LocalShards(3) as s, farm_of(s.urls, read=SendAllReadAll()) as farm:
        store = FileJournals(tmp_path / "journals")
        store.create(JournalSpec("out", {"content-type": CONTENT_TYPE_NDJSON}))
        with pytest.raises(ConfigError, match=r"application pub publishes .* farm of replicas"):
            Consumer(farm, store, lambda m: [], "pub", publish=store)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="farm of replicas"):
            TxnStore(StateStore(farm, "pub"))  # type: ignore[arg-type]
        Consumer(farm, store, lambda m: [], "plain").close()  # type: ignore[arg-type]  # not publishing: fine
        farm.insert([("k", 1.0, "a")])
        s.kill(1)
        s.kill(2)
        assert [r.member for r in farm.select(["k"])["k"]] == ["a"]  # one replica of three answered, no error
        store.close()
