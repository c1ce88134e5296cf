"""``spark.read.format("zcluster-journal")``: journals as a batch source (an audit, a backfill).

A batch read takes every selected journal between two offsets, one partition per journal. ``rows`` says
what a row is, and a batch read must say it (Spark asks a source for its schema before it knows whether
the read is a batch or a stream, and the streaming source's rows are raw frames: a batch read that fell
back on them silently would count duplicates and rolled-back messages):

* ``messages``: the committed messages, read-committed as :class:`zcluster.spark.ZClusterSink` sees them
  (:data:`zcluster.spark.source.MESSAGES_SCHEMA`): duplicates dropped, rolled-back transactions dropped,
  ACKs not rows; the rows whose ``error`` is null are exactly what the sink's mapper is given, in the
  same order. Columns:
  ``journal``; ``begin``/``end``, the message's bytes; ``committed``, the offset of the frame that
  committed it (its transaction's ACK, or itself when published committed); ``producer`` (12 hex
  digits) and ``clock`` of its UUID, ``uuid`` (text form); ``message``, the frame's text as published
  without its line end (a JSON document for ndjson); ``error``, null, or why the row is not a message:
  bytes that did not frame, a message that did not decode (the sink logs and skips both), or a lost
  range skipped with ``failOnDataLoss=false`` (starting ``lost range:``). Rows come in delivery order:
  by ``committed``, then ``begin``. Journals of a framing with no decoder of its own (protobuf-fixed)
  cannot be read so: an error names them. Messages decode with the framing's own decoder; a sink given
  its own ``decode`` may reject some of them (it logs and skips those).
* ``frames``: the streaming source's rows, every frame as appended (:data:`zcluster.spark.source.SCHEMA`);
* ``ranges``: one row per journal, its range (:data:`zcluster.spark.source.RANGES_SCHEMA`).

Offsets (the byte offsets the sink checkpoints and the ``begin``/``end`` columns hold):
``startingOffsets`` and ``endingOffsets`` are JSON objects ``{journal: offset}``; a journal they do not
name is read from 0 up to its end when the read is planned (``earliest`` and ``latest``, the defaults,
say that for every journal). Any byte offset may be given; the rule is by where frames *begin*:

* ``rows=frames`` holds the frames (and error rows) that begin in [start, end): a start inside a frame
  moves to the next frame, an end inside a frame takes that frame whole;
* ``rows=messages`` holds the messages whose *committing* frame (their transaction's ACK, or the message
  itself when published committed) begins in [start, end). A message is read-committed only once that
  frame is read, so this is the rule under which a range's content never depends on bytes after it.

Consecutive reads ([a, b) then [b, c)) thus hold every frame, and every committed message, exactly once,
whatever the cut points, and ``endingOffsets`` taken from a sink's checkpoint gives what the sink had
delivered there. The planner moves each offset to the begin of the first row at or after it
(:func:`zcluster.journal.frames.frame_start`: for ndjson a look at the bytes around it; other framings are
decoded from offset 0 to find it), and ``rows=ranges`` shows the moved offsets. Sequencing needs every
producer's state from the journal's start, so a messages read always sequences from offset 0 and drops
the rows before the start: a read late in a long journal costs the bytes before it too.

``failOnDataLoss`` (``true`` by default, the streaming source's option) means the same on both journal
kinds: a lost range (a file journal's damage on disk, :mod:`zcluster.journal.files`; a Redis Streams
journal's bytes trimmed by retention, :mod:`zcluster.journal.streams`) anywhere up to the end fails the read
naming the journal and the bytes (with ``rows=messages`` before the start too: producer states are read
through it, and a duplicate of a trimmed message can no longer be recognised); ``false`` reads on after it,
logged at WARNING, as a row (``error`` starting ``lost range:``) when it begins in the range read, as the
sink does with its ``fail_on_data_loss=False``. Other options: ``journals`` (required, a store URL),
``selector`` (a label selector). An unknown option, a journal the offsets name that is not selected (or does
not exist), an offset outside its journal or a start past its end is a :class:`zcluster.errors.ConfigError`
naming it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from zcluster._urls import redact_url
from zcluster.errors import ConfigError
from zcluster.journal.frames import RawFrame, frame_start, lost_error, read_frames, read_range_frames
from zcluster.journal.store import close_store
from zcluster.journal.urls import open_store
from zcluster.message.envelope import Envelope
from zcluster.message.errors import FramingError, OffsetOutOfRangeError
from zcluster.message.framing import DecodeFunc, Framing, framing_for
from zcluster.message.journals import JournalReader
from zcluster.message.sequencer import QueueOutcome, Sequencer
from zcluster.message.uuid import format_uuid
from zcluster.spark.source import (
    MESSAGES_SCHEMA,
    RANGE_COLUMNS,
    RANGES_SCHEMA,
    SCHEMA,
    JournalPartition,
    JournalRange,
    JournalStreamReader,
    read_batches,
)

__all__ = ["JournalBatchReader", "JournalDataSource", "plan_range", "read_committed"]

log = logging.getLogger(__name__)

OPTIONS = ("journals", "selector", "rows", "startingOffsets", "endingOffsets", "failOnDataLoss")
"""The options a batch read knows (names are case-insensitive)."""
_RING = 8192  # the applier's ring: spans longer than this are replayed from the journal, as there

Row = tuple[str, int, int, int, str | None, int | None, str | None, str | None, str | None]


def _error_row(row: RawFrame, error: str) -> Row:
    return (row.journal, row.begin, row.end, row.begin, None, None, None, None, error)


def _envelope(row: RawFrame, framing: Framing, decode: DecodeFunc) -> Envelope | str:
    """The frame as an envelope whose message is the frame's text, or why it is not a message."""
    data = row.data or b""
    decoder = framing.decoder(row.begin)
    frames = [i for i in decoder.feed(data) + decoder.close() if not isinstance(i, FramingError)]
    if len(frames) != 1:
        return f"bytes {row.begin}..{row.end}: not exactly one decodable frame"
    try:
        uuid = decode(frames[0].record).get_uuid()
        text = data.decode()
    except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        return f"offset {row.begin}: undecodable message: {exc}"
    return Envelope(row.journal, row.begin, row.end, text.rstrip("\r\n"), uuid=uuid)


