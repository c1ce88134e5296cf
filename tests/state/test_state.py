"""State in the cluster: exact clock ordering in Redis, monotonic producer states, offsets, progress, dedup."""

from __future__ import annotations

import multiprocessing
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zcluster import Cluster, ConfigError, InvalidTupleError, KeyScoreMember
from zcluster.message.sequencer import ProducerState
from zcluster.message.uuid import ZERO_UUID, ProducerID, build_uuid
from zcluster.state import DedupStore, StateStore, clock_to_score, score_to_clock
from zcluster.state import store as store_module
from zcluster.state.clocks import MAX_CLOCK
from zcluster.state.layout import decode_states, encode_states, encoded_states
from zcluster.state.txn import TxnStore

P1, P2 = ProducerID(bytes.fromhex("010203040506")), ProducerID(bytes.fromhex("0a0b0c0d0e0f"))


@given(st.integers(0, MAX_CLOCK), st.integers(0, MAX_CLOCK))
def test_clock_scores_keep_order_and_round_trip(a: int, b: int) -> None:
    assert score_to_clock(clock_to_score(a)) == a
    assert (a < b) == (clock_to_score(a) < clock_to_score(b))


def test_clocks_one_bit_apart_compare_correctly_inside_redis(any_cluster: Cluster) -> None:
    c = any_cluster
    base = 0x1EF0_1234_5678_9AB0  # a realistic Gazette clock, far above 2**53
    assert float(base) == float(base + 1)  # as plain numbers these two collide...
    lo, hi = clock_to_score(base), clock_to_score(base + 1)
    c.insert([KeyScoreMember("clk", hi, "m")])
    assert c.insert([KeyScoreMember("clk", lo, "m")]).applied == [False]  # ...as bit patterns they do not
    assert score_to_clock(c.select(["clk"])["clk"][0].score) == base + 1
    c.insert([KeyScoreMember("clk2", lo, "m")])
    assert c.insert([KeyScoreMember("clk2", hi, "m")]).applied == [True]


def test_journal_checkpoints_only_move_forward(any_cluster: Cluster) -> None:
    store = StateStore(any_cluster, "app1")
    open_span = ProducerState("j/1", P1, last_ack=100, begin=40, max_clock=120)
    committed = ProducerState("j/1", P1, last_ack=130, begin=-1, max_clock=130)
    other = ProducerState("j/1", P2, last_ack=7, begin=-1, max_clock=7)
    assert store.load_journal("j/1") == (0, [], "", 0)
    assert store.save_journal("j/1", 50, [open_span, other], journal_id="id1") is True
    ck = store.load_journal("j/1")
    assert (ck.offset, ck.journal_id) == (50, "id1") and sorted(ck.states) == sorted([open_span, other])
    assert store.save_journal("j/1", 90, [committed, other], journal_id="id1") is True
    assert store.load_journal("j/1") == (90, sorted([committed, other], key=lambda s: s.producer.hex()), "id1", 0)
    assert store.save_journal("j/1", 50, [open_span]) is False  # a zombie with the older checkpoint
    assert store.save_journal("j/1", 90, [committed, other], journal_id="id1") is False  # the same one again
    assert store.load_journal("j/1").offset == 90 and set(store.load_journal("j/1").states) == {committed, other}
    # superseded snapshots were forgotten: one record, whatever the number of producers and saves
    raw = store.cluster.select(["app1/journal/j/1"], limit=100)["app1/journal/j/1"]
    assert len(raw) == 1
    # a save replaces the states as a whole: a producer pruned by the Sequencer is gone
    assert store.save_journal("j/1", 95, [committed], journal_id="id1") is True
    assert store.load_journal("j/1") == (95, [committed], "id1", 0)
    assert store.load_journal("missing") == (0, [], "", 0)
    with pytest.raises(ValueError, match="identity"):
        store.save_journal("j/1", 99, [], journal_id="a|b")


