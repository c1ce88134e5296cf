"""WriteBuffer keeps which message each queued write came from in runs (one offset per message): a refused
write must still name exactly its message, whatever mix of message shapes, journals and flushes came before.

No server: a fake store refuses the write at a chosen index, as the cluster's validation or a server would.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from zcluster import (
    Count,
    Delete,
    Incr,
    Insert,
    InvalidTupleError,
    KeyScoreMember,
    MapperError,
    ShardFailure,
    WriteRefusedError,
    WriteResult,
)
from zcluster.state.batch import BatchStats, WriteBuffer


class Refusing:
    """A store that refuses write ``bad`` of the ``call``-th apply (or increment) call."""

    def __init__(self, kind: str, bad: int, call: int = 0, refused: bool = False) -> None:
        self.kind, self.bad, self.call, self.refused, self.calls = kind, bad, call, refused, 0

    def _answer(self, kind: str, batch: list[Any]) -> WriteResult:
        if kind == self.kind:
            if self.calls == self.call:
                if not self.refused:
                    raise InvalidTupleError(self.bad, batch[self.bad], "refused here")
                result = WriteResult([False] * len(batch))
                error = WriteRefusedError(self.bad, batch[self.bad], "another kind", {self.bad: "k"}, result)
                result.failures.append(ShardFailure("fake:0", error, [self.bad]))
                return result
            self.calls += 1
        return WriteResult([True] * len(batch))

    def apply(self, batch: list[Any], raise_on_error: bool = True) -> WriteResult:
        return self._answer("apply", batch)

    def increment(self, source: str, batch: list[Any], raise_on_error: bool = True) -> WriteResult:
        return self._answer("increment", batch)


def _message(rng: random.Random, n: int) -> list[Any]:
    """A mapper's output of one of the shapes a mapper may have (mostly one write, as most mappers)."""
    shape = rng.choice(["one", "one", "one", "none", "two", "incr", "both", "tuple", "many"])
    if shape == "one":
        return [rng.choice([Insert, Delete])(f"k{n}", float(n), f"m{n}")]
    if shape == "none":
        return []
    if shape == "two":
        return [Insert(f"k{n}", float(n), "a"), Delete(f"k{n}", float(n), "b")]
    if shape == "incr":
        return [Incr("lb", f"u{n}", 1)]
    if shape == "both":
        return [Insert(f"k{n}", float(n), "a"), Incr("lb", f"u{n}", 1), Count("c", "f", 2)]
    if shape == "tuple":
        return [KeyScoreMember(f"k{n}", float(n), "t")]
    return [Insert(f"k{n}", float(i), str(i)) for i in range(rng.randrange(3, 6))]


@pytest.mark.parametrize("seed", range(60))
def test_a_refused_write_names_its_message(seed: int) -> None:
    rng = random.Random(seed)
    messages = []  # (journal, offset, writes) in add() order
    offset = 0
    journal = "j0"
    for n in range(rng.randrange(1, 60)):
        if rng.random() < 0.05:
            journal = rng.choice(["j0", "j1", "j2"])
        offset += rng.randrange(1, 90)
        messages.append((journal, offset, _message(rng, n)))
    # What was queued, in the buffer's two lists, with the message each came from.
    writes = [(j, o) for j, o, ws in messages for w in ws if not isinstance(w, Incr | Count)]
    incs = [(j, o) for j, o, ws in messages for w in ws if isinstance(w, Incr | Count)]
    kind, owners = (
        rng.choice([("apply", writes), ("increment", incs)])
        if incs and writes
        else (("apply", writes) if writes else ("increment", incs))
    )
    if not owners:
        return
    bad = rng.randrange(len(owners))
    store = Refusing(kind, bad, refused=rng.random() < 0.5)
    buffer = WriteBuffer(store, 10**6, 0, BatchStats(), source="app/j", base=0)  # type: ignore[arg-type]
    for j, o, ws in messages:
        buffer.add(list(ws) if rng.random() < 0.9 else tuple(ws), j, o, o)
    with pytest.raises(MapperError, match=f"journal {owners[bad][0]} offset {owners[bad][1]}:"):
        buffer.flush()


def test_after_a_flush_the_next_refused_write_names_its_own_message() -> None:
    store = Refusing("apply", 1, call=1)
    buffer = WriteBuffer(store, 4, 0, BatchStats())  # type: ignore[arg-type]
    for o in range(4):  # the fourth fills the buffer: flushed (call 0, accepted)
        buffer.add([Insert("k", float(o), "m")], "j", o * 10)
    buffer.add([Insert("k", 9.0, "a")], "j", 40)
    buffer.add([Insert("k", 9.0, "b"), Insert("k", 9.0, "c")], "j", 50)
    with pytest.raises(MapperError, match="journal j offset 50:"):
        buffer.flush()


def test_a_writer_without_journals_gets_the_error_itself() -> None:
    buffer = WriteBuffer(Refusing("apply", 2), 100, 0, BatchStats())  # type: ignore[arg-type]
    for o in range(5):
        buffer.add([Insert("k", float(o), "m")])
    with pytest.raises(InvalidTupleError) as info:
        buffer.flush()
    assert not isinstance(info.value, MapperError)
