"""Property: random interleavings of producers, duplicates, retries, rollbacks, zero clocks inside open
spans, small rings (forcing replays) and crash/restore from checkpoints deliver each committed message
exactly once, in each producer's order, and never a rolled-back one."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zcluster.message import Envelope, Flags, ProducerState, QueueOutcome, Sequencer, build_uuid

JOURNALS = ("j/a", "j/b")


@dataclass
class Producer:
    pid: bytes
    journal: str
    clock: int
    last_ack: int
    stream: list[tuple[int, int, str | None, bool]] = field(default_factory=list)  # (clock, flags, id, late_dup_ok)
    committed: list[str] = field(default_factory=list)


def build_producer(data: st.DataObject, index: int) -> Producer:
    start = data.draw(st.integers(1, 1 << 40), label="start clock")
    p = Producer(bytes([index + 1] * 6), data.draw(st.sampled_from(JOURNALS)), start, start)
    for a in range(data.draw(st.integers(0, 6), label="actions")):
        kind = data.draw(st.sampled_from(["commit", "txn", "rollback", "retry"]))
        if kind == "commit":
            p.clock += 1
            mid = f"p{index}-{a}"
            p.stream.append((p.clock, Flags.OUTSIDE_TXN, mid, True))
            p.committed.append(mid)
            p.last_ack = p.clock
            continue
        ids = [f"p{index}-{a}-{k}" for k in range(data.draw(st.integers(1, 4)))]
        txn = []
        for mid in ids:
            p.clock += 1
            txn.append((p.clock, Flags.CONTINUE_TXN, mid, kind != "rollback"))
        # Zero clocks of the producer's own id inside its open span: committed (delivered) when read, never
        # part of the span, so never again by its ACK's replay. Never duplicated: a zero clock is not tracked.
        zeros = [f"p{index}-{a}-z{k}" for k in range(len(ids)) if data.draw(st.integers(0, 3), label="zero") == 0]
        p.stream += txn[:1] + [(0, Flags.OUTSIDE_TXN, mid, False) for mid in zeros] + txn[1:]
        p.committed += zeros
        if kind == "rollback":
            p.stream.append((p.last_ack, Flags.ACK_TXN, None, False))  # Re-sent older ACK: rolls back.
            continue
        if kind == "retry":
            p.stream += txn  # The whole transaction is appended again before its ACK.
        p.clock += 1
        p.stream.append((p.clock, Flags.ACK_TXN, None, False))
        p.committed += ids
        p.last_ack = p.clock
    return p


def interleave(data: st.DataObject, producers: list[Producer]) -> dict[str, list[Envelope]]:
    # Each producer's items, plus duplicates: any item may be re-appended right away (an append
    # retry, before the producer's next append); committed non-ACK items may also re-appear later.
    queues = []
    for p in producers:
        items: list[tuple[int, int, str | None]] = []
        late: list[tuple[int, int, str | None]] = []
        for clock, flags, mid, late_ok in p.stream:
            items.append((clock, flags, mid))
            if clock and data.draw(st.integers(0, 9), label="dup") == 0:
                items.append((clock, flags, mid))
            if late_ok and data.draw(st.integers(0, 9), label="late dup") == 0:
                late.append((clock, flags, mid))
        queues.append((p, items + late))
    out: dict[str, list[Envelope]] = {j: [] for j in JOURNALS}
    ends = dict.fromkeys(JOURNALS, 0)
    live = [q for q in queues if q[1]]
    while live:
        p, items = live[data.draw(st.integers(0, len(live) - 1), label="next producer")]
        clock, flags, mid = items.pop(0)
        size = 10 + len(out[p.journal]) % 7
        begin = ends[p.journal]
        out[p.journal].append(Envelope(p.journal, begin, begin + size, mid, build_uuid(p.pid, clock, flags)))
        ends[p.journal] = begin + size
        live = [q for q in live if q[1]]
    return out


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_exactly_once_in_producer_order(data: st.DataObject) -> None:
    producers = [build_producer(data, i) for i in range(data.draw(st.integers(1, 4), label="producers"))]
    journals = interleave(data, producers)
    buffer = data.draw(st.integers(0, 6), label="ring")

    seq = Sequencer(buffer=buffer)
    delivered: list[str] = []
    checkpoint = seq.checkpoint()
    snapshot: list[str] = []
    pos = dict.fromkeys(JOURNALS, 0)
    crashes = 0

    def restore() -> None:
        nonlocal seq, delivered
        seq = Sequencer(checkpoint.offsets, checkpoint.states, buffer=buffer)
        delivered = list(snapshot)
        for j, envs in journals.items():
            off = checkpoint.offsets.get(j, 0)
            pos[j] = next((i for i, e in enumerate(envs) if e.begin >= off), len(envs))

    while any(pos[j] < len(journals[j]) for j in JOURNALS):
        j = data.draw(st.sampled_from([j for j in JOURNALS if pos[j] < len(journals[j])]), label="journal")
        env = journals[j][pos[j]]
        pos[j] += 1
        if seq.queue_uncommitted(env) is QueueOutcome.ACK_COMMIT_REPLAY:
            rj, begin, end = seq.replay_range()
            assert rj == j and begin <= end  # Empty after a restore mid-dequeue, as in Gazette.
            seq.start_replay([e for e in journals[rj] if begin <= e.begin and e.end <= end])
        while True:
            out = seq.step()
            action = data.draw(st.integers(0, 19), label="checkpoint/crash")
            if action == 0:
                # Checkpoint with the application's state; `out` is not yet processed.
                checkpoint, snapshot = seq.checkpoint(), list(delivered)
            elif action == 1 and crashes < 3:
                crashes += 1
                restore()
                break
            if out is None:
                break
            if not out.is_ack:
                delivered.append(out.message)

    expected = {p.pid: p.committed for p in producers}
    by_producer: dict[bytes, list[str]] = {p.pid: [] for p in producers}
    for mid in delivered:
        by_producer[producers[int(mid.split("-")[0][1:])].pid].append(mid)
    assert by_producer == expected


def _queue(seq: Sequencer, env: Envelope, envs: list[Envelope], out: list[str]) -> QueueOutcome:
    """``queue_uncommitted(env)``, a replay from ``envs`` when asked, and ``step()`` until None (into ``out``)."""
    outcome = seq.queue_uncommitted(env)
    if outcome is QueueOutcome.ACK_COMMIT_REPLAY:
        _, begin, end = seq.replay_range()
        seq.start_replay([e for e in envs if begin <= e.begin and e.end <= end])
    while (step := seq.step()) is not None:
        out.append(step.message)
    return outcome


def _state(seq: Sequencer) -> object:
    """Everything a Sequencer holds that it reads again, its ring included (owners named by their journal and
    producer; the clock and begin of live entries only: a released entry's are never read)."""
    partials = {
        (p.journal, p.producer): (p.min_clock, p.max_clock, p.begin, p.ring_start, p.ring_stop)
        for p in seq._partials.values()
    }
    owners = [None if p is None else (p.journal, p.producer) for p in seq._ring_owner]
    ring = [None if e is None else (e.journal, e.begin) for e in seq._ring]
    live = [(seq._ring_clock[i], seq._ring_begin[i]) if e is not None else None for i, e in enumerate(seq._ring)]
    return (seq._head, ring, live, owners, seq._next, partials, seq._offsets, seq._emit)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_commit_outside_is_queue_then_step(data: st.DataObject) -> None:
    """The fast path leaves exactly the state, outcome and deliveries of queue_uncommitted + step."""
    journal = "j/a"
    flags = st.sampled_from([Flags.OUTSIDE_TXN, Flags.OUTSIDE_TXN, Flags.CONTINUE_TXN, Flags.ACK_TXN, 0x3])
    envs: list[Envelope] = []
    for i in range(data.draw(st.integers(1, 40), label="messages")):
        producer = bytes([data.draw(st.integers(0, 2), label="producer")] * 6)
        clock = data.draw(st.integers(0, 12), label="clock") << 4  # small: many repeats, zeros and go-backs
        uuid = build_uuid(producer, clock, data.draw(flags, label="flags"))
        envs.append(Envelope(journal, 10 * i, 10 * i + 10, f"m{i}", uuid))
    buffer = data.draw(st.integers(0, 4), label="ring")
    general, fast = Sequencer(buffer=buffer), Sequencer(buffer=buffer)
    got_general: list[str] = []
    got_fast: list[str] = []

    for env in envs:
        expected = _queue(general, env, envs, got_general)
        outcome = fast.commit_outside(env)
        if outcome is None:
            outcome = _queue(fast, env, envs, got_fast)
        elif outcome is QueueOutcome.OUTSIDE_COMMIT:
            got_fast.append(env.message)
        assert outcome is expected
        assert got_fast == got_general
        assert _state(fast) == _state(general)
    assert fast.checkpoint() == general.checkpoint()


@pytest.mark.parametrize("seed", range(6))
def test_rings_made_as_the_head_reaches_them_behave_as_rings_made_whole(seed: int) -> None:
    """A Sequencer makes its ring's slots as its head first reaches them (up to ``buffer``): fed the same
    envelopes, one whose rings were made whole up front gives the same outcomes and deliveries at every step,
    and the same state, through the growth (512 slots, then 600) and past the wraps (long spans evicted,
    replayed from the journal)."""
    journal, cap = "j/a", 600
    envs: list[Envelope] = []
    clocks = [0, 0, 0]
    flags = [Flags.OUTSIDE_TXN, Flags.CONTINUE_TXN, Flags.CONTINUE_TXN, Flags.ACK_TXN]
    rng = random.Random(seed)
    for i in range(3 * cap):
        producer, flag = rng.randrange(3), rng.choice(flags)
        clocks[producer] += 0 if rng.random() < 0.1 else 16  # else a duplicate of the producer's last clock
        uuid = build_uuid(bytes([producer + 1] * 6), clocks[producer] + 16, flag)
        envs.append(Envelope(journal, 10 * i, 10 * i + 10, f"m{i}", uuid))
    grown, whole = Sequencer(buffer=cap), Sequencer(buffer=cap)
    more = cap - len(whole._ring)
    whole._ring += [None] * more
    whole._ring_clock += [0] * more
    whole._ring_begin += [0] * more
    whole._ring_owner += [None] * more
    whole._next += [-1] * more

    def queue(seq: Sequencer, env: Envelope) -> tuple[QueueOutcome, list[str]]:
        out: list[str] = []
        return _queue(seq, env, envs, out), out

    wraps = 0
    for n, env in enumerate(envs):
        head = grown._head
        assert queue(grown, env) == queue(whole, env) and grown._head == whole._head
        wraps += grown._head < head
        if n % 97 == 0 or grown._head < head:
            size = len(grown._ring)
            assert _state(grown) == tuple(x[:size] if isinstance(x, list) else x for x in _state(whole))
    assert len(grown._ring) == cap and wraps >= 1 and grown.checkpoint() == whole.checkpoint()


def test_producer_keys_stay_distinct_past_the_64_bit_journal_numbers_and_for_an_empty_journal_name() -> None:
    """A Sequencer keys a producer by its journal's number above the producer's 48 bits: 64-bit arithmetic
    up to 32,767 journals, plain ints past it (the 65,537th journal's keys once wrapped onto the first's);
    the journal cache's unset value is no journal a caller can name (the empty name included)."""
    seq = Sequencer()
    uuid = build_uuid(bytes(range(1, 7)), 16, Flags.OUTSIDE_TXN)
    keys = [seq._key(f"j{n}", uuid) for n in range(65_537)]
    assert keys == [(n << 48) | int.from_bytes(uuid[10:16], "big") for n in range(65_537)]
    assert len(set(keys)) == len(keys) and seq._key("", uuid) == (65_537 << 48) | int.from_bytes(uuid[10:16], "big")
    other = Sequencer()
    assert other.commit_outside(Envelope("", 0, 10, "m", uuid)) is QueueOutcome.OUTSIDE_COMMIT
    assert other.commit_outside(Envelope("", 10, 20, "m", uuid)) is QueueOutcome.OUTSIDE_ALREADY_ACKED
    assert other.checkpoint().states == [ProducerState("", bytes(range(1, 7)), 16, -1, 16)]
