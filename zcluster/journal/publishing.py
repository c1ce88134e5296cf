"""Asynchronous publishing: a future per message, batched appends, a write barrier, transient retries.

:class:`AsyncPublisher` stamps messages with Gazette UUIDs through the message layer's
:class:`~zcluster.message.producer.Producer`, as the synchronous Publisher does (OUTSIDE_TXN, or
CONTINUE_TXN inside a transaction closed by ACK_TXN intents; the Producer's module docstring states the
clock and ACK rules), queues the frames per journal, and a background thread appends each journal's queue
in batches with ``append_many``.

Guarantees: per journal, frames are appended in the order their publish calls returned, and UUID clocks
increase in that order; each message's future resolves to its byte range, or to the error that made
its batch fail after `retries` retries. A retried batch may have been appended already (the failure was
in the reply): the journal then holds it twice, and read-committed readers drop the second copy by
UUID; a batch never extends past an ACK, so a duplicated batch never replays an older ACK after a
newer one (which would break exactly-once in the sequencer). ``barrier()`` waits until everything
published before it is appended (or failed) and raises the first failure. ``commit()`` appends the
transaction's ACKs after all its messages; ``rollback()`` appends ACKs that roll the open transaction
back (clock of the producer's previous ACK in that journal) and retires the producer id. Transient
errors are the store's (``store.transient_errors``) unless given.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future

from zcluster.journal.store import JournalStore
from zcluster.message.envelope import Message
from zcluster.message.journals import AppendResult
from zcluster.message.mapping import MappingFunc
from zcluster.message.producer import Producer, Stamping
from zcluster.message.uuid import Clock

__all__ = ["AsyncPublisher"]

log = logging.getLogger(__name__)

_Item = tuple[bytes, "Future[AppendResult]", bool]  # frame, its future, whether it is an ACK


class AsyncPublisher(Stamping):
    """Publishes through `store` from a background thread; see the module docstring.

    Use as a context manager or call ``close()`` (which waits for everything queued). Safe for concurrent
    ``publish_committed`` calls; a transaction (``publish_uncommitted`` / ``commit`` / ``rollback``)
    has one writer. `producer` (6 bytes) and `clock` are the Producer's: without a clock, an internal one
    is raised to wall time on every publish; a caller's clock is only ticked. `transient`: the errors
    retried (default: ``store.transient_errors``, the store's network failures and timeouts).
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
        transient: tuple[type[BaseException], ...] | None = None,
    ) -> None:
        if max_batch < 1 or retries < 0 or backoff < 0:
            raise ValueError("max_batch must be positive, retries and backoff non-negative")
        self.store = store
        self._producer = Producer(clock, producer)
        self._max_batch = max_batch
        self._retries = retries
        self._backoff = backoff
        self._transient = store.transient_errors if transient is None else transient
        self._cond = threading.Condition()
        self._queues: dict[str, deque[_Item]] = {}
        self._inflight: list[Future[AppendResult]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="zcluster-async-publisher", daemon=True)
        self._thread.start()

    def __enter__(self) -> AsyncPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publishing ----------------------------------------------------------------------------------

    def publish_committed(self, mapping: MappingFunc, msg: Message) -> Future[AppendResult]:
        """Stamp `msg` OUTSIDE_TXN and queue it; the future resolves to its byte range.

        Raises at once what the message Publisher raises before appending (``msg.validate()``'s errors,
        EmptyPartitionsError, UnknownContentTypeError, TypeError for an unframeable message), and
        RuntimeError once closed."""
        producer = self._producer
        producer.update_clock()
        journal, framing = producer.route(mapping, msg)
        with self._cond:  # Queue order is append order: stamp and queue as one step.
            producer.stamp_committed(msg, journal)
            return self._enqueue(journal, framing.marshal(msg), False)

    def publish_uncommitted(self, mapping: MappingFunc, msg: Message) -> Future[AppendResult]:
        """Stamp `msg` CONTINUE_TXN (part of the open transaction) and queue it."""
        producer = self._producer
        producer.update_clock()
        journal, framing = producer.route(mapping, msg)
        with self._cond:
            producer.stamp_uncommitted(msg, journal, framing)
            return self._enqueue(journal, framing.marshal(msg), False)

    def commit(self) -> list[Future[AppendResult]]:
        """Queue an ACK_TXN per journal of the open transaction (committing it) and start a new one."""
        with self._cond:
            return [self._enqueue(i.journal, i.intent, True) for i in self._producer.commit_intents()]

    def rollback(self) -> list[Future[AppendResult]]:
        """Queue ACKs that roll the open transaction back: each carries the producer's previous ACK clock
        in that journal (its last committed message or transaction ACK there; if none, the clock just below
        the transaction's first message there), so the sequencer discards the open span. The producer id is
        then retired: later messages carry a fresh one, so a late copy of a rolled-back message (a retried
        append landing after the ACK) is never committed by this publisher's next transaction."""
        with self._cond:
            return [self._enqueue(i.journal, i.intent, True) for i in self._producer.rollback_intents()]

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
