"""Which offsets of a positioned source's partition were applied: :class:`zcluster.spark.PositionedSink`'s ledger.

A fence keeps one position per (key, source), so on its own it cannot tell a row below it that was applied
(a replay: a task or batch run again, a new checkpoint directory) from one that never was (a source handing
a later batch lower offsets than an earlier one: Spark's file source orders files by modification time, and
files sharing one tie). The ledger tells them apart, per (application, topic, partition), in a bounded record:

* ``high``: one past the highest offset applied;
* ``holes``: the ranges below ``high`` never applied (offsets a batch skipped over), at most ``max_holes``:
  past that the lowest are forgotten and ``horizon`` rises past them;
* below ``horizon``: offsets taken as applied (a source's real gaps: Kafka's transaction markers, compacted
  records; a hole forgotten). A row arriving there is a replay to the ledger.

So a row is *fresh* (at or above ``high``), *late* (in a hole: never applied) or a *replay* (anything else).

Each application of a partition's rows (one task's share of a batch) is numbered; its *claim* is written
before any of its writes (write-ahead): the ledger after it, and a digest of the offsets it applies. A
*done* mark follows once every write of it is confirmed. A claim without its done mark (its task died, or is
still running as a speculative copy) must be finished before any other application: the next attempt
classifies its rows against the ledger before the claim, and goes on only if that gives the same offsets
(the same batch run again: Spark hands a batch id the same rows); then it applies them again under the same
positions, which the fences de-duplicate. Anything else raises :class:`zcluster.ConfigError` naming the
offsets: applying other rows first could move a fence past rows of the unfinished application.

Records: a sorted set ``<app>/ledger/<prefix>|<topic>/<partition>`` in the
:class:`zcluster.state.StateStore`'s view, scored by application number; the claim and done mark of the last
two applications (older ones forgotten, the key's floor refusing a zombie's late claim). Each claim holds the
holes: with ``max_holes`` 1024 a claim is at most about 40 KB, whatever the partition's age (a source without
gaps keeps none).
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace

from zcluster.errors import ConfigError, PartialWriteError
from zcluster.state.store import StateStore
from zcluster.types import KeyScoreMember

__all__ = ["MAX_HOLES", "NUMBERED", "Ledger", "LedgerState", "Plan", "classify"]

log = logging.getLogger("zcluster.state")

MAX_HOLES = 1024
"""Holes a partition's ledger keeps by default (a hole: a range of offsets below the highest applied, never
applied)."""

NUMBERED = 2**52
"""The first component of a numbered application's positions is ``NUMBERED`` + its number: above every
position of an offset-fenced application (the offset itself, below 2**52), below 2**53."""

_RECORDS = 1000  # a ledger key holds 4 records (a few more after a failed forget): all of them, newest first


@dataclass(frozen=True)
class LedgerState:
    """A partition's ledger after application ``seq`` (0: none yet). ``numbered``: positions are numbered
    (``NUMBERED + seq``, offset, index) since an application that applied late rows; before that, the
    offset-fenced ones ((offset, offset, index)). Holes: sorted, disjoint [start, end) ranges, each within
    [horizon, high)."""

    seq: int = 0
    high: int = 0
    horizon: int = 0
    holes: tuple[tuple[int, int], ...] = ()
    numbered: bool = False

    def kind(self, offset: int) -> str:
        """``fresh``, ``late`` or ``replay`` (see the module)."""
        if offset >= self.high:
            return "fresh"
        if offset < self.horizon:
            return "replay"
        i = bisect.bisect_right(self.holes, (offset, 2**63)) - 1
        return "late" if i >= 0 and self.holes[i][0] <= offset < self.holes[i][1] else "replay"

    def after(self, applied: Sequence[int], max_holes: int = MAX_HOLES) -> LedgerState:
        """The ledger once the sorted, distinct ``applied`` offsets (fresh or late, none a replay) are applied
        (``seq`` unchanged): late offsets split their holes, gaps among fresh ones (from ``high``) are new
        holes; past ``max_holes`` the lowest holes are forgotten, ``horizon`` rising past them."""
        late = [o for o in applied if o < self.high]
        fresh = [o for o in applied if o >= self.high]
        holes: list[tuple[int, int]] = []
        for start, end in self.holes:
            at = start
            for o in late[bisect.bisect_left(late, start) : bisect.bisect_left(late, end)]:
                if o > at:
                    holes.append((at, o))
                at = o + 1
            if at < end:
                holes.append((at, end))
        at = self.high
        for o in fresh:
            if o > at:
                holes.append((at, o))
            at = o + 1
        horizon = self.horizon
        if len(holes) > max_holes:
            horizon = holes[len(holes) - max_holes - 1][1]
            holes = holes[len(holes) - max_holes :]
        return replace(self, high=at, horizon=horizon, holes=tuple(holes))


def classify(state: LedgerState, offsets: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """(fresh, late, replays) of the sorted ``offsets``."""
    out: dict[str, list[int]] = {"fresh": [], "late": [], "replay": []}
    for o in offsets:
        out[state.kind(o)].append(o)
    return out["fresh"], out["late"], out["replay"]


def runs(offsets: Sequence[int], most: int = 8) -> str:
    """Sorted offsets as ranges for an error (``a..b`` inclusive; the first ``most``, then how many more)."""
    spans: list[tuple[int, int]] = []
    for o in offsets:
        if spans and spans[-1][1] == o - 1:
            spans[-1] = (spans[-1][0], o)
        else:
            spans.append((o, o))
    text = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in spans[:most])
    return text + (f" and {len(spans) - most} more ranges" if len(spans) > most else "")


def _digest(offsets: Sequence[int]) -> str:
    return hashlib.blake2b(struct.pack(f">{len(offsets)}q", *offsets), digest_size=12).hexdigest()


@dataclass(frozen=True)
class Plan:
    """What one application of a partition's rows does: ``apply`` (sorted offsets to send), the ``commit``
    position component of each (see :meth:`position`), ``replays`` (skipped: applied before; with offset
    positions they are sent again instead, the fences refusing them), and the claim to mark done (None:
    nothing to claim)."""

    apply: list[int]
    replays: list[int]
    late: list[int]
    state: LedgerState
    claim: KeyScoreMember | None

    def position(self, offset: int) -> int:
        """The first component of the position of ``offset``'s increments (the second is the offset)."""
        return NUMBERED + self.state.seq if self.state.numbered else offset


