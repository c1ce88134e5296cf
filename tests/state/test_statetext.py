"""zcluster.state._statetext (C, in the compiled build) spells a producer state's checkpoint text exactly as the
reference (zcluster.state.layout._text) does, and declines (None) exactly what it does not spell: a producer
that is not exact bytes of at most 64, a number that is not an exact int in [-2**63, 2**64)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zcluster.message.sequencer import ProducerState
from zcluster.state import layout

native = pytest.importorskip(
    "zcluster.state._statetext", reason="no current compiled build here (python -m zcluster._native_build)"
)

EDGES = [0, 1, 9, 10, 99, 2**31, 2**60 + 12345, 2**63 - 1, 2**63, 2**64 - 1, 2**64]
EDGES += [-1, -10, -(2**63), -(2**63) - 1, -(2**64), True, False]
numbers = st.one_of(st.sampled_from(EDGES), st.integers(0, 2**64 - 1), st.integers(-(2**70), 2**70))
producers = st.one_of(st.binary(max_size=70), st.binary(min_size=6, max_size=6).map(bytearray))


def _spellable(producer: Any, *values: Any) -> bool:
    ints = all(type(v) is int and -(2**63) <= v < 2**64 for v in values)
    return type(producer) is bytes and len(producer) <= 64 and ints


@settings(max_examples=1500, deadline=None)
@given(producers, numbers, numbers, st.one_of(st.none(), numbers))
def test_the_c_text_is_the_reference_text_or_none(producer: Any, last_ack: Any, begin: Any, max_clock: Any) -> None:
    state = ProducerState("j", producer, last_ack, begin, max_clock)
    got = native.state_text(state)
    top = last_ack if max_clock is None else max_clock
    if _spellable(producer, last_ack, begin, top):
        assert got == layout._text(state)
        assert got.isascii() and type(got) is str
    else:
        assert got is None
    assert layout._spelled(state) == layout._text(state)  # what the layout writes, either way


def test_other_objects_are_declined_and_the_layout_uses_the_c_text() -> None:
    for other in (None, "text", (), ("j", b"p", 1, 2), ("j", b"p", 1, 2, None, 3), [("j", b"p", 1, 2, None)]):
        assert native.state_text(other) is None
    state = ProducerState("j", bytes.fromhex("0123456789ab"), 2**60 + 7, -1, None)
    assert native.state_text(state) == "0123456789ab:1152921504606846983:-1:1152921504606846983"
    assert layout._STATE_TEXT is native.state_text  # the build is current: the layout takes the C path
    assert layout.encode_states([state, state._replace(begin=4)]) == ",".join(
        sorted([layout._text(state), layout._text(state._replace(begin=4))])
    )