def _replay(
    store: JournalReader, journal: str, content_type: str, framing: Framing, decode: DecodeFunc, begin: int, end: int
) -> Iterator[Envelope]:
    # Bad bytes and lost ranges in a replayed range were met (and reported) when first read.
    for row in read_frames(store, journal, content_type, begin, end, lost_rows=True):
        if row.error is None and isinstance(env := _envelope(row, framing, decode), Envelope):
            yield env


def read_committed(url: str, part: JournalRange, fail_on_data_loss: bool = True) -> Iterator[Row]:
    """The committed messages of ``part``'s journal as rows of :data:`MESSAGES_SCHEMA` (see the module):
    sequenced from offset 0 to ``part.end``, the rows committed before ``part.begin`` dropped. ``part``'s
    offsets are frame boundaries (:func:`plan_range` makes them so); the rows are then the messages whose
    committing frame begins in [``part.begin``, ``part.end``).

    Follows the applier's decisions frame by frame (:class:`zcluster.state.Applier`): the same Sequencer,
    a fresh one, as for a sink's first batch. A lost range raises :class:`OffsetOutOfRangeError` naming
    it, or with ``fail_on_data_loss`` False is a row and the read goes on after it."""
    framing = framing_for(part.content_type)
    decode = framing.default_decode()
    if decode is None:
        raise ConfigError(f"journal {part.journal}: rows=messages cannot decode {part.content_type} messages")
    store = open_store(url, recover=False)
    try:
        seq = Sequencer(buffer=_RING)
        for row in read_range_frames(store, part.journal, part.content_type, 0, part.end, lost_rows=True):
            shown = row.begin >= part.begin
            if row.error is not None:
                lost = lost_error(row)
                if lost is not None and fail_on_data_loss:
                    raise OffsetOutOfRangeError(
                        f"journal {part.journal}: bytes {row.begin}..{row.end} are lost ({lost.reason}); "
                        "read with failOnDataLoss=false to read past them",
                        journal=part.journal,
                        lost_begin=row.begin,
                        lost_end=row.end,
                        resume_offset=row.end,
                        reason=lost.reason,
                    )
                if lost is not None:
                    log.warning("journal %s: read past lost bytes %d..%d (failOnDataLoss=false): %s",
                                part.journal, row.begin, row.end, lost.reason)  # fmt: skip
                if shown:
                    yield _error_row(row, row.error)
                continue
            env = _envelope(row, framing, decode)
            if isinstance(env, str):
                if shown:
                    yield _error_row(row, env)
                continue
            if seq.queue_uncommitted(env) is QueueOutcome.ACK_COMMIT_REPLAY:
                _, begin, end = seq.replay_range()
                seq.start_replay(_replay(store, part.journal, part.content_type, framing, decode, begin, end))
            while (out := seq.step()) is not None:
                if shown and not out.is_ack:
                    uuid = out.uuid
                    yield (part.journal, out.begin, out.end, env.begin, uuid[10:].hex(), out.clock,
                           format_uuid(uuid), out.message, None)  # fmt: skip
    finally:
        close_store(store)


def plan_range(
    store: JournalReader, journal: str, content_type: str, start: int, end: int, journal_end: int
) -> JournalRange:
    """The range a read of ``journal`` between the byte offsets ``start`` and ``end`` (any offsets, at most
    ``journal_end``) reads: each moved to the begin of the first row at or after it
    (:func:`zcluster.journal.frames.frame_start`), so the range holds the rows that begin in [start, end)
    and :func:`read_committed` the messages whose committing frame does (see the module)."""
    return JournalRange(
        journal,
        content_type,
        frame_start(store, journal, content_type, start, journal_end),
        frame_start(store, journal, content_type, end, journal_end),
    )


