"""zcluster.state._untrack (C, in the compiled build): a WriteBuffer's Inserts and Deletes are off the cyclic
garbage collector's lists while they wait for the flush, only when they can be in no reference cycle, and
they are still freed, and sent, as before."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any, NamedTuple

import pytest

from zcluster import Delete, Incr, Insert, KeyScoreMember
from zcluster.state import BatchStats
from zcluster.state.batch import WriteBuffer
from zcluster.types import WriteResult

native = pytest.importorskip(
    "zcluster.state._untrack", reason="no current compiled build here (python -m zcluster._native_build)"
)


class _Free(NamedTuple):
    a: Any
    b: Any


class _WithDict(tuple):  # type: ignore[type-arg]  # a tuple subclass whose instances have a __dict__
    pass


def test_only_tuples_of_atomic_values_without_a_dict_are_untracked() -> None:
    for atomic in [("k", 1.5, "m"), (b"k", 2, b"m"), ("k", True, None), ("k", 10**40, "m")]:
        w = Insert(*atomic)
        assert gc.is_tracked(w) and native.untrack(w) is True and not gc.is_tracked(w)
        assert native.untrack(w) is False  # already untracked: nothing to do
    for holding in [["m"], {"m": 1}, ("m",), bytearray(b"m"), _Free("m", 1), type("S", (str,), {})("m")]:
        w = Insert("k", 1.0, holding)  # a container, even an immutable one, or a subclass of an atomic type
        assert native.untrack(w) is False and gc.is_tracked(w), holding
    odd = _WithDict(["k", 1.0, "m"])
    assert native.untrack(odd) is False and gc.is_tracked(odd)  # its __dict__ could make a cycle later
    for other in ["text", 5, None, ["k", 1.0, "m"], {"k": 1}]:
        assert native.untrack(other) is False


def test_untracked_writes_are_freed_by_their_reference_counts() -> None:
    """200,000 untracked writes made and dropped one by one: the memory they held comes back at once, with
    no collection (none can reach them)."""
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(200_000):
            w = Delete(f"key-{i}", float(i), f"member-{i}")
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
    one = Insert("k", 1.0, "m")
    several = [Delete("k", 2.0, "m"), Insert("k", 3.0, ["not", "atomic"]), KeyScoreMember("k", 4.0, "x")]
    inc = Incr("board", "u", 1)
    buffer.add([one], "j", 0, 0)
    buffer.add([*several, inc], "j", 10, 10)
    assert not gc.is_tracked(one) and not gc.is_tracked(several[0])
    assert gc.is_tracked(several[1])  # it holds a list: left to the collector
    assert gc.is_tracked(inc)  # increments are not this module's
    buffer.flush()
    assert store.batches[0] == [one, *several[:2], Insert("k", 4.0, "x")]
    assert [w for _, w in store.batches[1]] == [inc]  # with its fence position