class Ledger:
    """The ledger of partition ``topic``/``partition`` of application ``state.app`` whose fences are in the keys
    under ``prefix`` (see the module).
    ``late``: ``"fail"`` (a late row raises :class:`zcluster.ConfigError` before anything of the partition's
    rows is written) or ``"apply"`` (late rows are applied once, under numbered positions)."""

    def __init__(
        self,
        state: StateStore,
        topic: str,
        partition: object,
        late: str,
        *,
        prefix: bytes = b"",
        max_holes: int = MAX_HOLES,
    ) -> None:
        self.store, self.app, self.late, self.max_holes = state.cluster, state.app, late, max_holes
        self.name = f"{topic}/{partition}"
        # The fences it stands for are the keys' under ``prefix``: one query name over two prefixes is two ledgers.
        self.key = f"{state.app}/ledger/{prefix.decode(errors='backslashreplace')}|{topic}/{partition}"

    def _records(self) -> tuple[dict[int, list[tuple[LedgerState, str, str]]], set[int]]:
        """Claims by number (the state after each, its digest, its member: two differing claims of one number
        are two batches of the partition at once) and the numbers marked done."""
        claims: dict[int, list[tuple[LedgerState, str, str]]] = {}
        done: set[int] = set()
        for r in self.store.select([self.key], limit=_RECORDS)[self.key]:
            member = r.member if isinstance(r.member, str) else bytes(r.member).decode()  # a view without decode
            parts = member.split("|")
            seq = int(parts[1])
            if parts[0] == "done":
                done.add(seq)
            else:
                high, horizon, numbered = int(parts[2]), int(parts[3]), parts[4] == "1"
                flat = [int(x) for x in parts[6].split(",")] if parts[6] else []
                holes = tuple(zip(flat[::2], flat[1::2], strict=True))
                claims.setdefault(seq, []).append((LedgerState(seq, high, horizon, holes, numbered), parts[5], member))
        return claims, done

    def plan(self, offsets: Sequence[int]) -> Plan:
        """Classify the sorted, distinct ``offsets`` (one batch's rows of the partition) and claim the
        application of the fresh and late ones (written before any of their writes). Raises
        :class:`zcluster.ConfigError`, nothing written: for late rows under ``"fail"``; when an unfinished
        application is not this one run again; when another claim of the same number differs or a later one
        exists (two batches of the partition at once), or the key's floor refused this one."""
        claims, done = self._records()
        last = max(claims, default=0)
        if last and len(claims[last]) > 1:
            raise self._rivals(last)
        if last and last not in done:  # an unfinished application: only the same one may go on
            if last > 1 and last - 1 not in claims:
                raise ConfigError(f"{self._where()}: the ledger lost the record before application {last}")
            before = claims[last - 1][0][0] if last > 1 else LedgerState()
            fresh, late, replays = classify(before, offsets)
            state, digest, member = claims[last][0]
            applied = sorted(fresh + late)
            if _digest(applied) != digest:
                raise ConfigError(
                    f"{self._where()}: an earlier attempt of application {last} (offsets up to {state.high - 1}) "
                    f"did not finish, and this batch is not that application again (it applies {runs(applied)}): "
                    "run the same batch again (the same checkpoint directory) to finish it; applying other rows "
                    "first could let a fence pass rows of the unfinished one"
                )
            claim = KeyScoreMember(self.key, float(last), member)
            return self._planned(applied, replays, late, state, claim)
        state = claims[last][0][0] if last else LedgerState()
        fresh, late, replays = classify(state, offsets)
        if late and self.late == "fail":
            raise ConfigError(
                f"{self._where()}: offsets {runs(late)} ({len(late)} rows) arrived after offsets up to "
                f"{state.high - 1} were applied, and were never applied (the fence is past them): the source "
                "handed a later batch lower offsets than an earlier one (Spark's file source does when files share "
                "a modification time). Nothing of this partition's rows in this batch was written; rows of other "
                "partitions may have been (each exactly once). PositionedSink(..., out_of_order='apply') applies "
                "such rows once"
            )
        applied = sorted(fresh + late)
        if not applied:
            return self._planned([], replays, [], state, None)
        numbered = state.numbered or bool(late)
        after = replace(state.after(applied, self.max_holes), seq=state.seq + 1, numbered=numbered)
        member = "|".join(
            [
                "claim",
                str(after.seq),
                str(after.high),
                str(after.horizon),
                "1" if numbered else "0",
                _digest(applied),
                ",".join(f"{a},{b}" for a, b in after.holes),
            ]
        )
        claim = KeyScoreMember(self.key, float(after.seq), member)
        self.store.insert([claim])
        # Read back: an identical claim is the same application (a speculative copy, a retry): it goes on too.
        claims, _ = self._records()
        if [m for _, _, m in claims.get(after.seq, [])] != [member] or max(claims) > after.seq:
            self.store.delete([claim])  # withdrawn, so that the rival (if it goes on) is the only claim
            raise self._rivals(after.seq)
        return self._planned(applied, replays, late, after, claim)

    def _planned(
        self, applied: list[int], replays: list[int], late: list[int], state: LedgerState, claim: KeyScoreMember | None
    ) -> Plan:
        if not state.numbered:  # offset positions: replays are sent again and fenced, as before the ledger
            applied = sorted(applied + replays)
        return Plan(applied, replays, late, state, claim)

    def finish(self, plan: Plan) -> None:
        """Mark ``plan``'s application done (every write of it confirmed) and forget the records before the
        one it followed."""
        if plan.claim is None:
            return
        seq = plan.state.seq
        self.store.insert([KeyScoreMember(self.key, float(seq), f"done|{seq}")])
        if seq > 1:
            try:
                self.store.forget([self.key], float(seq - 2))
            except PartialWriteError as exc:  # harmless: the newest records rank first; the next finish forgets
                log.warning("ledger %s: forgetting older records failed: %s", self.key, exc)

    def _rivals(self, seq: int) -> ConfigError:
        return ConfigError(
            f"{self._where()}: another application of the partition's rows claimed number {seq} or later at the "
            "same time (two queries running with one query_name?); nothing of this one was written"
        )

    def _where(self) -> str:
        return f"PositionedSink {self.app}, partition {self.name}"
