"""How the encoder packs writes into write-script calls (zcluster._encode.Encoder.writes), read back from the
calls themselves: every tuple once, in ARGV order as the indices say, a key's tuples in the caller's order
(all in one call when they are at most the batch size: Cluster's atomicity), no call over the batch size,
and each call's one-tuple keys at its head without their count (Call.singles: the script's ARGV[4]), with
keys declared or inline."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from zcluster._encode import Call, Encoder
from zcluster._keys import KeyLayout


class _Shards:
    """A topology of ``n`` shards, a key's shard by its last byte (Encoder asks nothing more)."""

    def __init__(self, n: int, single_slot_calls: bool) -> None:
        self.shards: list[Any] = [object()] * n
        self.single_slot_calls = single_slot_calls

    def shard_of(self, key: bytes, slot: int) -> int:
        return key[-1] % len(self.shards)


def _tuples(call: Call, layout: KeyLayout, stride: int) -> list[tuple[bytes, Any, bytes, bool]]:
    """(key, score, member, sent without a count) of each tuple of ``call``, in ARGV order."""
    argv, keys = [*call.argv, *call.more_argv], [*call.keys, *call.more_keys]
    out: list[tuple[bytes, Any, bytes, bool]] = []
    pos = group = 0
    while pos < len(argv):
        if call.inline:
            names, pos = argv[pos : pos + stride], pos + stride
        else:
            names = keys[group * stride : (group + 1) * stride]
        single = group < call.singles
        count = 1 if single else int(argv[pos])
        first = pos if single else pos + 1
        logical = layout.logical(names[0])
        assert logical is not None and logical[1] == b"}+"
        assert list(names) == list(layout.script_keys(logical[0], stride == 3))
        for j in range(first, first + 2 * count, 2):
            out.append((logical[0], argv[j], argv[j + 1], single))
        pos, group = first + 2 * count, group + 1
    assert group == (len(keys) // stride if not call.inline else group)
    return out


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f", b"g"]), min_size=1, max_size=40),
    size=st.integers(1, 7),
    shards=st.integers(1, 3),
    floors=st.booleans(),
    inline=st.booleans(),
)
def test_calls_hold_every_tuple_once_in_order_with_one_tuple_keys_first(
    keys: list[bytes], size: int, shards: int, floors: bool, inline: bool
) -> None:
    layout = KeyLayout("t:")
    encoder = Encoder(layout, _Shards(shards, inline), floors, size)  # type: ignore[arg-type]
    items = [(k, float(i), b"m%d" % i) for i, k in enumerate(keys)]
    positions = [100 + i for i in range(len(items))]
    per_shard = encoder.writes(items, positions, node_calls=inline)
    seen: list[int] = []
    alone = {k for k in keys if keys.count(k) == 1}  # keys of one tuple in the whole write
    for shard, calls in per_shard.items():
        for call in calls:
            assert call.inline == inline and (call.keys == [] and call.more_keys == [] if inline else True)
            order = call.indices + call.more_indices
            assert 1 <= len(order) <= size and call.singles == len(call.indices)
            got = _tuples(call, layout, 3 if floors else 2)
            assert len(got) == len(order)
            for (key, score, member, single), index in zip(got, order, strict=True):
                assert (key, score, member) == items[index - 100] and key[-1] % shards == shard
                assert single == (key in alone)  # one-tuple keys, and only they, come without a count
            seen += order
    assert sorted(seen) == positions
    for key in set(keys):  # a key's tuples keep the caller's order, across calls too
        mine = [i for i in seen if items[i - 100][0] == key]
        assert mine == sorted(mine)
        holding = [c for calls in per_shard.values() for c in calls if set(c.indices + c.more_indices) & set(mine)]
        if len(mine) <= size:  # all in one call: applied together (Cluster's atomicity)
            assert len(holding) == 1
        else:  # run on over full calls, but the last
            assert len(holding) == -(-len(mine) // size) or len(holding) == -(-len(mine) // size) + 1
