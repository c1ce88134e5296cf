"""The write plan of a :class:`zcluster.Cluster`: 2P-set writes validated, packed into script calls per
shard, sent, and their replies read back into a :class:`zcluster.WriteResult`.

:class:`WritePlan` is what a Cluster and a :class:`zcluster.farm.Farm` share: the farm prepares a write once
for every replica of the same shape (:meth:`WritePlan.shape`) and sends it through each replica's plan
(:func:`plan_of`). Node calls on a Redis Cluster carry the keys of many slots of one node; a call that stops
at a key its node does not serve (``|NOTLOCAL``, see ``lua/write.lua``) has the rest of its tuples resent one
slot per call.

A standalone server with zcluster's Redis module (:mod:`zcluster._server_module`) gets the calls the module
serves (no bound, no floors, no waits) as ``ZCLUSTER.WRITE``, the same arguments without the script's SHA,
once it answered the client's protocol; a server that answers it as an unknown command (restarted without the
module) or refuses it to the user gets them again as the script (:meth:`Transport.natively`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple, Protocol

from redis.exceptions import NoScriptError, ResponseError

from zcluster._encode import DELETE, INSERT, Encoder
from zcluster._moves import StoreMoved
from zcluster._pipelines import SharedCommands
from zcluster._scripts import Script
from zcluster._topology import Shard, StandaloneTopology
from zcluster._transport import Transport
from zcluster.errors import InvalidTupleError, ShardError, WriteRefusedError
from zcluster.types import Delete, Durability, Insert, ShardFailure, WriteResult

Ops = list[tuple[bytes, Sequence[Any], list[int] | None]]
"""Writes by kind: (the script's op, the tuples, their indices in the caller's call or None for 0..n-1)."""

Report = Callable[..., None]
_INSERT: Final = Insert
_DELETE: Final = Delete


def inserts(items: Sequence[Any]) -> Ops:
    return [(INSERT, items, None)]


def deletes(items: Sequence[Any]) -> Ops:
    return [(DELETE, items, None)]


def split(items: Sequence[Any]) -> Ops:
    """:class:`Insert` and :class:`Delete` writes of one call as ops (the caller's indices kept);
    anything else is :class:`InvalidTupleError` naming it, before anything is sent."""
    # By index over a list, the types as Final globals: compiled (zcluster._native), an item of a Sequence is
    # a generic lookup, enumerate makes a tuple per item, and an imported name is a dict lookup at each use.
    seq: list[Any] = items if type(items) is list else list(items)
    n = len(seq)
    first = type(seq[0]) if n else _INSERT
    if first is _INSERT or first is _DELETE:  # a call of one kind (the commonest) needs no sorting
        same = 1
        while same < n and type(seq[same]) is first:
            same += 1
        if same == n:
            return (
                [(INSERT, items, None), (DELETE, [], [])]
                if first is _INSERT
                else [(INSERT, [], []), (DELETE, items, None)]
            )
    ins: list[Any] = []
    ins_at: list[int] = []
    dels: list[Any] = []
    dels_at: list[int] = []
    for i in range(n):
        w = seq[i]
        kind = type(w)
        if kind is _INSERT or (kind is not _DELETE and isinstance(w, Insert)):
            ins.append(w)
            ins_at.append(i)
        elif kind is _DELETE or isinstance(w, Delete):
            dels.append(w)
            dels_at.append(i)
        else:
            raise InvalidTupleError(i, w, "expected an Insert or a Delete")
    return [(INSERT, ins, ins_at), (DELETE, dels, dels_at)]


class Prepared(NamedTuple):
    """Writes packed for one topology: script calls per shard index, and the caller's indices per call."""

    commands: dict[int, SharedCommands]
    indices: dict[int, list[list[int]]]


class WritePlan:
    """Packs and sends one Cluster's writes (its layout, bound, floors, batch size and durability);
    ``report`` is the Cluster's event reporter."""

    def __init__(
        self,
        transport: Transport,
        encoder: Encoder,
        write_script: Script,
        node_script: Script,
        max_size: int | None,
        durability: Durability | None,
        report: Report,
    ) -> None:
        self.transport, self.encoder, self.report = transport, encoder, report
        self.write_sha, self.node_script = write_script.sha, node_script
        self.max_size = max_size
        # A call its waits follow is marked for the script (op "+!" / "-!"): one that took no tuple then writes
        # a record again as it is, so that the waits cover an earlier attempt's writes (lua/write.lua, "Waits").
        self.waited = durability is not None and bool(durability.local_aof or durability.replicas)

        # the calls the module serves (zcluster/_server_module.py): no bound, no floors (mode "0"), no waits;
        # node calls exist only on a Redis Cluster
        self.native = isinstance(transport.topology, StandaloneTopology) and not (
            max_size or encoder.floors or self.waited
        )
        sha = self.write_sha

        def writer(shard: Shard, commands: list[tuple[Any, ...]]) -> list[Any]:
            if self.native:
                return transport.natively(shard, commands, sha, durability)
            return transport.writes(shard, commands, durability)

        self.writer = writer  # each shard's write pipeline, then its durability waits on that connection

    def write(self, name: str, ops: Ops, n: int) -> WriteResult:
        """Prepare and send ``ops``; reported, not raised (a bad tuple raises before anything is sent)."""
        started = time.perf_counter()
        try:
            prepared = self.prepare(ops)
        except BaseException as exc:
            self.report(name, n, started, error=exc)
            raise
        return self.send(name, ops, prepared, n, started)

    def shape(self) -> tuple[Any, ...] | None:
        """Equal for plans whose :meth:`prepare` output is interchangeable; None when it never is (a Redis
        Cluster routes by a slot map that changes)."""
        topology = self.transport.topology
        if not isinstance(topology, StandaloneTopology):
            return None
        enc = self.encoder
        return (
            len(topology.shards),
            topology.routing,
            enc.layout.prefix,
            self.max_size,
            enc.floors,
            enc.batch_size,
            self.waited,  # the op's "!" (lua/write.lua, "Waits"): a plan with waits must not send calls without
            # which shards take ZCLUSTER.WRITE, as known so far: a replica that differs from what its calls were
            # made for falls back (Transport.natively), or writes by the script
            tuple(self.transport.native_writes(s) for s in topology.shards) if self.native else None,
        )

    def prepare(self, ops: Ops, per_slot: bool = False) -> Prepared:
        """Validate and pack writes into script calls per shard (raises InvalidTupleError, nothing sent).

        On a Redis Cluster, writes go one call per node for keys of many slots (the write script's "k"/"K"
        modes) rather than one call per slot, where spread keys would make a call per tuple or two; unless
        ``per_slot``, or a server refused the script that allows it.
        """
        node_calls = not per_slot and self.node_script.name not in self.transport.refused
        commands: dict[int, SharedCommands] = {}
        index_lists: dict[int, list[list[int]]] = {}
        sha, node_sha = self.write_sha, self.node_script.sha
        floors = self.encoder.floors
        bound, flag, inline = self.max_size or 0, b"1" if floors else b"0", b"K" if floors else b"k"
        shards = self.transport.topology.shards
        for op, items, indices in ops:
            if self.waited:
                op += b"!"
            for shard_idx, calls in self.encoder.writes(items, indices, node_calls).items():
                # the module's command takes the script's arguments after the SHA (zcluster._server_module)
                head = (
                    ("ZCLUSTER.WRITE",)
                    if self.native and self.transport.native_writes(shards[shard_idx])
                    else ("EVALSHA", sha)
                )
                commands.setdefault(shard_idx, SharedCommands()).extend(
                    ("EVALSHA", node_sha, 0, op, bound, inline, c.singles, *c.argv, *c.more_argv)
                    if c.inline
                    else (
                        *head,
                        len(c.keys) + len(c.more_keys),
                        *c.keys,
                        *c.more_keys,
                        op,
                        bound,
                        flag,
                        c.singles,
                        *c.argv,
                        *c.more_argv,
                    )
                    for c in calls
                )
                index_lists.setdefault(shard_idx, []).extend(c.indices + c.more_indices for c in calls)
        return Prepared(commands, index_lists)

    def send(self, name: str, ops: Ops, prepared: Prepared, n: int, started: float) -> WriteResult:
        """Send ``prepared`` (the packed ``ops``) and read the replies into a WriteResult (reported)."""
        applied = [False] * n
        failures: list[ShardFailure] = []
        refused: dict[int, str] = {}
        try:
            outcome = self.transport.fanout(prepared.commands, self.writer)
            resend = self._collect(prepared, outcome, applied, failures, can_resend=True, refused=refused)
            if resend:
                # Tuples a node call did not get to (a key the node does not serve: a stale slot map or a
                # slot mid-migration; or a server without the node script): a slot per call, where MOVED
                # and ASK redirect each call as usual.
                try:
                    again = self.prepare(_subset(ops, resend), per_slot=True)
                except ShardError as exc:  # a slot no node serves: those tuples fail, the others stand
                    failures.append(ShardFailure("routing", exc, tuple(sorted(resend))))
                else:
                    outcome = self.transport.fanout(again.commands, self.writer)
                    self._collect(again, outcome, applied, failures, can_resend=False, refused=refused)
        except StoreMoved:
            raise  # not the call's outcome: it is sent again where the store moved, and reported there
        except BaseException as exc:
            self.report(name, n, started, error=exc)
            raise
        if refused:
            failures.append(refusal(refused, ops, n, applied, failures))
        result = WriteResult(applied, failures)
        self.report(name, n, started, result.applied_count, [f.shard for f in failures])
        return result

    def _collect(
        self,
        prepared: Prepared,
        outcome: dict[int, list[Any] | BaseException],
        applied: list[bool],
        failures: list[ShardFailure],
        can_resend: bool,
        refused: dict[int, str],
    ) -> set[int]:
        """Fold one round of replies into ``applied``, ``failures`` and ``refused`` (index -> why); with
        ``can_resend``, returns the indices of the tuples calls did not get to, to resend one slot per call."""
        resend: set[int] = set()
        for shard_idx, res in outcome.items():
            shard = self.transport.topology.shards[shard_idx].name
            index_lists = prepared.indices[shard_idx]
            if isinstance(res, BaseException):
                failures.append(ShardFailure(shard, res, tuple(i for idx in index_lists for i in idx)))
                continue
            bad: list[int] = []
            first_error: BaseException | None = None
            for indices, reply in zip(index_lists, res, strict=True):
                if isinstance(reply, BaseException):
                    if can_resend and isinstance(reply, NoScriptError):  # the server lacks the node script
                        resend.update(indices)
                        continue
                    bad.extend(indices)
                    first_error = first_error or reply
                    continue
                cut = reply.find(b"|")
                if cut >= len(indices):
                    raise ValueError(f"the write script stopped past its {len(indices)} tuples: {reply[:200]!r}")
                if cut >= 0 and reply.startswith(b"|WRONGTYPE", cut):  # a key of another kind (an aggregate)
                    refused[indices[cut]] = "its key is an aggregate (sums or counters) key, not a 2P-set"
                    rest = indices[cut + 1 :]
                    if can_resend:
                        resend.update(rest)
                    else:
                        bad.extend(rest)
                        first_error = first_error or ResponseError("not sent: its call stopped at a refused write")
                    indices, reply = indices[:cut], reply[:cut]
                elif cut >= 0:  # a node call stopped at a key its node does not serve (see lua/write.lua)
                    rest = indices[cut:]
                    if can_resend:
                        resend.update(rest)
                    else:
                        bad.extend(rest)
                        first_error = first_error or ResponseError(reply[cut + 1 :].decode(errors="replace"))
                    indices, reply = indices[:cut], reply[:cut]
                verdicts: bytes = reply
                if len(verdicts) != len(indices):
                    raise ValueError(f"the write script gave {len(verdicts)} verdicts for {len(indices)} tuples")
                for k in range(len(indices)):  # by index: compiled (zcluster._native), zip makes a tuple per item
                    applied[indices[k]] = verdicts[k] == 49  # b"1"
            if first_error is not None:
                failures.append(ShardFailure(shard, first_error, tuple(bad)))
        return resend


class _Planned(Protocol):
    def _live(self) -> Any: ...


REFUSED = "refused"
"""The ``shard`` of the :class:`ShardFailure` that lists the writes a server refused for good (its error is a
:class:`WriteRefusedError`): not a shard's failure, and resending them cannot help."""


def refusal(
    refused: dict[int, str], ops: Ops, n: int, applied: list[bool], failures: list[ShardFailure]
) -> ShardFailure:
    """The failure listing ``refused`` (index -> why), its error naming the first of them."""
    first = min(refused)
    value = next(
        (
            items[j]
            for _, items, indices in ops
            for j in range(len(items))
            if (j if indices is None else indices[j]) == first
        ),
        None,
    )
    error = WriteRefusedError(first, value, refused[first], dict(refused), WriteResult(list(applied), list(failures)))
    return ShardFailure(REFUSED, error, tuple(sorted(refused)))


def plan_of(cluster: _Planned) -> WritePlan:
    """The write plan of a :class:`zcluster.Cluster` (what a Farm prepares and sends its replicas' writes
    through): its newest incarnation's, when a migration moved its store."""
    return cluster._live()._plan  # type: ignore[no-any-return]


def _subset(ops: Ops, wanted: set[int]) -> Ops:
    """The writes of ``ops`` whose caller indices are in ``wanted``, with those indices."""
    out: Ops = []
    for op, items, indices in ops:
        keep = [j for j in range(len(items)) if (j if indices is None else indices[j]) in wanted]
        out.append((op, [items[j] for j in keep], [j if indices is None else indices[j] for j in keep]))
    return out
