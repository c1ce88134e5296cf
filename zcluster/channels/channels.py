"""Channels: the message-stream operations of Milvus' MsgStream/RocksMQ over journals of either backend.

A channel is a journal labelled with a ``topic``; its ``owner`` and ``description`` live in the journal's
metadata. Producing validates each message (if it has ``validate()``), stamps it with a UUID through the
message layer's :class:`~zcluster.message.producer.Producer` (OUTSIDE_TXN, this object's producer id, a
clock raised to wall time unless the caller gives one) so read-committed readers can drop duplicates,
frames it by the channel's content type, and appends each channel's share of a batch in one atomic
append. Stamping and appending hold the channels' locks, so concurrent produce calls keep this
producer's clocks in each channel's order (a read-committed reader would drop a message whose clock is
not above its producer's previous one in that channel).

Consumer groups here are per-channel read positions (byte offsets), as in RocksMQ: ``consume`` delivers
messages after the group's delivery cursor; only ``ack`` moves the durable position (stored in the
journal's own store, so it survives restarts); ``nack`` or a restart redelivers everything after the
durable position. Guarantees: at-least-once delivery in channel order; a message is redelivered until
a position at or past its end is acknowledged. Not guaranteed: several live consumers of one
(group, channel) pair coordinate (they share one position: run one consumer per pair, as Kafka does
per partition; for competing consumers of one stream use RedisJournals' native groups).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from zcluster.journal.store import CONTENT_TYPE_LABEL, JournalStore, validate_group
from zcluster.message.envelope import Envelope, Message
from zcluster.message.errors import FramingError, OffsetOutOfRangeError
from zcluster.message.framing import CONTENT_TYPE_NDJSON, DecodeFunc, Framing, framing_for
from zcluster.message.journals import AppendResult, JournalSpec
from zcluster.message.mapping import MappingFunc
from zcluster.message.producer import Producer, Stamping, validate
from zcluster.message.readers import ReadUncommittedIter
from zcluster.message.uuid import Clock

__all__ = ["TOPIC_LABEL", "ChannelInfo", "Channels"]

TOPIC_LABEL = "topic"


@dataclass(frozen=True)
class ChannelInfo:
    """What ``describe_channels`` reports about one channel."""

    name: str
    topic: str
    owner: str
    description: str
    labels: Mapping[str, str]
    end: int
    positions: Mapping[str, int]


class Channels(Stamping):
    """Channel operations over `store` (FileJournals or RedisJournals).

    `decode` turns framing records into messages (default: the framing's own, e.g. JsonMessage).
    `producer` (6 bytes) and `clock` are the Producer's (without a clock, an internal one follows wall
    time; a caller's clock is only ticked). Safe for concurrent use by threads.
    """

    def __init__(
        self,
        store: JournalStore,
        *,
        decode: DecodeFunc | None = None,
        producer: bytes | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self._decode = decode
        self._producer = Producer(clock, producer)
        self._lock = threading.Lock()
        self._cursors: dict[tuple[str, str], int] = {}  # (group, channel) -> next offset to deliver
        self._specs: dict[str, JournalSpec] = {}

    # -- management ----------------------------------------------------------------------------------

    def create_channels(
        self,
        names: Iterable[str],
        *,
        topic: str,
        content_type: str = CONTENT_TYPE_NDJSON,
        owner: str = "",
        description: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Create each channel as a journal labelled ``topic=<topic>``. JournalExistsError names the first
        that exists (those before it stay created)."""
        framing_for(content_type)  # UnknownContentTypeError now rather than at the first produce
        for name in names:
            spec = JournalSpec(name, {**(labels or {}), TOPIC_LABEL: topic, CONTENT_TYPE_LABEL: content_type})
            self.store.create(spec, {"owner": owner, "description": description})

    def destroy_channels(self, names: Iterable[str]) -> None:
        """Destroy each channel with its data and group positions (JournalNotFoundError if unknown)."""
        for name in names:
            self.store.destroy(name)
            with self._lock:
                self._specs.pop(name, None)
                for key in [k for k in self._cursors if k[1] == name]:
                    del self._cursors[key]

    def describe_channels(self, names: Iterable[str]) -> list[ChannelInfo]:
        """Topic, owner, description, labels, end offset and group positions of each channel."""
        out = []
        for name in names:
            info = self.store.info(name)
            out.append(
                ChannelInfo(
                    name,
                    info.labels.get(TOPIC_LABEL, ""),
                    info.metadata.get("owner", ""),
                    info.metadata.get("description", ""),
                    dict(info.labels),
                    self.store.end(name),
                    self._positions(name),
                )
            )
        return out

    def _positions(self, name: str) -> dict[str, int]:
        positions: Callable[[str], dict[str, int]] | None = getattr(self.store, "positions", None)
        return positions(name) if positions is not None else {}

    def channels(self, topic: str) -> list[str]:
        """Names of the channels of `topic`, sorted."""
        return [s.name for s in self.store.list(f"{TOPIC_LABEL}={topic}")]

    def _spec(self, name: str) -> JournalSpec:
        spec = self._specs.get(name)
        if spec is None:
            spec = self._specs[name] = self.store.info(name).spec
        return spec

    # -- producing -----------------------------------------------------------------------------------

    def produce(self, messages: Sequence[Message], mapping: MappingFunc) -> list[AppendResult]:
        """Validate, map, stamp and frame `messages`, then append each channel's messages in one atomic append.

        Returns each message's byte range, in input order. Messages of one channel keep their input
        order; appends to different channels are independent (one can fail after another succeeded).
        Nothing is appended if a message fails ``validate()``, its mapping or its framing.
        """
        producer = self._producer
        producer.update_clock()
        routes = [producer.route(mapping, msg) for msg in messages]
        by_channel: dict[str, list[tuple[int, bytes]]] = {}
        out: list[AppendResult | None] = [None] * len(messages)
        with producer.hold(name for name, _ in routes):
            for i, (msg, (name, framing)) in enumerate(zip(messages, routes, strict=True)):
                producer.stamp_committed(msg, name)
                by_channel.setdefault(name, []).append((i, framing.marshal(msg)))
            for name, items in by_channel.items():
                for (i, _), r in zip(items, self.store.append_many(name, [d for _, d in items]), strict=True):
                    out[i] = r
        return [r for r in out if r is not None]

    def broadcast(self, message: Message, topic: str) -> dict[str, AppendResult]:
        """Validate `message`, stamp it once and append it to every channel of `topic`; return where it
        landed in each."""
        validate(message)
        producer = self._producer
        producer.update_clock()
        names = self.channels(topic)
        framings: dict[str, Framing] = {n: framing_for(self._spec(n).labels[CONTENT_TYPE_LABEL]) for n in names}
        out = {}
        with producer.hold(names):
            producer.stamp_committed(message, *names)
            for name in names:
                out[name] = self.store.append(name, framings[name].marshal(message))
        return out

    # -- consuming -----------------------------------------------------------------------------------

    def position(self, group: str, channel: str) -> int:
        """The durable (acknowledged) position of `group` in `channel`: 0 if it never acknowledged."""
        return self.store.load_position(channel, validate_group(group)) or 0

    def _cursor(self, group: str, channel: str) -> int:
        key = (group, channel)
        with self._lock:
            cur = self._cursors.get(key)
        if cur is None:
            cur = self.position(group, channel)
            with self._lock:
                cur = self._cursors.setdefault(key, cur)
        return cur

    def _set_cursor(self, group: str, channel: str, offset: int) -> None:
        with self._lock:
            self._cursors[(group, channel)] = offset

    def consume(self, group: str, channel: str, n: int, *, timeout: float | None = None) -> list[Envelope]:
        """Up to `n` messages of `channel` after `group`'s delivery cursor, which moves past them.

        With `timeout`, wait up to that many seconds for a first message. A framing error met before
        any message is raised (the cursor moves past the bad bytes; ``ack`` through ``err.end`` to
        acknowledge them); met after some, the batch ends before it and the next call raises it.
        """
        if n < 1:
            raise ValueError("n must be positive")
        return self._consume(group, channel, n, timeout, None)

    def _consume(
        self, group: str, channel: str, n: int, timeout: float | None, watermark: int | None
    ) -> list[Envelope]:
        validate_group(group)
        spec = self._spec(channel)
        offset = self._cursor(group, channel)
        out: list[Envelope] = []
        blocking = timeout is not None and offset >= self.store.end(channel)
        it = ReadUncommittedIter(self.store, spec, offset, decode=self._decode, block=blocking, timeout=timeout)
        while len(out) < n:
            try:
                env = next(it)
            except StopIteration:
                break
            except FramingError as err:
                if out:
                    break
                self._set_cursor(group, channel, err.end)
                raise
            if watermark is not None and env.clock > watermark:
                break
            out.append(env)
            if blocking:  # the wait is over: take what else is there without waiting again
                blocking = False
                it = ReadUncommittedIter(self.store, spec, env.end, decode=self._decode)
        if out:
            self._set_cursor(group, channel, out[-1].end)
        return out

    def ack(self, group: str, channel: str, through: Envelope | int) -> None:
        """Acknowledge everything of `channel` before `through` (an offset, or a delivered envelope's end)
        for `group`: its durable position moves there. Never moves it backwards (use ``seek``). ValueError
        if `through` is past what was delivered."""
        offset = through.end if isinstance(through, Envelope) else through
        if offset > self._cursor(group, channel):
            raise ValueError(
                f"group {group!r}, channel {channel!r}: cannot acknowledge offset {offset} before delivering it"
            )
        if offset > self.position(group, channel):
            self.store.store_position(channel, group, offset)

    def nack(self, group: str, channel: str) -> None:
        """Redeliver every unacknowledged message: the delivery cursor returns to the durable position."""
        self._set_cursor(group, channel, self.position(group, channel))

    def seek(self, group: str, channel: str, offset: int) -> None:
        """Set `group`'s durable position and cursor in `channel` to `offset` (a message boundary),
        backwards or forwards. OffsetOutOfRangeError outside [0, end]."""
        end = self.store.end(channel)
        if not 0 <= offset <= end:
            raise OffsetOutOfRangeError(f"channel {channel!r}: offset {offset} outside [0, {end}]")
        self.store.store_position(channel, validate_group(group), offset)
        self._set_cursor(group, channel, offset)

    def consume_until(self, group: str, channels: Iterable[str], watermark: int) -> dict[str, list[Envelope]]:
        """Time-tick consumption: from each channel, every message whose UUID clock is at or below
        `watermark` (a Gazette clock), stopping at the first one above it, so the batch is aligned across
        channels and none runs ahead. The cursors move past the delivered messages only; acknowledge each
        channel with ``ack``. Alignment assumes each channel's clocks do not decrease (one producer per
        channel, or producers whose clocks are synchronised); clock-0 messages count as below."""
        return {c: self._consume(group, c, 1 << 62, None, watermark) for c in channels}
