from __future__ import annotations

import itertools
import json
import logging
import threading

import pytest

from zcluster.message import (
    DecodeError,
    DesyncError,
    Envelope,
    Flags,
    InMemoryJournals,
    JournalNotFoundError,
    JournalSpec,
    JsonMessage,
    OffsetOutOfRangeError,
    Publisher,
    QueueOutcome,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    get_clock,
    modulo_mapping,
    parse_uuid,
    partitions_from,
)

NDJSON = {"content-type": "application/x-ndjson"}
FIXED = {"content-type": "application/x-protobuf-fixed"}


class Msg:
    """A fixed-framing message: 16 bytes of UUID, then the body."""

    def __init__(self, body: bytes = b"", uuid: bytes = bytes(16), invalid: bool = False) -> None:
        self.body, self.uuid, self.invalid = body, uuid, invalid

    @classmethod
    def decode(cls, payload: bytes) -> Msg:
        if len(payload) < 16:
            raise ValueError("short payload")
        return cls(payload[16:], payload[:16])

    def to_bytes(self) -> bytes:
        return self.uuid + self.body

    def get_uuid(self) -> bytes:
        return self.uuid

    def set_uuid(self, uuid: bytes) -> None:
        self.uuid = uuid

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg()

    def validate(self) -> None:
        if self.invalid:
            raise ValueError("invalid message")


def setup(
    chunk_size: int = 7, labels: dict[str, str] = NDJSON, n: int = 2
) -> tuple[InMemoryJournals, list[JournalSpec]]:
    specs = [JournalSpec(f"topic/part-{i}", {**labels, "topic": "t"}) for i in range(n)]
    return InMemoryJournals(specs, chunk_size=chunk_size), specs


def to_journal(name: str) -> object:
    return lambda m: (name, NDJSON["content-type"])


def test_committed_publish_and_read() -> None:
    journals, specs = setup()
    pub = Publisher(journals)
    mapping = modulo_mapping(lambda m: m.doc["key"], partitions_from(journals, "topic=t"))
    for i in range(20):
        pub.publish_committed(mapping, JsonMessage({"key": f"k{i % 5}", "i": i}))
    seen = []
    for spec in specs:
        envs = list(ReadCommittedIter(journals, spec, Sequencer()))
        assert all(e.flags == Flags.OUTSIDE_TXN and e.producer == pub.producer for e in envs)
        assert [e.begin for e in envs] == sorted(e.begin for e in envs)
        clocks = [e.clock for e in envs]
        assert clocks == sorted(clocks) and len(set(clocks)) == len(clocks)
        seen += [e.message.doc["i"] for e in envs]
    assert sorted(seen) == list(range(20))


def test_transaction_commit_and_rollback() -> None:
    journals, specs = setup(chunk_size=3)
    pub = Publisher(journals)
    m0, m1 = to_journal(specs[0].name), to_journal(specs[1].name)
    pub.publish_uncommitted(m0, JsonMessage({"n": 1}))
    pub.publish_uncommitted(m1, JsonMessage({"n": 2}))
    pub.publish_uncommitted(m0, JsonMessage({"n": 3}))
    seq = Sequencer()
    assert list(ReadCommittedIter(journals, specs[0], seq)) == []  # Nothing committed yet.
    intents = pub.build_ack_intents()
    assert [i.journal for i in intents] == [specs[0].name, specs[1].name]
    assert pub.build_ack_intents() == []  # A new transaction begins.
    ack_clock = get_clock(parse_uuid(json.loads(intents[0].intent)["UUID"]))
    pub.append_ack_intents(intents)
    pub.append_ack_intents(intents[:1])  # Appending an intent again is harmless.
    got = list(ReadCommittedIter(journals, specs[0], seq))
    assert [e.message.doc.get("n") for e in got] == [1, 3, None]
    assert got[-1].is_ack and got[-1].clock == ack_clock and ack_clock > got[1].clock
    assert [e.message.doc["n"] for e in ReadCommittedIter(journals, specs[1], Sequencer()) if not e.is_ack] == [2]

    # An abandoned transaction, rolled back by re-appending the last ACK (clock == last ACK).
    pub.publish_uncommitted(m0, JsonMessage({"n": 4}))
    journals.append(specs[0].name, intents[0].intent)
    assert list(ReadCommittedIter(journals, specs[0], seq)) == []
    assert seq.checkpoint().states[0].last_ack == ack_clock  # Back at the last ACK; n=4 is gone.


