"""Channels over both backends: management, produce/broadcast, group consume/ack/nack/seek, time ticks."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from channel_helpers import run_proc

from zcluster.channels import Channels
from zcluster.journal import FileJournals, JournalStore, RedisJournals
from zcluster.message import (
    JsonMessage,
    OffsetOutOfRangeError,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    get_clock,
    modulo_mapping,
    partitions_from,
)


def msg(i: int) -> JsonMessage:
    return JsonMessage({"i": i})


def ids(envs: list) -> list[int]:
    return [e.message.doc["i"] for e in envs]


def test_create_describe_destroy(store: JournalStore) -> None:
    ch = Channels(store)
    ch.create_channels(["pv/0", "pv/1"], topic="pv", owner="alice", description="page views")
    ch.create_channels(["other/0"], topic="other")
    assert ch.channels("pv") == ["pv/0", "pv/1"]
    [d0, d1] = ch.describe_channels(["pv/0", "pv/1"])
    assert (d0.name, d0.topic, d0.owner, d0.description, d0.end) == ("pv/0", "pv", "alice", "page views", 0)
    assert d1.labels["content-type"] == "application/x-ndjson"
    ch.destroy_channels(["pv/0"])
    assert ch.channels("pv") == ["pv/1"]


def test_produce_by_mapping_and_broadcast(store: JournalStore) -> None:
    ch = Channels(store)
    names = [f"t/{i}" for i in range(4)]
    ch.create_channels(names, topic="t")
    mapping = modulo_mapping(lambda m: str(m.doc["i"]), partitions_from(store, "topic=t", refresh_interval=0))
    msgs = [msg(i) for i in range(40)]
    results = ch.produce(msgs, mapping)
    assert len(results) == 40
    per_channel = {n: ids(ch.consume("g", n, 100)) for n in names}
    assert sorted(i for v in per_channel.values() for i in v) == list(range(40))
    for n, got in per_channel.items():
        assert got == sorted(got)  # input order kept within a channel
        assert all(mapping(msg(i))[0] == n for i in got)
    clocks = [get_clock(m.get_uuid()) for m in msgs]
    assert clocks == sorted(clocks) and len(set(clocks)) == 40
    where = ch.broadcast(JsonMessage({"i": -1}), "t")
    assert sorted(where) == names
    assert all(ids(ch.consume("g", n, 100)) == [-1] for n in names)


class Checked(JsonMessage):
    """A message that must not be published when its doc says ``bad``."""

    def validate(self) -> None:
        if self.doc.get("bad"):
            raise ValueError("bad message")


def test_produce_and_broadcast_validate_messages_before_appending_any(store: JournalStore) -> None:
    ch = Channels(store)
    ch.create_channels(["c/0", "c/1"], topic="t")
    to_c0 = lambda m: ("c/0", "application/x-ndjson")  # noqa: E731
    with pytest.raises(ValueError, match="bad message"):
        ch.produce([Checked({"i": 1}), Checked({"i": 2, "bad": True})], to_c0)
    with pytest.raises(ValueError, match="bad message"):
        ch.broadcast(Checked({"i": 3, "bad": True}), "t")
    assert store.end("c/0") == store.end("c/1") == 0  # not even the valid message before the bad one
    ch.produce([Checked({"i": 1})], to_c0)
    ch.broadcast(Checked({"i": 3}), "t")
    assert ids(ch.consume("g", "c/0", 10)) == [1, 3] and ids(ch.consume("g", "c/1", 10)) == [3]


def test_concurrent_produce_keeps_clocks_in_channel_order(tmp_path: Path) -> None:
    with FileJournals(tmp_path) as fj:
        ch = Channels(fj)
        ch.create_channels(["a", "b"], topic="t")
        mapping = lambda m: ("a" if m.doc["i"] % 3 else "b", "application/x-ndjson")  # noqa: E731

        def run(t: int) -> None:
            for k in range(40):
                ch.produce([msg(1000 * t + 10 * k + j) for j in range(4)], mapping)
                ch.broadcast(msg(-(1000 * t + k) - 1), "t")

        threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name in ("a", "b"):
            spec = fj.info(name).spec
            clocks = [e.clock for e in ReadUncommittedIter(fj, spec)]
            assert clocks == sorted(clocks) and len(set(clocks)) == len(clocks)
            # so a read-committed reader drops none of them as an old duplicate
            assert len(list(ReadCommittedIter(fj, spec, Sequencer()))) == len(clocks)


def test_consume_advances_durable_position_only_on_ack(store: JournalStore) -> None:
    ch = Channels(store)
    ch.create_channels(["c"], topic="t")
    ch.produce([msg(i) for i in range(10)], lambda m: ("c", "application/x-ndjson"))
    first = ch.consume("g", "c", 3)
    assert ids(first) == [0, 1, 2]
    assert ids(ch.consume("g", "c", 3)) == [3, 4, 5]
    assert ch.position("g", "c") == 0
    ch.ack("g", "c", first[-1])
    assert ch.position("g", "c") == first[-1].end
    ch.nack("g", "c")
    assert ids(ch.consume("g", "c", 100)) == list(range(3, 10))
    assert ids(Channels(store).consume("g", "c", 2)) == [3, 4]  # a fresh consumer starts at the durable position
    assert ids(ch.consume("other", "c", 1)) == [0]  # groups are independent
    with pytest.raises(ValueError, match="before delivering"):
        ch.ack("other", "c", first[-1].end)


def test_seek_backwards_and_forwards(store: JournalStore) -> None:
    ch = Channels(store)
    ch.create_channels(["c"], topic="t")
    res = ch.produce([msg(i) for i in range(5)], lambda m: ("c", "application/x-ndjson"))
    ch.seek("g", "c", res[3].begin)
    assert ids(ch.consume("g", "c", 10)) == [3, 4] and ch.position("g", "c") == res[3].begin
    ch.seek("g", "c", 0)
    assert ids(ch.consume("g", "c", 1)) == [0]
    with pytest.raises(OffsetOutOfRangeError):
        ch.seek("g", "c", res[-1].end + 1)


def test_blocking_consume_waits_for_a_message(store: JournalStore) -> None:
    ch = Channels(store)
    ch.create_channels(["c"], topic="t")
    assert ch.consume("g", "c", 5, timeout=0.05) == []
    ch.produce([msg(1), msg(2)], lambda m: ("c", "application/x-ndjson"))
    assert ids(ch.consume("g", "c", 5, timeout=120)) == [1, 2]  # they are there: a bound only


def test_time_tick_consumption_is_aligned_across_channels(store: JournalStore) -> None:
    ch = Channels(store)
    ch.create_channels(["a", "b"], topic="t")
    to = lambda name: lambda m: (name, "application/x-ndjson")  # noqa: E731
    ch.produce([msg(1), msg(2)], to("a"))
    ch.produce([msg(3)], to("b"))
    watermark = ch.clock.value
    ch.produce([msg(4)], to("a"))
    ch.produce([msg(5), msg(6)], to("b"))
    batch = ch.consume_until("g", ["a", "b"], watermark)
    assert {k: ids(v) for k, v in batch.items()} == {"a": [1, 2], "b": [3]}
    assert all(e.clock <= watermark for v in batch.values() for e in v)
    rest = ch.consume_until("g", ["a", "b"], ch.clock.value)
    assert {k: ids(v) for k, v in rest.items()} == {"a": [4], "b": [5, 6]}


def test_unacknowledged_messages_of_a_killed_consumer_process_are_redelivered(
    store: JournalStore, request: pytest.FixtureRequest, prefix: str
) -> None:
    ch = Channels(store)
    ch.create_channels(["c"], topic="t")
    res = ch.produce([msg(i) for i in range(6)], lambda m: ("c", "application/x-ndjson"))
    first = ch.consume("g", "c", 2)
    ch.ack("g", "c", first[-1])
    if isinstance(store, FileJournals):
        backend, where = "file", str(store.root)
    else:
        assert isinstance(store, RedisJournals)
        backend, where = "redis", request.getfixturevalue("shards").urls[0]
    proc = run_proc("channel_consume_and_die", backend, where, prefix, "c", "g", "3", check=False)
    assert proc.returncode == -9, proc.stderr
    assert json.loads(proc.stdout) == [r.begin for r in res[2:5]]
    assert ids(Channels(store).consume("g", "c", 10)) == [2, 3, 4, 5]


def test_file_channel_positions_live_beside_the_fragments(tmp_path: Path) -> None:
    with FileJournals(tmp_path) as fj:
        ch = Channels(fj)
        ch.create_channels(["c"], topic="t")
        ch.produce([msg(1)], lambda m: ("c", "application/x-ndjson"))
        ch.ack("g", "c", ch.consume("g", "c", 1)[0])
        assert (tmp_path / "c" / "_positions" / "g").read_text().strip() == str(fj.end("c"))
        assert ch.describe_channels(["c"])[0].positions == {"g": fj.end("c")}