def test_a_save_past_the_loaded_checkpoint_skips_the_read_and_changes_no_outcome(
    any_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``loaded=`` (the applier's way): the save writes without reading first; the key's floor refuses what the
    read refused, and only then is the stored checkpoint read to say why."""
    store = StateStore(any_cluster, "skip")
    reads: list[object] = []
    select = store.cluster.select
    monkeypatch.setattr(store.cluster, "select", lambda *a, **k: reads.append(a) or select(*a, **k))
    state = ProducerState("j", P1, last_ack=10, begin=-1, max_clock=10)
    assert store.save_journal("j", 50, [state], journal_id="id") is True and len(reads) == 1  # no loaded: read
    old = store.load_journal("j")
    reads.clear()
    assert store.save_journal("j", 90, [state], journal_id="id", loaded=old) is True and reads == []
    # A zombie that loaded the old checkpoint: its write is refused by the floor, then the read says why.
    assert store.save_journal("j", 70, [state], journal_id="id", loaded=old) is False and len(reads) == 1
    new = store.load_journal("j")
    assert new == (90, [state], "id", 0)
    reads.clear()
    assert store.save_journal("j", 90, [state], journal_id="id", loaded=new) is False and len(reads) == 1
    assert len(select(["skip/journal/j"], limit=100)["skip/journal/j"]) == 1
    # A publishing application's claim (v4) raised the floor above every position: refused, and said so.
    TxnStore(store).claim("j", b"\x01" * 16)
    claimed = select(["skip/journal/j"], limit=100)["skip/journal/j"]
    with pytest.raises(ConfigError, match="publishing application"):
        store.save_journal("j", 500, [state], journal_id="id", loaded=new)
    assert select(["skip/journal/j"], limit=100)["skip/journal/j"] == claimed


def test_checkpoints_of_the_previous_layout_are_read_and_then_forgotten(any_cluster: Cluster) -> None:
    store = StateStore(any_cluster, "old")
    key = "old/journal/j"
    open_span = ProducerState("j", P1, last_ack=100, begin=40, max_clock=120)
    other = ProducerState("j", P2, last_ack=7, begin=-1, max_clock=7)
    store.cluster.insert(
        [
            KeyScoreMember(key, clock_to_score(120), f"{P1.hex()}|100|40"),
            KeyScoreMember(key, clock_to_score(90), f"{P1.hex()}|80|-1"),  # superseded, not yet deleted
            KeyScoreMember(key, clock_to_score(7), f"{P2.hex()}|7|-1"),
            KeyScoreMember(key, 60.0, "~offset"),
        ]
    )
    ck = store.load_journal("j")
    assert ck.offset == 60 and set(ck.states) == {open_span, other} and ck.journal_id == ""
    assert store.save_journal("j", 80, ck.states) is True
    assert len(store.cluster.select([key], limit=100)[key]) == 1
    assert store.load_journal("j").offset == 80 and set(store.load_journal("j").states) == {open_span, other}


def test_a_restart_moves_past_every_earlier_position(any_cluster: Cluster) -> None:
    store = StateStore(any_cluster, "restart")
    state = ProducerState("j", P1, last_ack=10, begin=-1, max_clock=10)
    store.save_journal("j", 5000, [state], journal_id="old")
    restarted = store.restart_journal("j", reason="journal made again")
    assert restarted == (0, [], "", 5001) and store.load_journal("j") == restarted
    assert store.save_journal("j", 700, [state], journal_id="old") is False  # the old journal's zombie: stale
    assert store.save_journal("j", 300, [state], base=restarted.base, journal_id="new") is True
    assert store.load_journal("j") == (300, [state], "new", 5001)
    (entry,) = store.audit()
    assert (entry["action"], entry["offset"], entry["stored_id"], entry["reason"]) == (
        "restart",
        5000,
        "old",
        "journal made again",
    )


def test_progress_is_monotonic(any_cluster: Cluster) -> None:
    store = StateStore(any_cluster, "app2")
    assert store.committed_batch("q1") is None
    assert store.commit_batch("q1", 3) is True
    assert store.commit_batch("q1", 3) is False  # replayed batch
    assert store.commit_batch("q1", 2) is False  # zombie with an older batch
    assert store.committed_batch("q1") == 3
    assert store.committed_batch("q2") is None  # a new query id (new checkpoint) starts fresh
    with pytest.raises(ValueError):
        StateStore(any_cluster, "a/b")


def test_dedup_admits_once(any_cluster: Cluster) -> None:
    d = DedupStore(any_cluster, namespace=f"{any_cluster.prefix.decode()}dd:")
    u1, u2 = build_uuid(P1, 1000, 0), build_uuid(P1, 1001, 0)
    assert d.admit("j", u1) is True
    assert d.admit("j", u1) is False
    assert d.admit("other", u1) is True  # per journal
    assert d.admit_many([("j", u2), ("j", u2), ("j", u1), ("j", ZERO_UUID), ("j", ZERO_UUID)]) == [
        True,
        False,
        False,
        True,
        True,
    ]
    assert d.prune("j", 1000) == 1
    assert d.admit("j", u1) is False  # pruned, but never admitted twice
    assert d.admit("j", build_uuid(P2, 999, 0)) is False  # too old: refused
    assert d.admit("j", build_uuid(P2, 1002, 0)) is True


def _admit_worker(args: tuple[list[str], str, list[bytes], int]) -> list[bytes]:
    urls, ns, uuids, seed = args
    random.Random(seed).shuffle(uuids)
    with Cluster.from_urls(urls) as c:
        d = DedupStore(c, namespace=ns)
        won = []
        for lo in range(0, len(uuids), 50):
            chunk = uuids[lo : lo + 50]
            won.extend(u for u, ok in zip(chunk, d.admit_many([("j", u) for u in chunk]), strict=True) if ok)
        return won


def test_dedup_is_exactly_once_across_processes(shards: object, prefix: str) -> None:
    uuids = [build_uuid(P1, 5000 + i, 0) for i in range(2000)]
    urls = shards.urls  # type: ignore[attr-defined]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_admit_worker, [(urls, f"{prefix}mp:", list(uuids), seed) for seed in range(4)])
    admitted = [u for r in results for u in r]
    assert sorted(admitted) == sorted(uuids)  # each exactly once over all processes


def test_dedup_checks_its_arguments_before_anything_is_sent(any_cluster: Cluster) -> None:
    d = DedupStore(any_cluster, namespace=f"{any_cluster.prefix.decode()}dd:")
    u = build_uuid(P1, 2000, 0)
    bad: list[tuple[object, object, str]] = [
        (None, u, "journal must be a non-empty str"),
        (5, u, "journal must be a non-empty str"),
        ("", u, "journal must be a non-empty str"),
        ("j", u[:15], "16 bytes, got 15"),
        ("j", u + b"x", "16 bytes, got 17"),
        ("j", "not-a-uuid", "not a UUID"),
        ("j", 42, "must be str or bytes"),
    ]
    for journal, uuid, reason in bad:
        with pytest.raises(InvalidTupleError, match=reason) as info:
            d.admit_many([("j", build_uuid(P1, 1999, 0)), (journal, uuid)])  # type: ignore[list-item]
        assert info.value.index == 1
    assert d.admit("j", build_uuid(P1, 1999, 0)) is True  # nothing of the refused calls was sent
    assert d.admit("j", bytearray(u)) is True and d.admit("j", u) is False  # a bytearray is the same UUID


_STATE_FIELDS = st.tuples(
    st.sampled_from(["j", "j", "other"]),  # another journal's state: the load's decode is not known unparsed
    st.binary(min_size=6, max_size=6) | st.binary(max_size=8).map(bytearray),
    st.integers(0, 2**60) | st.booleans(),  # a bool prints as "True": unparseable, so nothing is memoized
    st.integers(-1, 2**62),
    st.none() | st.integers(0, 2**60),
)


@given(st.lists(_STATE_FIELDS, max_size=6))
def test_the_states_a_save_keeps_are_what_its_text_decodes_to(fields: list[tuple]) -> None:  # type: ignore[type-arg]
    """encoded_states: the text of encode_states, and decode_states' result of it made without parsing,
    exactly (types, order, duplicates), or None where that result is not known without parsing."""
    states = [ProducerState(*f) for f in fields]
    text, decoded = encoded_states("j", states)
    assert text == encode_states(states)
    if decoded is not None:
        assert decoded == decode_states("j", text)
        assert [tuple(map(type, s)) for s in decoded] == [tuple(map(type, s)) for s in decode_states("j", text)]
    else:
        assert any(s.journal != "j" or type(s.last_ack) is not int for s in states)


def test_a_load_of_the_checkpoint_this_store_saved_parses_nothing_and_loads_the_same(
    any_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store remembers the last checkpoint it saved per journal: the load that reads that text back (the
    applier's next batch) returns what a parse would, as a list of its own; another writer's checkpoint (a
    different text) is parsed."""
    store, other = StateStore(any_cluster, "memo"), StateStore(any_cluster, "memo")
    states = [ProducerState("j", P2, 7, -1, 9), ProducerState("j", P1, 5, 40, None)]
    assert store.save_journal("j", 50, states, journal_id="id")
    parsed = other.load_journal_timed("j")  # a store that saved nothing parses
    calls: list[str] = []
    real = store_module._decode
    monkeypatch.setattr(store_module, "_decode", lambda j, m: calls.append(m) or real(j, m))
    loaded = store.load_journal_timed("j")
    assert calls == [] and loaded == parsed and loaded.checkpoint.states is not parsed.checkpoint.states
    assert loaded.checkpoint.states == [ProducerState("j", P1, 5, 40, 5), ProducerState("j", P2, 7, -1, 9)]
    loaded.checkpoint.states.clear()  # the caller's list: the next load is whole again
    assert store.load_journal("j").states == parsed.checkpoint.states and calls == []
    assert other.save_journal("j", 60, states[:1], journal_id="id")  # another writer moved it: parsed again
    assert store.load_journal("j") == (60, states[:1], "id", 0) and len(calls) == 1


def test_states_given_as_other_objects_with_the_fields_names_are_encoded_as_before() -> None:
    """The compiled encoder reads a ProducerState by index; anything else is read by the fields' names, as
    the pure code read every state (and what has no such fields is an AttributeError, as it was)."""

    class Named:
        journal, producer, last_ack, begin, max_clock = "j", bytes(range(6)), 5, -1, None

    state = ProducerState("j", bytes(range(6)), 5, -1, None)
    assert encode_states([Named()]) == encode_states([state]) == "000102030405:5:-1:5"
    assert encoded_states("j", [Named()]) == encoded_states("j", [state])
    with pytest.raises(AttributeError):
        encode_states([("j", b"p", 1, 2)])  # type: ignore[list-item]
