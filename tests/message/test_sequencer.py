"""Gazette's Sequencer scenarios (message/sequencer_test.go), as acceptance tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from message_helpers import JOURNAL, Gen, make_generator

from zcluster.message import (
    ZERO_UUID,
    Envelope,
    Flags,
    ProducerID,
    ProducerState,
    QueueOutcome,
    ReplayError,
    ReplayRequiredError,
    Sequencer,
    SequencerError,
    new_producer_id,
)

QO = QueueOutcome
CONT, ACK, OUT = Flags.CONTINUE_TXN, Flags.ACK_TXN, Flags.OUTSIDE_TXN


def queue(seq: Sequencer, *envs: Envelope) -> list[QueueOutcome]:
    return [seq.queue_uncommitted(e) for e in envs]


def partial_of(seq: Sequencer, env: Envelope) -> tuple[int, int, int, int, int]:
    [p] = [p for p in seq._partials.values() if (p.journal, p.producer) == (env.journal, env.producer)]
    return (p.min_clock, p.max_clock, p.begin, p.ring_start, p.ring_stop)


def expect_dequeue(seq: Sequencer, *expect: Envelope) -> None:
    for i, e in enumerate(expect):
        assert seq.step() is e
        assert seq.dequeued is e
        assert seq._emit is not None and seq._emit.begin == e.begin
        if i:
            assert seq._emit.min_clock == expect[i - 1].clock
    assert seq.step() is None
    assert seq.dequeued is None
    last = expect[-1]
    if last.clock:
        # The producer is ready for its next sequence.
        assert partial_of(seq, last) == (last.clock, last.clock, -1, -1, -1)
    assert seq.read_through(last.journal) == last.end  # Read-through of the ACK is tracked.


def expect_replay(seq: Sequencer, begin: int, end: int, *envs: Envelope) -> None:
    assert tuple(seq.replay_range()) == (envs[0].journal, begin, end)
    seq.start_replay(list(envs))


def test_ring_add_and_evict(generate: Gen) -> None:
    seq = Sequencer(buffer=5)
    A, B = new_producer_id(), new_producer_id()
    e = [None] + [
        generate(p, c * 100, CONT)
        for p, c in [(A, 1), (B, 2), (A, 3), (A, 4), (B, 5), (B, 6), (B, 7), (B, 8), (B, 9), (B, 10), (B, 11)]
    ]
    assert not seq.has_pending()

    def ring() -> list[Envelope | None]:
        return seq._ring

    assert queue(seq, e[1]) == [QO.CONTINUE_BEGIN_SPAN]
    assert partial_of(seq, e[1]) == (99, 100, e[1].begin, 0, 0)
    assert seq.has_pending()
    assert seq.read_through(JOURNAL) == e[1].end  # Continuations always move read-through offsets.
    assert queue(seq, e[2], e[3], e[4], e[5]) == [QO.CONTINUE_BEGIN_SPAN] + [QO.CONTINUE_EXTEND_SPAN] * 3
    assert ring() == [e[1], e[2], e[3], e[4], e[5]]
    assert seq._next == [2, 4, 3, -1, -1] and seq._head == 0
    assert partial_of(seq, e[1]) == (99, 400, e[1].begin, 0, 3)
    assert partial_of(seq, e[2]) == (199, 500, e[2].begin, 1, 4)

    assert queue(seq, e[6]) == [QO.CONTINUE_EXTEND_SPAN]  # Evicts e1: A's span now starts at e3.
    assert ring() == [e[6], e[2], e[3], e[4], e[5]] and seq._next == [-1, 4, 3, -1, 0]
    assert partial_of(seq, e[1]) == (99, 400, e[1].begin, 2, 3)
    assert partial_of(seq, e[2]) == (199, 600, e[2].begin, 1, 0)

    assert queue(seq, e[7], e[8]) == [QO.CONTINUE_EXTEND_SPAN] * 2
    assert ring() == [e[6], e[7], e[8], e[4], e[5]] and seq._next == [1, 2, -1, -1, 0] and seq._head == 3
    assert partial_of(seq, e[1]) == (99, 400, e[1].begin, 3, 3)
    assert partial_of(seq, e[2]) == (199, 800, e[2].begin, 4, 2)

    assert queue(seq, e[9]) == [QO.CONTINUE_EXTEND_SPAN]  # Evicts A's last entry: begin kept, ring -1.
    assert partial_of(seq, e[1]) == (99, 400, e[1].begin, -1, -1)
    assert partial_of(seq, e[2]) == (199, 900, e[2].begin, 4, 3)

    assert queue(seq, e[10], e[11]) == [QO.CONTINUE_EXTEND_SPAN] * 2
    assert ring() == [e[11], e[7], e[8], e[9], e[10]] and seq._next == [-1, 2, 3, 4, 0] and seq._head == 1
    assert partial_of(seq, e[1]) == (99, 400, e[1].begin, -1, -1)
    assert partial_of(seq, e[2]) == (199, 1100, e[2].begin, 1, 0)
    assert seq.read_through(JOURNAL) == e[11].end


def test_txn_sequence_cases(generate: Gen) -> None:
    seq = Sequencer(buffer=3)
    A, B = new_producer_id(), new_producer_id()

    # Internal duplicates served from the ring.
    a1, a2, a1d, a2d, a3 = (
        generate(A, 1, CONT),
        generate(A, 2, CONT),
        generate(A, 1, CONT),
        generate(A, 2, CONT),
        generate(A, 3, ACK),
    )
    assert queue(seq, a1, a2, a1d, a2d, a3) == [
        QO.CONTINUE_BEGIN_SPAN,
        QO.CONTINUE_EXTEND_SPAN,
        QO.CONTINUE_TXN_CLOCK_LARGER,
        QO.CONTINUE_TXN_CLOCK_LARGER,
        QO.ACK_COMMIT_RING,
    ]
    expect_dequeue(seq, a1, a2, a3)
    assert not seq.has_pending()

    # ACK without preceding CONTINUE: unusual but allowed.
    a4 = generate(A, 4, ACK)
    assert queue(seq, a4) == [QO.ACK_EMPTY]
    expect_dequeue(seq, a4)

    # Partial ACK: a7 is above a6's clock and is rolled back.
    a5, a7no, a6 = generate(A, 5, CONT), generate(A, 7, CONT), generate(A, 6, ACK)
    assert queue(seq, a5, a7no, a6) == [QO.CONTINUE_BEGIN_SPAN, QO.CONTINUE_EXTEND_SPAN, QO.ACK_COMMIT_RING]
    expect_dequeue(seq, a5, a6)

    # Rollback with interleaved producer B.
    b1, a7r, a8r, b2, a6abort = (
        generate(B, 1, CONT),
        generate(A, 7, CONT),
        generate(A, 8, CONT),
        generate(B, 2, CONT),
        generate(A, 6, ACK),
    )
    assert queue(seq, a7r, b1, a7r, a8r, b2, a6abort) == [
        QO.CONTINUE_BEGIN_SPAN,
        QO.CONTINUE_BEGIN_SPAN,
        QO.CONTINUE_TXN_CLOCK_LARGER,
        QO.CONTINUE_EXTEND_SPAN,
        QO.CONTINUE_EXTEND_SPAN,
        QO.ACK_ROLLBACK,
    ]
    assert seq.step() is None  # Nothing to dequeue.
    assert partial_of(seq, a7r) == (6, 6, -1, -1, -1)
    assert partial_of(seq, b1) == (0, 2, b1.begin, 1, 1)

    # Interleaved producer ACKs; b1 was evicted, so a replay with an exact range is required.
    b3 = generate(B, 3, ACK)
    assert queue(seq, b3) == [QO.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b2.begin, b1, a7r, a8r)
    expect_dequeue(seq, b1, b2, b3)

    # Replay with duplicates internal to the sequence and from before it, in ring and replay.
    b4, b1d, b4d, b5, b6, b2d, b7, b8 = (
        generate(B, 4, CONT),
        generate(B, 1, CONT),
        generate(B, 4, CONT),
        generate(B, 5, CONT),
        generate(B, 6, CONT),
        generate(B, 2, CONT),
        generate(B, 7, CONT),
        generate(B, 8, ACK),
    )
    assert queue(seq, b4, b1d, b4d, b5, b6, b2d, b7, b8) == [
        QO.CONTINUE_BEGIN_SPAN,
        QO.CONTINUE_ALREADY_ACKED,
        QO.CONTINUE_TXN_CLOCK_LARGER,
        QO.CONTINUE_EXTEND_SPAN,
        QO.CONTINUE_EXTEND_SPAN,
        QO.CONTINUE_ALREADY_ACKED,
        QO.CONTINUE_EXTEND_SPAN,
        QO.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b4.begin, b6.begin, b4, b1d, b4d, b5)
    expect_dequeue(seq, b4, b5, b6, b7, b8)

    # Partial rollback where all ring entries are skipped.
    b9, b11no, b12no, b13no, b10 = (
        generate(B, 9, CONT),
        generate(B, 11, CONT),
        generate(B, 12, CONT),
        generate(B, 13, CONT),
        generate(B, 10, ACK),
    )
    assert queue(seq, b9, b11no, b12no, b13no, b10) == [QO.CONTINUE_BEGIN_SPAN] + [QO.CONTINUE_EXTEND_SPAN] * 3 + [
        QO.ACK_COMMIT_REPLAY
    ]
    expect_replay(seq, b9.begin, b12no.begin, b9, b11no)
    expect_dequeue(seq, b9, b10)
    assert not seq.has_pending()

    # Interleaved ACK'd sequences requiring two replays.
    b11, a7, a8, b12, a9, b13 = (
        generate(B, 11, CONT),
        generate(A, 7, CONT),
        generate(A, 8, CONT),
        generate(B, 12, CONT),
        generate(A, 9, ACK),
        generate(B, 13, ACK),
    )
    assert queue(seq, b11, a7, a8, b12, a9) == [
        QO.CONTINUE_BEGIN_SPAN,
        QO.CONTINUE_BEGIN_SPAN,
        QO.CONTINUE_EXTEND_SPAN,
        QO.CONTINUE_EXTEND_SPAN,
        QO.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a7.begin, a8.begin, a7)
    expect_dequeue(seq, a7, a8, a9)
    assert seq.has_pending()
    assert queue(seq, b13) == [QO.ACK_COMMIT_REPLAY]
    expect_replay(seq, b11.begin, b12.begin, b11, a7, a8)
    expect_dequeue(seq, b11, b12, b13)
    assert not seq.has_pending()

    # Reset to an earlier ACK, then re-use of clocks.
    b8reset, b9reuse, b10reuse = generate(B, 8, ACK), generate(B, 9, CONT), generate(B, 10, ACK)
    assert queue(seq, b8reset, b9reuse, b10reuse) == [
        QO.ACK_ROLLBACK,
        QO.CONTINUE_BEGIN_SPAN,
        QO.ACK_COMMIT_RING,
    ]
    expect_dequeue(seq, b9reuse, b10reuse)


def test_ack_below_last_ack_is_logged(generate: Gen, caplog: pytest.LogCaptureFixture) -> None:
    seq = Sequencer(buffer=4)
    A = new_producer_id()
    assert queue(seq, generate(A, 5, ACK)) == [QO.ACK_EMPTY]
    while seq.step():
        pass
    with caplog.at_level(logging.ERROR, logger="zcluster.message.sequencer"):
        assert queue(seq, generate(A, 5, ACK)) == [QO.ACK_ROLLBACK]
        assert not caplog.records  # Equal to the last ACK: a plain rollback.
        assert queue(seq, generate(A, 3, ACK)) == [QO.ACK_ROLLBACK]
    assert "loss of exactly-once" in caplog.text
    # The producer's clock was reset: clock 4 is new again (at-least-once from here).
    assert queue(seq, generate(A, 4, OUT)) == [QO.OUTSIDE_COMMIT]


def test_txn_without_buffer(generate: Gen) -> None:
    seq = Sequencer(buffer=0)
    A, B = new_producer_id(), new_producer_id()
    a1, a2, b1, a1d, a2d, a3, b2, b3 = (
        generate(A, 1, CONT),
        generate(A, 2, CONT),
        generate(B, 1, CONT),
        generate(A, 1, CONT),
        generate(A, 2, CONT),
        generate(A, 3, ACK),
        generate(B, 2, CONT),
        generate(B, 3, ACK),
    )
    assert queue(seq, a1, a2, b1, a1d, a2d, a3) == [
        QO.CONTINUE_BEGIN_SPAN,
        QO.CONTINUE_EXTEND_SPAN,
        QO.CONTINUE_BEGIN_SPAN,
        QO.CONTINUE_TXN_CLOCK_LARGER,
        QO.CONTINUE_TXN_CLOCK_LARGER,
        QO.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a1.begin, a3.begin, a1, a2, b1, a1d, a2d)
    expect_dequeue(seq, a1, a2, a3)
    assert queue(seq, b2, b3) == [QO.CONTINUE_EXTEND_SPAN, QO.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b3.begin, b1, a1d, a2d, a3, b2)
    expect_dequeue(seq, b1, b2, b3)


def test_outside_txn_cases(generate: Gen, caplog: pytest.LogCaptureFixture) -> None:
    seq = Sequencer(buffer=0)
    A = new_producer_id()
    a1, a2 = generate(A, 1, OUT), generate(A, 2, OUT)
    assert queue(seq, a1) == [QO.OUTSIDE_COMMIT]
    expect_dequeue(seq, a1)
    assert queue(seq, a2) == [QO.OUTSIDE_COMMIT]
    expect_dequeue(seq, a2)

    # Duplicates are ignored but move the read-through offset.
    a1d, a2d = generate(A, 1, OUT), generate(A, 2, OUT)
    assert queue(seq, a1d, a2d) == [QO.OUTSIDE_ALREADY_ACKED] * 2
    assert seq.step() is None
    assert seq.read_through(JOURNAL) == a2d.end

    # Preceding CONTINUE_TXN messages are discarded (and the mixed use is logged).
    a3, a4, a5 = generate(A, 3, CONT), generate(A, 4, CONT), generate(A, 5, OUT)
    with caplog.at_level(logging.ERROR):
        assert queue(seq, a3, a4, a5) == [QO.CONTINUE_BEGIN_SPAN, QO.CONTINUE_EXTEND_SPAN, QO.OUTSIDE_COMMIT]
    assert "mixed committed and uncommitted" in caplog.text
    expect_dequeue(seq, a5)

    # Unknown flags are treated as OUTSIDE_TXN.
    a6, a7bad, a7badd = generate(A, 6, CONT), generate(A, 7, 0x100), generate(A, 7, 0x100)
    assert queue(seq, a6, a7bad) == [QO.CONTINUE_BEGIN_SPAN, QO.OUTSIDE_COMMIT]
    expect_dequeue(seq, a7bad)
    assert queue(seq, a7badd) == [QO.OUTSIDE_ALREADY_ACKED]

    # Zero UUIDs always dequeue, are not tracked, but still move offsets.
    z1 = Envelope(JOURNAL, a7badd.end + 2, a7badd.end + 102, "z1", ZERO_UUID)
    z2 = Envelope(JOURNAL, z1.end + 2, z1.end + 102, "z2", ZERO_UUID)
    assert queue(seq, z1) == [QO.OUTSIDE_COMMIT]
    expect_dequeue(seq, z1)
    assert queue(seq, z2) == [QO.OUTSIDE_COMMIT]
    expect_dequeue(seq, z2)
    assert [(p.journal, p.producer) for p in seq._partials.values()] == [(JOURNAL, A)]
    assert partial_of(seq, a1) == (7, 7, -1, -1, -1)
    assert seq.read_through(JOURNAL) == z2.end


def test_producer_states_round_trip(generate: Gen) -> None:
    seq1 = Sequencer(buffer=12)
    A, B, C = new_producer_id(), new_producer_id(), new_producer_id()
    a1, a2, b1, b2, c1, b3, c2, c1rb, a3 = (
        generate(A, 1, CONT),
        generate(A, 2, CONT),
        generate(B, 1, CONT),
        generate(B, 2, CONT),
        generate(C, 1, ACK),
        generate(B, 3, ACK),
        generate(C, 2, CONT),
        generate(C, 1, ACK),
        generate(A, 3, ACK),
    )
    z1 = Envelope(JOURNAL, 10_000, 10_100, "z1", ZERO_UUID)
    assert queue(seq1, a1, a2, b1, b2, c1) == [
        QO.CONTINUE_BEGIN_SPAN,
        QO.CONTINUE_EXTEND_SPAN,
        QO.CONTINUE_BEGIN_SPAN,
        QO.CONTINUE_EXTEND_SPAN,
        QO.ACK_EMPTY,
    ]
    expect_dequeue(seq1, c1)
    assert queue(seq1, z1) == [QO.OUTSIDE_COMMIT]
    expect_dequeue(seq1, z1)

    # Taking a checkpoint ends "pending": a span is pending only if updated since the last one.
    assert seq1.has_pending()
    offsets, states = seq1.checkpoint()
    assert not seq1.has_pending()

    seq2 = Sequencer(offsets, states, buffer=12)
    _, states2 = seq2.checkpoint()
    expect = sorted(
        [
            ProducerState(JOURNAL, A, 0, a1.begin, 2),
            ProducerState(JOURNAL, B, 0, b1.begin, 2),
            ProducerState(JOURNAL, C, 1, -1, 1),
        ]
    )
    assert sorted(states) == expect == sorted(states2)
    assert offsets == {JOURNAL: z1.end}

    # Both produce the same output from here, though seq2 needs replays.
    assert queue(seq1, b3) == [QO.ACK_COMMIT_RING]
    assert queue(seq2, b3) == [QO.ACK_COMMIT_REPLAY]
    expect_replay(seq2, b1.begin, b3.begin, b1, b2, c1)
    expect_dequeue(seq1, b1, b2, b3)
    expect_dequeue(seq2, b1, b2, b3)

    for s in (seq1, seq2):
        assert queue(s, c2, c1rb) == [QO.CONTINUE_BEGIN_SPAN, QO.ACK_ROLLBACK]
        assert s.step() is None

    assert queue(seq1, a3) == [QO.ACK_COMMIT_RING]
    assert queue(seq2, a3) == [QO.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3.begin, a1, a2, b1, b2, c1)
    expect_dequeue(seq1, a1, a2, a3)
    expect_dequeue(seq2, a1, a2, a3)


def test_producer_states_round_trip_during_dequeue(generate: Gen) -> None:
    seq1 = Sequencer(buffer=12)
    A = new_producer_id()
    a1, a2, a3, a4, a5, a6 = (
        generate(A, 1, CONT),
        generate(A, 2, CONT),
        generate(A, 3, ACK),
        generate(A, 4, CONT),
        generate(A, 5, CONT),
        generate(A, 6, ACK),
    )
    assert queue(seq1, a1, a2, a3) == [QO.CONTINUE_BEGIN_SPAN, QO.CONTINUE_EXTEND_SPAN, QO.ACK_COMMIT_RING]
    assert seq1.step() is a1  # Crash here, before a1 is processed.

    def restore_twice(seq: Sequencer) -> Sequencer:
        offsets, states = seq.checkpoint()
        seq2 = Sequencer(offsets, states, buffer=12)
        offsets, states = seq2.checkpoint()
        return Sequencer(offsets, states, buffer=12)

    seq2 = restore_twice(seq1)
    for s in (seq1, seq2):  # States are those just before a3 is processed.
        assert s.checkpoint() == ({JOURNAL: a2.end}, [ProducerState(JOURNAL, A, 0, a1.begin, 3)])

    assert queue(seq2, a3) == [QO.ACK_COMMIT_REPLAY]  # seq2 reads a3 again.
    expect_replay(seq2, a1.begin, a3.begin, a1, a2)
    assert seq1.step() is a2
    assert seq1.step() is a3
    assert seq1.step() is None
    expect_dequeue(seq2, a1, a2, a3)

    # seq1 checkpoints partway through dequeuing the next sequence.
    assert queue(seq1, a4, a5, a6) == [QO.CONTINUE_BEGIN_SPAN, QO.CONTINUE_EXTEND_SPAN, QO.ACK_COMMIT_RING]
    assert seq1.step() is a4
    assert seq1.step() is a5  # Crash.
    seq2 = restore_twice(seq1)
    for s in (seq1, seq2):  # Tightened to reflect a4's consumption.
        assert s.checkpoint() == ({JOURNAL: a5.end}, [ProducerState(JOURNAL, A, 4, a5.begin, 6)])
    assert queue(seq2, a6) == [QO.ACK_COMMIT_REPLAY]  # Dequeues from a5, not a4.
    expect_replay(seq2, a5.begin, a6.begin, a5)
    expect_dequeue(seq2, a5, a6)


def test_producer_pruning(generate: Gen) -> None:
    seq = Sequencer(buffer=12)
    A, B, C = new_producer_id(), new_producer_id(), new_producer_id()
    # Clock units are 100 ns, above 4 counter bits.
    a, b, back, c = (
        generate(A, 10 << 4, CONT),
        generate(B, 19 << 4, CONT),
        generate(B, 20 << 4, ACK),
        generate(C, 30 << 4, CONT),
    )
    assert queue(seq, a, b, back) == [QO.CONTINUE_BEGIN_SPAN, QO.CONTINUE_BEGIN_SPAN, QO.ACK_COMMIT_RING]
    expect_dequeue(seq, b, back)
    assert queue(seq, c) == [QO.CONTINUE_BEGIN_SPAN]

    sa = ProducerState(JOURNAL, A, (10 << 4) - 1, a.begin, 10 << 4)
    sb = ProducerState(JOURNAL, B, 20 << 4, -1, 20 << 4)
    sc = ProducerState(JOURNAL, C, (30 << 4) - 1, c.begin, 30 << 4)
    assert sorted(seq.checkpoint(20 * 100e-9).states) == sorted([sa, sb, sc])  # Prunes nothing.
    assert sorted(seq.checkpoint(19 * 100e-9).states) == sorted([sb, sc])  # A is pruned.
    assert len(seq._partials) == 2
    assert seq.checkpoint(1e-9).states == [sc]  # B is pruned.
    assert seq.checkpoint(0).states == [sc]  # Zero: no pruning.


def _replay_setup() -> tuple[Sequencer, list[Envelope]]:
    generate = make_generator()
    seq = Sequencer(buffer=0)
    A, B = new_producer_id(), new_producer_id()
    b1, a2, a3 = generate(B, 1, CONT), generate(A, 2, CONT), generate(A, 3, ACK)
    assert queue(seq, b1, a2, a3) == [QO.CONTINUE_BEGIN_SPAN, QO.CONTINUE_BEGIN_SPAN, QO.ACK_COMMIT_REPLAY]
    assert tuple(seq.replay_range()) == (JOURNAL, a2.begin, a3.begin) == (JOURNAL, 102, 204)
    return seq, [a2, a3]


def _moved(env: Envelope, journal: str | None = None, begin: int = 0, end: int = 0) -> Envelope:
    return Envelope(journal or env.journal, env.begin + begin, env.end + end, env.message, env.uuid)


def test_replay_ok() -> None:
    seq, (a2, a3) = _replay_setup()
    seq.start_replay([a2])
    expect_dequeue(seq, a2, a3)


def test_replay_reader_errors_pass_through() -> None:
    seq, _ = _replay_setup()

    def failing() -> Iterator[Envelope]:
        raise EOFError("unexpected EOF")
        yield  # pragma: no cover

    seq.start_replay(failing())
    with pytest.raises(ReplayError, match="replay reader: unexpected EOF"):
        seq.step()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"journal": "wrong/journal"}, r"replay of wrong journal \(wrong/journal; expected test/journal\)"),
        ({"begin": -1}, r"replay has wrong begin \(101; expected >= 102\)"),
        ({"end": 100}, r"replay has wrong end \(302; expected <= 204\)"),
    ],
)
def test_replay_out_of_range(kwargs: dict[str, object], message: str) -> None:
    seq, (a2, _) = _replay_setup()
    seq.start_replay([_moved(a2, **kwargs)])  # type: ignore[arg-type]
    with pytest.raises(ReplayError, match=message):
        seq.step()
    seq.start_replay([a2])  # A correct replay still works afterwards.
    assert seq.step() is a2


def test_step_without_replay_and_misuse() -> None:
    seq, (_, a3) = _replay_setup()
    with pytest.raises(ReplayRequiredError):
        seq.step()
    with pytest.raises(SequencerError, match="remain to dequeue"):
        seq.queue_uncommitted(a3)
    idle = Sequencer()
    with pytest.raises(SequencerError):
        idle.replay_range()
    with pytest.raises(SequencerError):
        idle.start_replay([])
    assert idle.step() is None


def test_no_head_of_line_blocking(generate: Gen) -> None:
    seq = Sequencer(buffer=8)
    A, B = new_producer_id(), new_producer_id()
    a1 = generate(A, 1, CONT)
    b1 = generate(B, 1, OUT)
    assert queue(seq, a1, b1) == [QO.CONTINUE_BEGIN_SPAN, QO.OUTSIDE_COMMIT]
    assert seq.step() is b1  # A's open transaction does not hold B back.
    assert seq.step() is None
    # But the checkpoint resumes A's span from its begin.
    assert seq.checkpoint().states[0] == ProducerState(JOURNAL, A, 0, a1.begin, 1)


def test_ack_envelopes_are_marked(generate: Gen) -> None:
    seq = Sequencer()
    A = new_producer_id()
    a1, a2 = generate(A, 1, CONT), generate(A, 2, ACK)
    queue(seq, a1, a2)
    out = [seq.step(), seq.step()]
    assert [e.is_ack for e in out if e] == [False, True]


@pytest.mark.parametrize("gazette_state", [False, True])
def test_duplicate_straddling_a_checkpoint(generate: Gen, gazette_state: bool) -> None:
    # a1 is read, the checkpoint is taken, then a1 is appended again (a retried append) before the ACK.
    A = new_producer_id()
    a1, a1dup, a2 = generate(A, 1, CONT), generate(A, 1, CONT), generate(A, 2, ACK)
    seq1 = Sequencer(buffer=4)
    assert queue(seq1, a1) == [QO.CONTINUE_BEGIN_SPAN]
    offsets, states = seq1.checkpoint()
    if gazette_state:  # Restoring a Gazette checkpoint, which has no max_clock.
        states = [st._replace(max_clock=None) for st in states]
    seq2 = Sequencer(offsets, states, buffer=4)
    outcomes = [
        QO.CONTINUE_EXTEND_SPAN if gazette_state else QO.CONTINUE_TXN_CLOCK_LARGER,
        QO.ACK_COMMIT_REPLAY,
    ]
    assert queue(seq2, a1dup, a2) == outcomes
    assert queue(seq1, a1dup, a2) == [QO.CONTINUE_TXN_CLOCK_LARGER, QO.ACK_COMMIT_RING]
    expect_replay(seq2, a1.begin, a1dup.begin if gazette_state else a2.begin, a1)
    expect_dequeue(seq1, a1, a2)
    expect_dequeue(seq2, a1, a2)  # The duplicate in seq2's ring is skipped, not delivered twice.


@pytest.mark.parametrize("producer", ["own", "zero"])
@pytest.mark.parametrize("restore", [False, True])
def test_a_zero_clock_message_inside_a_replayed_span_is_delivered_once(
    generate: Gen, producer: str, restore: bool
) -> None:
    # A zero clock commits its message at once (delivered when read) and never joins a span, even one of its
    # own producer: the span's replay skips it, as the ring does. Before the fix the replay delivered it again.
    # The span is replayed because the ring is too small, or because a checkpoint was restored between the zero
    # clock and the ACK (a poll boundary): neither may change what is delivered.
    A = new_producer_id() if producer == "own" else bytes(6)  # "zero": ZERO_UUID's producer, with a real span
    a1, z, a2 = generate(A, 1, CONT), generate(A, 0, OUT), generate(A, 2, ACK)
    if producer == "zero":  # a message without a UUID
        z = Envelope(z.journal, z.begin, z.end, z.message, ZERO_UUID)
    seq = Sequencer(buffer=4 if restore else 1)
    assert queue(seq, a1, z) == [QO.CONTINUE_BEGIN_SPAN, QO.OUTSIDE_COMMIT]
    expect_dequeue(seq, z)
    if restore:
        seq = Sequencer(*seq.checkpoint(), buffer=4)
    assert queue(seq, a2) == [QO.ACK_COMMIT_REPLAY]
    expect_replay(seq, a1.begin, a2.begin, a1, z)
    expect_dequeue(seq, a1, a2)


@pytest.mark.parametrize("restore", [False, True])
def test_a_replay_skips_a_clock_going_back_within_the_span_as_the_ring_does(generate: Gen, restore: bool) -> None:
    # A CONTINUE_TXN below the span's max clock is dropped when queued (CONTINUE_TXN_CLOCK_LARGER); an ACK at its
    # clock then commits nothing (the span's 48 is above it). Before the fix a replay (a small ring, or the ring
    # restored empty) delivered the dropped message, then skipped the ACK as a duplicate of it.
    A = new_producer_id()
    a1, a4, a3, ack3 = generate(A, 1, OUT), generate(A, 4, CONT), generate(A, 3, CONT), generate(A, 3, ACK)
    seq = Sequencer(buffer=4 if restore else 1)
    assert queue(seq, a1) == [QO.OUTSIDE_COMMIT]
    expect_dequeue(seq, a1)
    assert queue(seq, a4, a3) == [QO.CONTINUE_BEGIN_SPAN, QO.CONTINUE_TXN_CLOCK_LARGER]
    if restore:
        seq = Sequencer(*seq.checkpoint(), buffer=4)
    assert queue(seq, ack3) == [QO.ACK_COMMIT_REPLAY]
    expect_replay(seq, a4.begin, ack3.begin, a4, a3)
    expect_dequeue(seq, ack3)


def test_restored_states_come_back_from_checkpoint_as_they_went_in() -> None:
    """Producers are keyed by number inside the Sequencer (a journal's number above the producer's 48 bits):
    states of two journals with the same producer stay apart, and a producer that is not 6 bytes (it matches
    no UUID) is kept as it came, under a key no UUID makes."""
    a = new_producer_id()
    states = [
        ProducerState(JOURNAL, a, 5, -1, None),
        ProducerState("other/journal", a, 9, -1, None),
        ProducerState(JOURNAL, ProducerID(b"odd"), 3, -1, None),
    ]
    seq = Sequencer(states=states)
    assert len(seq._partials) == 3
    kept = {(s.journal, bytes(s.producer), s.last_ack) for s in seq.checkpoint().states}
    assert kept == {(JOURNAL, a, 5), ("other/journal", a, 9), (JOURNAL, b"odd", 3)}