def _offsets_option(options: dict[str, str], name: str, default: str) -> dict[str, int]:
    text = options.get(name.lower(), default).strip()
    if text == default:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and type(v) is int and v >= 0 for k, v in value.items()
    ):
        raise ConfigError(
            f"zcluster-journal option {name} must be {default!r} or a JSON object of journal names to "
            f"non-negative byte offsets, got {text!r}"
        )
    return value


class JournalBatchReader(DataSourceReader):
    """The batch reader of ``zcluster-journal`` (see the module)."""

    def __init__(self, options: dict[str, str]) -> None:
        options = {name.lower(): value for name, value in options.items()}  # Spark lowercases them anyway
        unknown = sorted(set(options) - {o.lower() for o in OPTIONS})
        if unknown:
            raise ConfigError(
                f"zcluster-journal batch reads know no option {', '.join(unknown)}; they know {', '.join(OPTIONS)}"
            )
        if "journals" not in options:
            raise ConfigError("zcluster-journal needs the 'journals' option (a journal store URL)")
        self.rows = options.get("rows")
        if self.rows not in ("messages", "frames", "ranges"):
            raise ConfigError(
                "a zcluster-journal batch read needs the option rows: 'messages' (the committed messages, "
                f"read-committed), 'frames' (every frame as appended) or 'ranges'; got {self.rows!r}"
            )
        self.url = options["journals"]
        self.selector = options.get("selector", "")
        self.starting = _offsets_option(options, "startingOffsets", "earliest")
        self.ending = _offsets_option(options, "endingOffsets", "latest")
        text = options.get("failondataloss", "true").strip().lower()
        if text not in ("true", "false"):
            raise ConfigError(f"zcluster-journal option failOnDataLoss must be 'true' or 'false', got {text!r}")
        self.fail_on_data_loss = text == "true"

    def partitions(self) -> list[InputPartition]:
        """One partition per selected journal: [start, end) of its offsets (planned here, on the driver)."""
        store = open_store(self.url, recover=False)
        try:
            types = {s.name: s.labels["content-type"] for s in store.list(self.selector)}
            for option, offsets in (("startingOffsets", self.starting), ("endingOffsets", self.ending)):
                missing = sorted(set(offsets) - set(types))
                if missing:
                    raise ConfigError(
                        f"zcluster-journal option {option} names journals that are not in {redact_url(self.url)} "
                        f"(selector {self.selector!r}): {', '.join(missing)}"
                    )
            ranges: list[InputPartition] = []
            for name, content_type in sorted(types.items()):
                journal_end = store.end(name)
                start, end = self.starting.get(name, 0), self.ending.get(name, journal_end)
                if end > journal_end:
                    raise ConfigError(f"endingOffsets: journal {name} ends at {journal_end}, not {end}")
                if start > end:
                    raise ConfigError(f"startingOffsets: journal {name}'s start {start} is past its end {end}")
                if self.rows == "messages" and framing_for(content_type).default_decode() is None:
                    raise ConfigError(f"rows=messages: journal {name} holds {content_type}, which has no decoder")
                ranges.append(JournalPartition([plan_range(store, name, content_type, start, end, journal_end)]))
            return ranges
        finally:
            close_store(store)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, JournalPartition)
        (part,) = partition.ranges
        if self.rows == "ranges":
            return iter([pa.RecordBatch.from_pydict({name: [getattr(part, name)] for name in RANGE_COLUMNS})])
        if part.begin >= part.end:
            return iter(())
        if self.rows == "frames":
            return read_batches(self.url, part, self.fail_on_data_loss)
        return read_committed(self.url, part, self.fail_on_data_loss)


class JournalDataSource(DataSource):
    """Registered as ``zcluster-journal``: a batch reader (this module) and a stream reader
    (:mod:`zcluster.spark.source`); here because the batch reader builds on the stream's pieces."""

    @classmethod
    def name(cls) -> str:
        return "zcluster-journal"

    def schema(self) -> str:
        # Spark asks for the schema before it says whether the read is a batch or a stream: ``rows`` decides.
        rows = {name.lower(): value for name, value in self.options.items()}.get("rows")
        return {"messages": MESSAGES_SCHEMA, "ranges": RANGES_SCHEMA}.get(rows or "", SCHEMA)

    def reader(self, schema: Any) -> JournalBatchReader:
        return JournalBatchReader(dict(self.options))

    def streamReader(self, schema: Any) -> JournalStreamReader:
        return JournalStreamReader(dict(self.options))

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        """``writeStream.format("zcluster-journal")``: :mod:`zcluster.spark.journal_writer` (imported here: a
        reading worker needs nothing of the state layer)."""
        from zcluster.spark.journal_writer import JournalStreamWriter

        return JournalStreamWriter(dict(self.options))
