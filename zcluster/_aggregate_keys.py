"""An aggregate key as a whole (``lua/aggregate.lua``): its kind and fences read to compare replicas, its whole
state dumped from one replica and put in place of another's copy (a farm's repair of increments, see
:mod:`zcluster.farm._aggregates`). The fences' format is :mod:`zcluster._aggregates`'."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from zcluster._encode import Encoder
from zcluster._scripts import Script
from zcluster._transport import Transport, read
from zcluster.types import Blob, Durability, Fence, ReadResult, from_bytes

if TYPE_CHECKING:
    from zcluster.cluster import Cluster


FENCE = b"\x00zc|"
"""The prefix of a one-key counters key's fence fields (``FENCE + source`` in its totals hash, see
``lua/incr.lua``): refused as the start of a counter's field, so that no field is taken for a fence."""


def counters_of(fields: Any) -> Any:
    """A counters key's ``HGETALL`` (a dict, or (field, value) pairs) without its fence fields."""
    pairs = fields.items() if isinstance(fields, dict) else fields
    return [(f, v) for f, v in pairs if not f.startswith(FENCE)]


KIND_NAMES = {
    "s": "a sums (Incr) aggregate key",
    "c": "a counters (Count) aggregate key",
    "a": "an aggregate key (fences whose totals expired)",
}
"""How a refusal names an aggregate key's kind (``lua/aggregate.lua``'s and ``lua/forget.lua``'s letters)."""


class KeyState(NamedTuple):
    """One aggregate key's state on one cluster (``lua/aggregate.lua``): ``kind`` ("" nothing, "2" a 2P-set,
    "s" sums, "c" counters, "a" fences whose totals expired), its fences as the server's canonical text
    (``canon``, compared as is) and parsed; with a dump, its totals (flat pairs) and milliseconds to live."""

    kind: str
    canon: bytes
    fences: dict[bytes, Fence]
    totals: list[bytes] | None = None
    pttl: int = -1

    @property
    def aggregate(self) -> bool:
        return self.kind in ("s", "c", "a")


def parse_canon(canon: bytes) -> dict[bytes, Fence]:
    """The fences of ``lua/aggregate.lua``'s canonical text (``<length>:<source>=<c:m:j[:n]>\n`` each)."""
    out: dict[bytes, Fence] = {}
    at = 0
    while at < len(canon):
        colon = canon.index(b":", at)
        size = int(canon[at:colon])
        source = canon[colon + 1 : colon + 1 + size]
        end = canon.index(b"\n", colon + 2 + size)
        parts = [int(p) for p in canon[colon + 2 + size : end].split(b":")]
        out[source] = Fence((parts[0], parts[1], parts[2]), parts[3] if len(parts) > 3 else 0)
        at = end + 1
    return out


class WholeKeys:
    """Reads and replaces one Cluster's aggregate keys whole (its layout, routing, durability)."""

    def __init__(self, transport: Transport, encoder: Encoder, script: Script, durability: Durability | None) -> None:
        self.transport, self.encoder, self.sha, self.durability = transport, encoder, script.sha, durability

    def states(self, keys: Sequence[Blob], *, dump: bool = False) -> ReadResult[Blob, KeyState]:
        """Each key's :class:`KeyState` (with its totals if ``dump``); a failed shard's keys in ``errors``."""
        encoded = self.encoder.keys(keys)
        layout, sha, mode = self.encoder.layout, self.sha, "dump" if dump else "state"

        def parse(key: Blob, replies: list[Any]) -> KeyState:
            kind, canon = from_bytes(replies[0][0]), bytes(replies[0][1])
            if not dump:
                return KeyState(kind, canon, parse_canon(canon))
            return KeyState(kind, canon, parse_canon(canon), list(replies[0][2]), int(replies[0][3]))

        return read(
            self.transport,
            keys,
            encoded,
            lambda kb, _: [("EVALSHA", sha, 2, *layout.script_keys(kb, False), mode)],
            parse,
        )

    def restore(self, key: Blob, expected: bytes, state: KeyState) -> bool:
        """Replace ``key`` with ``state`` (a dump of another copy) if it still holds the fences ``expected``
        and is no 2P-set: True; False if it moved since it was read. Shard failures raise."""
        assert state.totals is not None and state.kind in ("s", "c", "a")
        fences = [
            x
            for source, f in state.fences.items()
            for x in (source, f"{f.position[0]}:{f.position[1]}:{f.position[2]}:{f.held}")
        ]
        ((shard_idx, kb),) = self.encoder.keys([key])
        rkeys = self.encoder.layout.script_keys(kb, False)
        kind = "c" if state.kind == "c" else "s"
        command = ("EVALSHA", self.sha, 2, *rkeys, "restore", expected, kind, state.pttl, len(state.fences))
        shard = self.transport.topology.shards[shard_idx]
        (reply,) = self.transport.writes(shard, [(*command, *fences, *state.totals)], self.durability)
        if isinstance(reply, BaseException):
            raise reply
        return int(reply) == 1


def whole_keys_of(cluster: Cluster) -> WholeKeys:
    """A :class:`zcluster.Cluster`'s :class:`WholeKeys` (what a Farm reads, dumps and restores replicas'
    aggregate keys through)."""
    return cluster._whole
