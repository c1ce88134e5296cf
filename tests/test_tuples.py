"""zcluster._tuples (C, in the compiled build): the write NamedTuples made by a C constructor are the same
instances their own makes, with the same errors; a WriteBuffer's Inserts and Deletes are off the cyclic
garbage collector's lists while they wait for the flush, only when they can be in no reference cycle, and
they are still freed, and sent, as before."""

from __future__ import annotations

import copy
import gc
import pickle
import tracemalloc
from typing import Any, NamedTuple

import pytest

from zcluster import Count, Delete, Incr, Insert, KeyScoreMember
from zcluster.message.sequencer import ProducerState
from zcluster.state import BatchStats
from zcluster.state.batch import WriteBuffer
from zcluster.types import WriteResult

native = pytest.importorskip(
    "zcluster._tuples", reason="no current compiled build here (python -m zcluster._native_build)"
)


class _Free(NamedTuple):
    a: Any
    b: Any


class _WithDict(tuple):  # type: ignore[type-arg]  # a tuple subclass whose instances have a __dict__
    pass


WRITES = (KeyScoreMember, Insert, Delete, Incr, Count)


def _own(cls: type, *args: Any, **kwargs: Any) -> Any:
    """What the NamedTuple's own constructor (its generated __new__) makes of the arguments."""
    return cls.__new__(cls, *args, **kwargs)


@pytest.mark.parametrize("cls", WRITES)
def test_the_c_constructor_makes_what_the_namedtuples_own_makes(cls: type) -> None:
    for args in [("k", 1.5, "m"), (b"k", -2, b"m"), ("k", True, None), (["k"], {"s": 1}, ("m",))]:
        made, own = cls(*args), _own(cls, *args)
        assert type(made) is cls and made == own and tuple(made) == args and repr(made) == repr(own)
        if all(isinstance(a, str | bytes | int | float | type(None)) for a in args):  # hashable
            assert hash(made) == hash(own) == hash(args) and {made: 1}[args] == 1  # interchangeable as keys
        assert pickle.loads(pickle.dumps(made)) == made and copy.copy(made) == made
        assert made._replace(**{made._fields[0]: "other"})[0] == "other" and cls._make(args) == made
    assert cls(*[f"v{i}" for i in range(3)]) is not cls(*[f"v{i}" for i in range(3)])  # a new instance each call


@pytest.mark.parametrize("cls", WRITES)
def test_any_other_call_takes_the_namedtuples_own_path_and_errors(cls: type) -> None:
    a, b, c = cls._fields
    assert cls(**{a: "k", b: 1.0, c: "m"}) == _own(cls, "k", 1.0, "m")  # keywords
    assert cls("k", **{b: 1.0, c: "m"}) == _own(cls, "k", 1.0, "m")
    for args, kwargs in [(("k", 1.0), {}), (("k", 1.0, "m", "x"), {}), ((), {}), (("k", 1.0, "m"), {a: "k"})]:
        with pytest.raises(TypeError) as made:
            cls(*args, **kwargs)
        with pytest.raises(TypeError) as own:
            _own(cls, *args, **kwargs)
        assert str(made.value) == str(own.value)


def test_a_subclass_keeps_its_own_constructor() -> None:
    class Mine(Insert):
        def __new__(cls, key: Any, score: float, member: Any) -> Mine:
            return super().__new__(cls, f"mine:{key}", score, member)

    made = Mine("k", 1.0, "m")
    assert type(made) is Mine and made.key == "mine:k"  # not the C constructor: it is never inherited


def test_producer_states_are_made_in_c_as_their_own_constructor_makes_them() -> None:
    """The Sequencer's ProducerState (five fields, the last with a default) is constructed too: five
    positional arguments make it directly, four (the default) or keywords take its own path."""
    for args in [("j", b"\x01" * 6, 7, -1, 9), ("j", b"p", 1, 2, None)]:
        made, own = ProducerState(*args), _own(ProducerState, *args)
        assert type(made) is ProducerState and made == own and repr(made) == repr(own) and hash(made) == hash(args)
        assert not gc.is_tracked(made) and pickle.loads(pickle.dumps(made)) == made
    assert ProducerState("j", b"p", 1, 2) == _own(ProducerState, "j", b"p", 1, 2, None)
    assert ProducerState("j", b"p", 1, 2, max_clock=3).max_clock == 3
    with pytest.raises(TypeError) as made_error:
        ProducerState("j", b"p", 1, 2, 3, 4)
    with pytest.raises(TypeError) as own_error:
        _own(ProducerState, "j", b"p", 1, 2, 3, 4)
    assert str(made_error.value) == str(own_error.value)


