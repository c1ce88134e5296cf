"""Iterators over one journal's messages: read-uncommitted (every frame) and read-committed.

Both yield Envelopes (journal, begin and end byte offsets, message, UUID). Chunks from the
JournalReader may split frames anywhere; frames are reassembled. A FramingError (bad frame, desync,
unexpected end) is raised from ``next()`` at its place in the stream, and the iterator stays usable:
calling ``next()`` again continues after the bad bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from zcluster.message.envelope import Envelope
from zcluster.message.errors import DecodeError, FramingError
from zcluster.message.framing import Decoded, DecodeFunc, framing_for
from zcluster.message.journals import JournalReader, JournalSpec
from zcluster.message.sequencer import QueueOutcome, Sequencer

__all__ = ["DecodeFunc", "ReadCommittedIter", "ReadUncommittedIter"]


class ReadUncommittedIter:
    """Every frame of `spec`'s journal from `offset`, up to `end` (exclusive; None: the current end,
    or with block=True until `timeout` passes without new data).

    `decode` builds messages from records; by default the framing's own (JsonMessage for ndjson,
    CsvRecord for csv; protobuf-fixed needs one). A record `decode` rejects (ValueError or
    TypeError) is raised as a DecodeError naming its byte range.
    """

    def __init__(
        self,
        reader: JournalReader,
        spec: JournalSpec,
        offset: int = 0,
        *,
        end: int | None = None,
        decode: DecodeFunc | None = None,
        block: bool = False,
        timeout: float | None = None,
    ) -> None:
        framing = framing_for(spec.labels.get("content-type", ""))
        decode = decode or framing.default_decode()
        if decode is None:
            raise TypeError(f"{framing.content_type} journals need a decode function")
        self._decode = decode
        self._journal = spec.name
        self._decoder = framing.decoder(offset)
        self._end = end
        self._pending: deque[Decoded] = deque()
        self._chunks: Iterator[tuple[int, bytes]] | None = None
        self._open = lambda: reader.read(spec.name, offset, block=block, timeout=timeout)
        self._done = end is not None and end <= offset

    def __iter__(self) -> ReadUncommittedIter:
        return self

    def __next__(self) -> Envelope:
        while True:
            if self._pending:
                item = self._pending.popleft()
                if isinstance(item, FramingError):
                    raise item
                try:
                    return Envelope(self._journal, item.begin, item.end, self._decode(item.record))
                except (ValueError, TypeError) as exc:
                    raise DecodeError(
                        item.begin, item.end, f"undecodable message at offset {item.begin}: {exc}"
                    ) from exc
            if self._done:
                raise StopIteration
            if self._chunks is None:
                self._chunks = self._open()
            try:
                begin, chunk = next(self._chunks)
            except StopIteration:
                self._done = True
                self._pending.extend(self._decoder.close())
                continue
            if self._end is not None and begin + len(chunk) >= self._end:
                chunk = chunk[: self._end - begin]
                self._done = True
                self._pending.extend(self._decoder.feed(chunk))
                self._pending.extend(self._decoder.close())
            else:
                self._pending.extend(self._decoder.feed(chunk))


def _skip_framing_errors(it: ReadUncommittedIter) -> Iterator[Envelope]:
    # Bad bytes inside a replayed range were already reported when first read.
    while True:
        try:
            yield next(it)
        except FramingError:
            continue
        except StopIteration:
            return


class ReadCommittedIter:
    """The committed messages of `spec`'s journal, each exactly once, through `sequencer`.

    Reading starts at `offset`, by default the sequencer's read-through offset of the journal (0
    for a new Sequencer, the checkpointed offset for a restored one). ACK messages are yielded too
    (``Envelope.is_ack``). Replays are read from the same journal automatically.
    """

    def __init__(
        self,
        reader: JournalReader,
        spec: JournalSpec,
        sequencer: Sequencer,
        offset: int | None = None,
        *,
        decode: DecodeFunc | None = None,
        block: bool = False,
        timeout: float | None = None,
    ) -> None:
        self._reader = reader
        self._spec = spec
        self._seq = sequencer
        self._decode = decode
        start = sequencer.read_through(spec.name) if offset is None else offset
        self._uncommitted = ReadUncommittedIter(reader, spec, start, decode=decode, block=block, timeout=timeout)

    def __iter__(self) -> ReadCommittedIter:
        return self

    def __next__(self) -> Envelope:
        seq = self._seq
        while True:
            env = seq.step()
            if env is not None:
                return env
            env = next(self._uncommitted)
            if seq.queue_uncommitted(env) is QueueOutcome.ACK_COMMIT_REPLAY:
                _, begin, end = seq.replay_range()
                replay = ReadUncommittedIter(self._reader, self._spec, begin, end=end, decode=self._decode)
                seq.start_replay(_skip_framing_errors(replay))