def sequenced(journals: InMemoryJournals, spec: JournalSpec, buffer: int) -> tuple[list[QueueOutcome], list[str]]:
    """Every QueueOutcome of `spec`'s journal, and the "n" of each committed non-ACK message, in order."""
    seq = Sequencer(buffer=buffer)
    outcomes: list[QueueOutcome] = []
    delivered: list[str] = []
    for env in ReadUncommittedIter(journals, spec):
        outcomes.append(seq.queue_uncommitted(env))
        if outcomes[-1] is QueueOutcome.ACK_COMMIT_REPLAY:
            _, begin, end = seq.replay_range()
            seq.start_replay(ReadUncommittedIter(journals, spec, begin, end=end))
        while (out := seq.step()) is not None:
            if not out.is_ack:
                delivered.append(out.message.doc["n"])
    return outcomes, delivered


def test_publisher_rollback_is_read_as_a_rollback(caplog: pytest.LogCaptureFixture) -> None:
    journals, specs = setup(chunk_size=5)
    pub = Publisher(journals)
    m0, m1 = to_journal(specs[0].name), to_journal(specs[1].name)
    pub.publish_committed(m0, JsonMessage({"n": "c0"}))  # journal 0 has a last ACK: this message
    pub.publish_uncommitted(m0, JsonMessage({"n": "r0"}))
    pub.publish_uncommitted(m1, JsonMessage({"n": "r1"}))  # journal 1 has none: the span is all there is
    pub.publish_uncommitted(m0, JsonMessage({"n": "r2"}))
    intents = pub.build_rollback_intents()
    assert [i.journal for i in intents] == [specs[0].name, specs[1].name]
    assert pub.build_rollback_intents() == [] and pub.build_ack_intents() == []  # A new transaction begins.
    pub.append_ack_intents(intents)
    pub.append_ack_intents(intents)  # Appending a rollback again is harmless.
    pub.publish_uncommitted(m0, JsonMessage({"n": "k0"}))
    pub.publish_uncommitted(m1, JsonMessage({"n": "k1"}))
    pub.append_ack_intents(pub.build_ack_intents())
    pub.publish_uncommitted(m1, JsonMessage({"n": "r3"}))  # Rolled back to the commit's ACK.
    pub.append_ack_intents(pub.build_rollback_intents())

    Q = QueueOutcome
    for buffer in (1024, 1):  # Ring or replay: the same outcomes and messages.
        with caplog.at_level(logging.ERROR, logger="zcluster.message.sequencer"):
            out0, got0 = sequenced(journals, specs[0], buffer)
            out1, got1 = sequenced(journals, specs[1], buffer)
        assert caplog.records == []  # No "ACK below the last ACK": a rollback, not a reset.
        commit = Q.ACK_COMMIT_RING if buffer > 1 else Q.ACK_COMMIT_REPLAY
        begin, extend, rollback = Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_EXTEND_SPAN, Q.ACK_ROLLBACK
        assert out0 == [Q.OUTSIDE_COMMIT, begin, extend, rollback, rollback, begin, commit]
        assert out1 == [begin, rollback, rollback, begin, commit, begin, rollback]
        assert (got0, got1) == (["c0", "k0"], ["k1"])
    for spec, want in zip(specs, (["c0", "k0"], ["k1"]), strict=True):
        envs = ReadCommittedIter(journals, spec, Sequencer(buffer=2))
        assert [e.message.doc["n"] for e in envs if not e.is_ack] == want


def test_validation_happens_before_mapping() -> None:
    journals, specs = setup(labels=FIXED)
    calls = []

    def mapping(m: object) -> tuple[str, str]:
        calls.append(m)
        return specs[0].name, FIXED["content-type"]

    pub = Publisher(journals)
    with pytest.raises(ValueError, match="invalid message"):
        pub.publish_committed(mapping, Msg(invalid=True))
    assert calls == [] and journals.end(specs[0].name) == 0
    res = pub.publish_committed(mapping, Msg(b"body"))
    assert res == (0, 8 + 16 + 4)
    with pytest.raises(TypeError, match="need a decode"):
        ReadUncommittedIter(journals, specs[0])
    [env] = ReadUncommittedIter(journals, specs[0], decode=Msg.decode)
    assert env.message.body == b"body" and (env.begin, env.end) == res


def test_concurrent_publishers_keep_clocks_in_journal_order() -> None:
    journals, specs = setup(n=1)
    pub = Publisher(journals)
    mapping = to_journal(specs[0].name)

    def run() -> None:
        for i in range(300):
            pub.publish_committed(mapping, JsonMessage({"i": i}))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    clocks = [e.clock for e in ReadUncommittedIter(journals, specs[0])]
    assert len(clocks) == 1200 and clocks == sorted(clocks) and len(set(clocks)) == 1200


