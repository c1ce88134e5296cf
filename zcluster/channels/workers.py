"""A worker-pool consumer: channels of one consumer group, dispatched to handlers by worker threads.

Each channel is owned by one worker (channel i by worker i mod n), so a channel's messages are handled
in order, one at a time. For each message: dispatch; on success acknowledge it (the group's durable
position moves past it). On a handler error the message is not acknowledged: the channel is nacked and
the message redelivered, up to `max_attempts` attempts; then it goes to the dead-letter journal and is
acknowledged. Unknown or undecodable messages (a record that names no kind among them), and commands
without a handler, are dead-lettered at once (retrying cannot help); nothing is dropped silently. ACK
messages of transactions are acknowledged without dispatch and counted in ``acks``.

Graceful shutdown (``stop()``, or SIGTERM/SIGINT after ``install_signal_handlers()``): a worker finishes
the message in hand (handlers, follow-ups, acknowledgement) and stops; messages it consumed but did not
start are left unacknowledged and are redelivered to the next consumer. A message is never acknowledged
half-processed. Attempt counts live in memory: after a restart a failing message gets `max_attempts`
fresh attempts (delivery stays at-least-once).
"""

from __future__ import annotations

import base64
import json
import logging
import signal
import threading
from collections.abc import Sequence
from types import FrameType

from zcluster.channels.channels import Channels
from zcluster.channels.dispatch import Dispatcher
from zcluster.channels.typed import TypedMessage
from zcluster.errors import NoHandlerError, UndecodableMessageError
from zcluster.message.envelope import Envelope
from zcluster.message.errors import FramingError

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)


class WorkerPool:
    """Consume `channels` in `group` with `workers` threads, dispatching through `dispatcher`.

    `dead_letter`: an existing ndjson journal in the same store; each dead letter is one JSON line with
    the source journal, byte range, UUID, attempts, error and the original frame (base64).
    """

    def __init__(
        self,
        chans: Channels,
        group: str,
        channels: Sequence[str],
        dispatcher: Dispatcher,
        *,
        dead_letter: str,
        workers: int = 2,
        batch: int = 64,
        max_attempts: int = 3,
        poll_interval: float = 0.05,
    ) -> None:
        if workers < 1 or batch < 1 or max_attempts < 1:
            raise ValueError("workers, batch and max_attempts must be positive")
        chans.store.info(dead_letter)  # JournalNotFoundError now, not at the first failure
        self.chans = chans
        self.group = group
        self.dispatcher = dispatcher
        self.dead_letter = dead_letter
        self._batch = batch
        self._max = max_attempts
        self._poll = poll_interval
        self._stop = threading.Event()
        self._owned = [list(channels[i::workers]) for i in range(workers)]
        self._threads = [
            threading.Thread(target=self._run, args=(owned,), name=f"zcluster-worker-{i}", daemon=True)
            for i, owned in enumerate(self._owned)
        ]
        self._attempts: dict[tuple[str, int], int] = {}
        self._count_lock = threading.Lock()
        self.handled = 0
        """Messages whose handlers all succeeded (an event nobody subscribed to counts: it needed nothing)."""
        self.dead_lettered = 0
        """Messages written to the dead-letter journal, each logged at ERROR with its reason."""
        self.acks = 0
        """Transaction ACK messages, acknowledged without dispatch (neither handled nor dead-lettered)."""
        self.errors: list[BaseException] = []
        """Unexpected errors that stopped a worker (store failures); empty in normal operation."""

    def start(self) -> WorkerPool:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Ask every worker to stop after the message in hand."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the workers to stop; True if all did."""
        for t in self._threads:
            t.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()

    def install_signal_handlers(self) -> None:
        """Stop gracefully on SIGTERM and SIGINT (call from the main thread)."""

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping workers after their current messages", signum)
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _run(self, owned: list[str]) -> None:
        try:
            while not self._stop.is_set():
                idle = True
                for channel in owned:
                    if self._stop.is_set():
                        break
                    idle = not self._drain(channel) and idle
                if idle:
                    self._stop.wait(self._poll)
        except BaseException as exc:
            log.exception("worker stopped by an unexpected error")
            self.errors.append(exc)

    def _drain(self, channel: str) -> bool:
        """Handle one batch of `channel`; True if there was anything to do."""
        try:
            envs = self.chans.consume(self.group, channel, self._batch)
        except FramingError as err:
            self._dead_letter_bytes(channel, err.begin, err.end, None, str(err), 1)
            self.chans.ack(self.group, channel, err.end)
            return True
        for env in envs:
            if self._stop.is_set():
                self.chans.nack(self.group, channel)  # consumed but not started: redeliver later
                return True
            if not self._handle(channel, env):
                self.chans.nack(self.group, channel)  # redeliver from this message
                return True
        return bool(envs)

    def _handle(self, channel: str, env: Envelope) -> bool:
        """Process one message; True once it is acknowledged (handled or dead-lettered)."""
        msg = env.message
        if isinstance(msg, TypedMessage) and msg.kind is None and msg.error is None:  # a transaction's ACK
            self.chans.ack(self.group, channel, env)
            with self._count_lock:
                self.acks += 1
            return True
        key = (channel, env.begin)
        attempt = self._attempts.get(key, 0) + 1
        try:
            self.dispatcher.dispatch(env, attempt)
        except (UndecodableMessageError, NoHandlerError) as exc:
            log.error("dead-lettering %s: %s", env, exc)
            self._dead_letter_bytes(channel, env.begin, env.end, env.uuid, str(exc), attempt)
        except Exception as exc:
            if attempt < self._max:
                self._attempts[key] = attempt
                log.warning("attempt %d of %d failed for %r at %d: %r", attempt, self._max, channel, env.begin, exc)
                return False
            log.error("dead-lettering %r at %d after %d attempts: %r", channel, env.begin, attempt, exc)
            self._dead_letter_bytes(channel, env.begin, env.end, env.uuid, repr(exc), attempt)
        else:
            with self._count_lock:
                self.handled += 1
        self._attempts.pop(key, None)
        self.chans.ack(self.group, channel, env)
        return True

    def _dead_letter_bytes(
        self, channel: str, begin: int, end: int, uuid: bytes | None, error: str, attempts: int
    ) -> None:
        frame = bytearray()
        for _, chunk in self.chans.store.read(channel, begin):
            frame += chunk
            if len(frame) >= end - begin:
                break
        doc = {
            "journal": channel,
            "begin": begin,
            "end": end,
            "uuid": uuid.hex() if uuid else None,
            "attempts": attempts,
            "error": error,
            "frame": base64.b64encode(bytes(frame[: end - begin])).decode(),
        }
        self.chans.store.append(self.dead_letter, json.dumps(doc).encode() + b"\n")
        with self._count_lock:
            self.dead_lettered += 1
