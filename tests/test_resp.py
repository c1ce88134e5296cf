"""zcluster._resp (C, in the compiled build) packs commands into exactly hiredis' bytes, and says which argument
it cannot send; the pipelines use it whenever the build is current."""

from __future__ import annotations

import math
import random
from typing import Any

import hiredis
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from zcluster import _pipelines

resp = pytest.importorskip("zcluster._resp", reason="no current compiled build here (python -m zcluster._native_build)")

arguments = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False),  # NaN: both print "nan"; no Redis command takes it
    st.integers(min_value=-(10**17), max_value=10**17).map(float),  # around the whole-number fast path's edge
    st.sampled_from([0.0, -0.0, 1e16, -1e16, 9999999999999998.0, 1e15 + 0.5, 5e-324, 1.7976931348623157e308]),
    st.builds(lambda d, k: d / 10**k, st.integers(-(2**53), 2**53), st.integers(1, 18)),  # few decimals
)
commands = st.lists(st.lists(arguments, min_size=1, max_size=8).map(tuple), max_size=6)


@settings(max_examples=400, deadline=None)
@given(commands)
@example([("EVALSHA", "a" * 40, 2, b"t:k+", b"t:k-", "+", 0, "0", 1, 1732800000.25, b"m")])
def test_the_bytes_are_hiredis_bytes(cmds: list[tuple[Any, ...]]) -> None:
    assert resp.pack_commands(cmds) == b"".join(hiredis.pack_command(c) for c in cmds)


def test_scores_are_repr_at_every_edge() -> None:
    """The shortest-digits path (1e-3 <= |v| < 2^53, exact integer arithmetic) against repr on about 1.6
    million values of every shape: full-precision doubles at every binary exponent of the range, a few
    decimals (1..18), the neighbours of each (one ulp away: 16-17 digits), powers of two and their
    neighbours (a narrower lower side), and the range's edges, where repr's own search takes over."""
    rng = random.Random(40)
    values: list[float] = [2.0**53 - 0.5, 2.0**52 + 0.5, 0.001, -0.001, 0.0011, 0.00099, 1e-4, 2.0**-10, 2.0**-9]
    for exp in range(-10, 53):
        values += [2.0**exp, -(2.0**exp), math.nextafter(2.0**exp, 0), math.nextafter(2.0**exp, math.inf)]
        values += [rng.uniform(2.0**exp, 2.0 ** (exp + 1)) for _ in range(8_000)]
    for _ in range(200_000):
        k = rng.randint(1, 18)
        v = rng.randint(-(2**53), 2**53) / 10**k
        if rng.random() < 0.5:
            v = rng.randint(-(10 ** rng.randint(1, 16)), 10 ** rng.randint(1, 16)) / 10**k
        values += [v, math.nextafter(v, math.inf), math.nextafter(v, -math.inf)]
    values += [rng.uniform(-0.01, 0.01) for _ in range(100_000)]
    for v in values:
        assert resp.pack_commands([(v,)]) == hiredis.pack_command((v,)), repr(v)


def test_a_float_subclass_is_sent_as_its_value_and_a_list_is_a_command() -> None:

    class Score(float):
        def __repr__(self) -> str:
            return "not a number Redis reads"

    assert resp.pack_commands([["ZADD", b"k", Score(2.5), "m"]]) == hiredis.pack_command(("ZADD", b"k", 2.5, "m"))
    assert resp.pack_commands([]) == b""


@pytest.mark.parametrize(
    ("cmds", "error", "says"),
    [
        ([("SET", b"k", True)], TypeError, "command 0, argument 2: expected bytes, str, int or float, got bool"),
        ([("GET", b"k"), ("SET", b"k", None)], TypeError, "command 1, argument 2"),
        ([("SET", b"k", bytearray(b"v"))], TypeError, "got bytearray"),
        ([b"GET k"], TypeError, "command 0: expected a tuple or list, got bytes"),
        ([()], ValueError, "command 0 is empty"),
        ("GET", TypeError, "command 0: expected a tuple or list, got str"),
        (7, TypeError, "pack_commands() takes a sequence of commands"),
        ([("SET", "k\udc80")], UnicodeEncodeError, "surrogate"),
    ],
)
def test_what_cannot_be_sent_is_named(cmds: Any, error: type[Exception], says: str) -> None:
    with pytest.raises(error) as raised:
        resp.pack_commands(cmds)
    assert says in str(raised.value)


def test_the_pipelines_pack_with_it() -> None:
    cmds: list[tuple[Any, ...]] = [("ZADD", b"k", math.pi, b"m"), ("GET", "k")]
    assert _pipelines._packed(cmds) == [b"".join(hiredis.pack_command(c) for c in cmds)]
    assert _pipelines._resp is resp