def test_reader_survives_bad_frames_and_desync() -> None:
    journals, specs = setup(labels=FIXED, n=1)
    name = specs[0].name
    pub = Publisher(journals)
    mapping = lambda m: (name, FIXED["content-type"])  # noqa: E731
    pub.publish_committed(mapping, Msg(b"one"))
    journals.append(name, b"garbage!")
    pub.publish_committed(mapping, Msg(b"two"))
    journals.append(name, b"\x66\x33\x93\x36\x02\0\0\0xx")  # Valid frame, undecodable payload.
    pub.publish_committed(mapping, Msg(b"three"))
    it = ReadCommittedIter(journals, specs[0], Sequencer(), decode=Msg.decode)
    out: list[object] = []
    while True:
        try:
            out.append(next(it).message.body)
        except (DesyncError, DecodeError) as exc:
            out.append(type(exc).__name__)
        except StopIteration:
            break
    assert out == [b"one", "DesyncError", b"two", "DecodeError", b"three"]


def test_read_committed_replays_from_the_journal() -> None:
    journals, specs = setup(chunk_size=5, n=1)
    name = specs[0].name
    txn, other = Publisher(journals), Publisher(journals)
    mapping = to_journal(name)
    for i in range(10):
        txn.publish_uncommitted(mapping, JsonMessage({"t": i}))
        other.publish_committed(mapping, JsonMessage({"o": i}))
    txn.append_ack_intents(txn.build_ack_intents())
    out = [e.message.doc for e in ReadCommittedIter(journals, specs[0], Sequencer(buffer=3)) if not e.is_ack]
    assert [d["o"] for d in out if "o" in d] == list(range(10))
    assert [d["t"] for d in out if "t" in d] == list(range(10))  # Replayed: they left the ring.
    assert out[-10:] == [{"t": i, "UUID": out[-10 + i]["UUID"]} for i in range(10)]


def test_read_committed_resumes_from_checkpoint() -> None:
    journals, specs = setup(n=1)
    name = specs[0].name
    pub = Publisher(journals)
    mapping = to_journal(name)
    for i in range(3):
        pub.publish_committed(mapping, JsonMessage({"i": i}))
    seq = Sequencer()
    assert len(list(ReadCommittedIter(journals, specs[0], seq))) == 3
    offsets, states = seq.checkpoint()
    for i in range(3, 5):
        pub.publish_committed(mapping, JsonMessage({"i": i}))
    raw = journals.content(name)
    journals.append(name, raw[: raw.index(b"\n") + 1])  # A duplicate of message 0 straddles the checkpoint.
    restored = Sequencer(offsets, states)
    assert [e.message.doc["i"] for e in ReadCommittedIter(journals, specs[0], restored)] == [3, 4]


def test_in_memory_journals() -> None:
    journals, specs = setup(chunk_size=4, n=1)
    name = specs[0].name
    assert journals.append(name, b"0123456789") == (0, 10)
    assert journals.append(name, b"ab") == (10, 12)
    assert list(journals.read(name, 3)) == [(3, b"3456"), (7, b"789a"), (11, b"b")]
    assert list(journals.read(name, 12)) == []
    with pytest.raises(OffsetOutOfRangeError):
        journals.read(name, 13)
    with pytest.raises(JournalNotFoundError):
        journals.append("nope", b"")
    with pytest.raises(ValueError, match="content-type"):
        journals.create(JournalSpec("x", {}))
    with pytest.raises(ValueError, match="already exists"):
        journals.create(specs[0])

    got: list[tuple[int, bytes]] = []

    def read_one() -> None:  # a blocking read, for as long as the append takes on a loaded machine
        got.extend(itertools.islice(journals.read(name, 12, block=True, timeout=120), 1))

    reader = threading.Thread(target=read_one)
    reader.start()
    journals.append(name, b"late")
    reader.join()
    assert got == [(12, b"late")]
    assert list(journals.read(name, 16, block=True, timeout=0.01)) == []


def test_envelope_validates_uuid_length() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        Envelope("j", 0, 1, None, b"short")


def test_json_message_uuid_follows_edits_of_its_doc() -> None:
    from zcluster.message.records import JsonMessage
    from zcluster.message.uuid import build_uuid, format_uuid

    a, b = build_uuid(b"\x01" * 6, 160, 0), build_uuid(b"\x02" * 6, 320, 1)
    msg = JsonMessage.from_json({"UUID": format_uuid(a), "x": 1})
    assert msg.get_uuid() == a
    msg.doc["UUID"] = format_uuid(b)  # edited behind its back: parsed again, never a stale cache
    assert msg.get_uuid() == b
    msg.set_uuid(a)
    assert msg.get_uuid() == a and msg.doc["UUID"] == format_uuid(a)
    del msg.doc["UUID"]
    assert msg.get_uuid() == bytes(16)