def test_construct_refuses_what_it_cannot_make() -> None:
    Nine = NamedTuple("Nine", [(f"f{i}", Any) for i in range(9)])  # type: ignore[misc]  # wider than 8

    class Dicty(tuple):  # type: ignore[type-arg]
        _fields = ("a", "b", "c")

    for bad in [tuple, Nine, Dicty, int, "Insert", Insert("k", 1.0, "m")]:
        with pytest.raises(TypeError):
            native.construct(bad)


def test_made_writes_of_atomic_values_start_untracked() -> None:
    assert not gc.is_tracked(Insert("k", 1.0, "m")) and not gc.is_tracked(Incr("b", "u", 1))
    assert gc.is_tracked(Insert("k", 1.0, ["m"]))  # holds a container: the collector's
    assert gc.is_tracked(Insert(key="k", score=1.0, member="m"))  # made by the NamedTuple's own


def test_only_tuples_of_atomic_values_without_a_dict_are_untracked() -> None:
    for atomic in [("k", 1.5, "m"), (b"k", 2, b"m"), ("k", True, None), ("k", 10**40, "m")]:
        w = _own(Insert, *atomic)
        assert gc.is_tracked(w) and native.untrack(w) is True and not gc.is_tracked(w)
        assert native.untrack(w) is False  # already untracked: nothing to do
    for holding in [["m"], {"m": 1}, ("m",), bytearray(b"m"), _Free("m", 1), type("S", (str,), {})("m")]:
        w = Insert("k", 1.0, holding)  # a container, even an immutable one, or a subclass of an atomic type
        assert native.untrack(w) is False and gc.is_tracked(w), holding
    odd = _WithDict(["k", 1.0, "m"])
    assert native.untrack(odd) is False and gc.is_tracked(odd)  # its __dict__ could make a cycle later
    for other in ["text", 5, None, {"k": 1}, ["k", ["m"]], type("L", (list,), {})([1])]:
        assert native.untrack(other) is False  # not a tuple or plain list, or one holding a container
    ring = [0] * 100  # a plain list of atomic values (its owner promises to keep it so): the Sequencer's rings
    assert gc.is_tracked(ring) and native.untrack(ring) is True and not gc.is_tracked(ring)


def test_untracked_writes_are_freed_by_their_reference_counts() -> None:
    """200,000 untracked writes made and dropped one by one: the memory they held comes back at once, with
    no collection (none can reach them)."""
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(200_000):
            w = _own(Delete, f"key-{i}", float(i), f"member-{i}")
            assert native.untrack(w)
            del w
        assert tracemalloc.get_traced_memory()[0] - base < 64 * 1024
    finally:
        tracemalloc.stop()
        gc.enable()


class _Recording:
    """A Store that takes every write and remembers what it was given."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def apply(self, batch: list[Any], raise_on_error: bool = True) -> WriteResult:
        self.batches.append(list(batch))
        return WriteResult([True] * len(batch), [])

    def increment(self, source: str, batch: list[Any], raise_on_error: bool = True) -> WriteResult:
        self.batches.append(list(batch))
        return WriteResult([True] * len(batch), [])


def test_a_write_buffer_untracks_what_it_holds_and_sends_it_unchanged() -> None:
    store = _Recording()
    buffer = WriteBuffer(store, 1_000, 0, BatchStats(), source="app/j")  # type: ignore[arg-type]
    one = _own(Insert, "k", 1.0, "m")
    several = [_own(Delete, "k", 2.0, "m"), Insert("k", 3.0, ["not", "atomic"]), KeyScoreMember("k", 4.0, "x")]
    inc = _own(Incr, "board", "u", 1)  # tracked, as a user's own NamedTuple would be
    buffer.add([one], "j", 0, 0)
    buffer.add([*several, inc], "j", 10, 10)
    assert not gc.is_tracked(one) and not gc.is_tracked(several[0])
    assert gc.is_tracked(several[1])  # it holds a list: left to the collector
    assert gc.is_tracked(inc)  # increments are not this module's
    buffer.flush()
    assert store.batches[0] == [one, *several[:2], Insert("k", 4.0, "x")]
    assert [w for _, w in store.batches[1]] == [inc]  # with its fence position
