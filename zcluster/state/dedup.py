"""Message de-duplication for at-least-once consumers outside Spark."""

from __future__ import annotations

from collections.abc import Sequence

from zcluster.errors import InvalidTupleError
from zcluster.message.uuid import ZERO_UUID, get_clock, parse_uuid
from zcluster.state.clocks import clock_to_score
from zcluster.types import Store


def _checked(i: int, journal: object, uuid: object) -> tuple[str, bytes]:
    """(journal, 16 UUID bytes) of message ``i``, or :class:`InvalidTupleError` naming it."""
    if not isinstance(journal, str) or not journal:
        raise InvalidTupleError(i, (journal, uuid), "journal must be a non-empty str")
    if isinstance(uuid, str):
        try:
            return journal, parse_uuid(uuid)
        except ValueError as exc:
            raise InvalidTupleError(i, (journal, uuid), f"not a UUID: {exc}") from None
    if isinstance(uuid, bytes | bytearray | memoryview):
        raw = bytes(uuid)
        if len(raw) == 16:
            return journal, raw
        raise InvalidTupleError(i, (journal, uuid), f"a UUID is 16 bytes, got {len(raw)}")
    raise InvalidTupleError(i, (journal, uuid), f"uuid must be str or bytes, not {type(uuid).__name__}")


class DedupStore:
    """Admits each message UUID exactly once per journal, across threads, processes and machines.

    ``admit(journal, uuid)`` is True for exactly one call per (journal, UUID), however many callers race:
    the decision is one atomic insert of (``dedup/<journal>``, clock, UUID) by the 2P-set script, which
    reports it as applied only the first time. All-zero UUIDs opt out of tracking and are always admitted
    (Gazette's convention). ``prune(journal, clock)`` forgets UUIDs with clocks at or below ``clock``;
    afterwards such old messages are refused (reported as duplicates), never admitted twice.

    Errors: a journal that is not a non-empty str, or a UUID that is not 16 bytes or its string form,
    raises :class:`zcluster.InvalidTupleError` naming its position before anything is sent. An unreachable
    shard raises :class:`zcluster.PartialWriteError`; a call that raised may or may not have admitted its
    messages, so retrying it can report a message as a duplicate that this caller admitted (at-most-once
    for that caller's retry; never twice overall).
    """

    def __init__(self, cluster: Store, namespace: str = "zcdedup:") -> None:
        self.cluster = cluster.view(namespace, floors=True)

    @staticmethod
    def key(journal: str) -> str:
        return f"dedup/{journal}"

    def admit(self, journal: str, uuid: bytes | str) -> bool:
        """True exactly once per (journal, UUID)."""
        return self.admit_many([(journal, uuid)])[0]

    def admit_many(self, messages: Sequence[tuple[str, bytes | str]]) -> list[bool]:
        """The bulk form of :meth:`admit`: one verdict per message, in order, in one batched write.

        A UUID repeated within the call is admitted at its first position only.
        """
        verdicts = [True] * len(messages)
        tuples, positions = [], []
        checked = [_checked(i, journal, uuid) for i, (journal, uuid) in enumerate(messages)]
        for i, (journal, raw) in enumerate(checked):
            if raw == ZERO_UUID:
                continue
            tuples.append((self.key(journal), clock_to_score(get_clock(raw)), raw))
            positions.append(i)
        applied = self.cluster.insert(tuples).applied
        for pos, ok in zip(positions, applied, strict=True):
            verdicts[pos] = ok
        return verdicts

    def prune(self, journal: str, clock: int) -> int:
        """Forget UUIDs of ``journal`` with clocks <= ``clock``; later arrivals that old are refused."""
        return self.cluster.forget([self.key(journal)], clock_to_score(clock))
