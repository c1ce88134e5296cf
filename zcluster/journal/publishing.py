"""Asynchronous publishing: a future per message, batched appends, a write barrier, transient retries.

:class:`AsyncPublisher` stamps messages with Gazette UUIDs exactly as the message layer's Publisher
does (OUTSIDE_TXN, or CONTINUE_TXN inside a transaction closed by ACK_TXN intents), queues the frames
per journal, and a background thread appends each journal's queue in batches with ``append_many``.

Guarantees: per journal, frames are appended in the order their publish calls returned, and UUID clocks
increase in that order; each message's future resolves to its byte range, or to the error that made
its batch fail after `retries` retries. A retried batch may have been appended already (the failure was
in the reply): the journal then holds it twice, and read-committed readers drop the second copy by
UUID; a batch never extends past an ACK, so a duplicated batch never replays an older ACK after a
newer one (which would break exactly-once in the sequencer). ``barrier()`` waits until everything
published before it is appended (or failed) and raises the first failure. ``commit()`` appends the
transaction's ACKs after all its messages; ``rollback()`` appends ACKs that roll the open transaction
back (clock of the producer's previous ACK in that journal).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import redis

from zcluster.journal.store import JournalStore
from zcluster.message.framing import Framing
from zcluster.message.journals import AppendResult
from zcluster.message.mapping import MappingFunc
from zcluster.message.publisher import route
from zcluster.message.uuid import Clock, Flags, ProducerID, build_uuid, get_clock, new_producer_id

__all__ = ["TRANSIENT_ERRORS", "AsyncPublisher"]

log = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    redis.ConnectionError,
    redis.TimeoutError,
)
"""Errors retried by default: network failures and timeouts (the append may or may not have happened)."""

_Item = tuple[bytes, "Future[AppendResult]", bool]  # frame, its future, whether it is an ACK


class AsyncPublisher:
    """Publishes through `store` from a background thread; see the module docstring.

    Use as a context manager or call ``close()`` (which waits for everything queued). Safe for concurrent
    ``publish_committed`` calls; a transaction (``publish_uncommitted`` / ``commit`` / ``rollback``)
    has one writer.
    """

    def __init__(
        self,
        store: JournalStore,
        *,
        producer: bytes | None = None,
        clock: Clock | None = None,
        max_batch: int = 1024,
        retries: int = 5,
        backoff: float = 0.01,
        transient: tuple[type[BaseException], ...] = TRANSIENT_ERRORS,
    ) -> None:
        if max_batch < 1 or retries < 0 or backoff < 0:
            raise ValueError("max_batch must be positive, retries and backoff non-negative")
        self.store = store
        self.producer = ProducerID(producer) if producer is not None else new_producer_id()
        self.clock = clock or Clock()
        self._max_batch = max_batch
        self._retries = retries
        self._backoff = backoff
        self._transient = transient
        self._cond = threading.Condition()
        self._queues: dict[str, deque[_Item]] = {}
        self._inflight: list[Future[AppendResult]] = []
        self._closed = False
        self._txn: dict[str, tuple[Any, Framing]] = {}
        self._last_ack: dict[str, int] = {}
        self._thread = threading.Thread(target=self._loop, name="zcluster-async-publisher", daemon=True)
        self._thread.start()

    def __enter__(self) -> AsyncPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publishing ----------------------------------------------------------------------------------

    def publish_committed(self, mapping: MappingFunc, msg: Any) -> Future[AppendResult]:
        """Stamp `msg` OUTSIDE_TXN and queue it; the future resolves to its byte range."""
        return self._publish(mapping, msg, Flags.OUTSIDE_TXN)[1]

    def publish_uncommitted(self, mapping: MappingFunc, msg: Any) -> Future[AppendResult]:
        """Stamp `msg` CONTINUE_TXN (part of the open transaction) and queue it."""
        journal, fut, framing = self._publish(mapping, msg, Flags.CONTINUE_TXN)
        if journal not in self._txn:
            self._txn[journal] = (msg.new_acknowledgement(journal), framing)
            # Without an earlier ACK here, a rollback ACKs just below the span (where a sequencer that first
            # meets this producer puts its last ACK), not below every clock: that would read as a reset.
            self._last_ack.setdefault(journal, get_clock(msg.get_uuid()) - 1)
        return fut

    def commit(self) -> list[Future[AppendResult]]:
        """Queue an ACK_TXN per journal of the open transaction (committing it) and start a new one."""
        return self._close_txn(rollback=False)

    def rollback(self) -> list[Future[AppendResult]]:
        """Queue ACKs that roll the open transaction back: each carries the producer's previous ACK clock
        in that journal (its last committed message or transaction ACK there; if none, the clock just below
        the transaction's first message there), so the sequencer discards the open span."""
        return self._close_txn(rollback=True)

    def _close_txn(self, rollback: bool) -> list[Future[AppendResult]]:
        out = []
        with self._cond:
            for journal, (ack, framing) in self._txn.items():
                clock = self._last_ack[journal] if rollback else self.clock.tick()
                ack.set_uuid(build_uuid(self.producer, clock, Flags.ACK_TXN))
                if not rollback:
                    self._last_ack[journal] = clock
                out.append(self._enqueue(journal, framing.marshal(ack), True))
            self._txn.clear()
        return out

    def _publish(self, mapping: MappingFunc, msg: Any, flags: int) -> tuple[str, Future[AppendResult], Framing]:
        self.clock.update(time.time_ns())
        journal, framing = route(mapping, msg)
        with self._cond:
            clock = self.clock.tick()
            msg.set_uuid(build_uuid(self.producer, clock, flags))
            if flags == Flags.OUTSIDE_TXN:
                # A committed message acknowledges itself: a later rollback ACK must not go below it, or
                # the sequencer reads a reset (ACK below the last ACK) and exactly-once is lost.
                self._last_ack[journal] = clock
            return journal, self._enqueue(journal, framing.marshal(msg), False), framing

    def _enqueue(self, journal: str, data: bytes, is_ack: bool) -> Future[AppendResult]:
        if self._closed:
            raise RuntimeError("AsyncPublisher is closed")
        fut: Future[AppendResult] = Future()
        self._queues.setdefault(journal, deque()).append((data, fut, is_ack))
        self._inflight.append(fut)
        self._cond.notify_all()
        return fut

    # -- barrier and shutdown ------------------------------------------------------------------------

    def barrier(self, timeout: float | None = None) -> None:
        """Wait until every message published before this call is appended or failed; raise the first
        failure (TimeoutError if `timeout` passes first). Later publishes are not waited for."""
        with self._cond:
            pending, self._inflight = self._inflight, []
        deadline = None if timeout is None else time.monotonic() + timeout
        for fut in pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            fut.exception(remaining)
        for fut in pending:
            exc = fut.exception()
            if exc is not None:
                raise exc

    def close(self) -> None:
        """Stop accepting messages, append everything queued, stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    # -- background appends --------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not any(self._queues.values()) and not self._closed:
                    self._cond.wait()
                if not any(self._queues.values()):
                    return
                work = []
                for journal, q in self._queues.items():
                    if q:
                        work.append((journal, self._take(q)))
            for journal, items in work:
                self._append(journal, items)

    def _take(self, q: deque[_Item]) -> list[_Item]:
        # A batch ends at an ACK: if a retry duplicates the batch, the copy then holds at most one ACK, at
        # its end, equal to the producer's last ACK, which the sequencer reads as an empty rollback. Two
        # ACKs in one duplicated batch would replay an older ACK after a newer one and re-open a span.
        batch: list[_Item] = []
        while q and len(batch) < self._max_batch:
            batch.append(q.popleft())
            if batch[-1][2]:
                break
        return batch

    def _append(self, journal: str, items: Sequence[_Item]) -> None:
        datas = [d for d, _, _ in items]
        attempt = 0
        while True:
            try:
                results = self.store.append_many(journal, datas)
            except self._transient as exc:
                if attempt >= self._retries:
                    for _, fut, _ in items:
                        fut.set_exception(exc)
                    return
                attempt += 1
                log.warning("append of %d messages to %r failed (%r); retry %d", len(items), journal, exc, attempt)
                time.sleep(self._backoff * attempt)
            except BaseException as exc:
                for _, fut, _ in items:
                    fut.set_exception(exc)
                return
            else:
                for (_, fut, _), r in zip(items, results, strict=True):
                    fut.set_result(r)
                return
