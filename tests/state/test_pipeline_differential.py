"""The applier's straight pipeline (runs of ndjson lines decoded at once, the commonest case's mapper inline)
against the reference behaviour, on random journals: transactions committed and rolled back, duplicates,
zero clocks, odd flags, damaged lines, lines cut across read chunks, small rings (spans replayed from the
journal) and a checkpoint between two polls.

Three oracles: the message layer's reference reader (:class:`ReadUncommittedIter`: the framing's decoder,
then ``JsonMessage.from_json``) for what each frame decodes to; the applier's per-frame path (one row per
frame, as the Spark sink feeds it) for everything an application sees (deliveries in order, counts,
checkpoint); and a plain Sequencer fed every envelope with ``queue_uncommitted`` and ``step`` (no fast path)
for which messages are delivered, in which order.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zcluster import Cluster, Insert
from zcluster.journal.frames import RUN_LINES, LineRun, read_range_frames, read_runs
from zcluster.message import (
    CONTENT_TYPE_NDJSON,
    Envelope,
    Flags,
    FramingError,
    InMemoryJournals,
    JournalSpec,
    QueueOutcome,
    Sequencer,
    build_uuid,
    format_uuid,
)
from zcluster.message.decoding import FrameDecoder
from zcluster.message.readers import ReadUncommittedIter
from zcluster.message.records import JsonMessage
from zcluster.state import Applier, BatchStats, StateStore

JOURNAL = "diff/j"
_names = itertools.count()

DAMAGED = [
    b"not json",
    b"[1, 2]",
    b'"a string"',
    b'{"UUID": "zz"}',
    b'{"UUID": 5, "id": "x"}',
    b'{"UUID": "00000000-0000-1000-8000-00000000000g", "id": "x"}',
    b'{"UUID": "00000000-0000-1000-8000-0000000000000", "id": "x"}',
    b'{"UUID": "00000000-0000-1000-8000 000000000000", "id": "x"}',
    b'{"UUID": " 0000000-0000-1000-8000-000000000000", "id": "x"}',
    b'{"id": "no-uuid"}',  # the zero UUID: never sequenced, always delivered
    b'{"UUID": null, "id": "null-uuid"}',
    b'{"n": NaN, "id": "nan", "UUID": null}',  # json's rules, where orjson refuses
    b'{"n": 1e400, "id": "big"}',
    b"\xff\xfe",
    b"",
    b"  ",
]


@st.composite
def journals(draw: st.DrawFn) -> list[bytes]:
    """Lines (without newlines) of one ndjson journal."""
    lines: list[bytes] = []
    for i in range(draw(st.integers(1, 40), label="frames")):
        kind = draw(st.sampled_from(["msg", "msg", "msg", "msg", "dup", "damaged"]), label="kind")
        if kind == "dup" and lines:
            lines.append(draw(st.sampled_from(lines), label="duplicated"))
        elif kind == "damaged":
            lines.append(draw(st.sampled_from(DAMAGED), label="damage"))
        else:
            producer = bytes([1 + draw(st.integers(0, 2), label="producer")] * 6)
            clock = draw(st.integers(0, 10), label="clock") << 4  # small: repeats, zeros, clocks going back
            flags = draw(st.sampled_from([Flags.OUTSIDE_TXN, Flags.CONTINUE_TXN, Flags.ACK_TXN, 0x3]), label="flags")
            doc = {"UUID": format_uuid(build_uuid(producer, clock, int(flags))), "id": f"m{i}"}
            lines.append(json.dumps(doc, separators=(",", ":")).encode())
    return lines


def _store(lines: list[bytes], chunk: int) -> InMemoryJournals:
    store = InMemoryJournals([JournalSpec(JOURNAL, {"content-type": CONTENT_TYPE_NDJSON})], chunk_size=chunk)
    if lines:
        store.append(JOURNAL, b"".join(line + b"\n" for line in lines))
    return store


def _reference(store: InMemoryJournals) -> list[tuple[int, int, bytes, Any] | tuple[int, None]]:
    """Per frame: (begin, end, uuid, doc) of its envelope, or (begin, None) for a frame that does not decode."""
    out: list[tuple[int, int, bytes, Any] | tuple[int, None]] = []
    it = ReadUncommittedIter(store, store.spec(JOURNAL), 0, end=store.end(JOURNAL))
    while True:
        try:
            env = next(it)
        except FramingError as exc:
            out.append((exc.begin, None))
            continue
        except StopIteration:
            return out
        out.append((env.begin, env.end, env.uuid, env.message.doc))


def _shown(env: Envelope | None, begin: int) -> tuple[int, int, bytes, Any] | tuple[int, None]:
    return (begin, None) if env is None else (env.begin, env.end, env.uuid, env.message.doc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=journals(), chunk=st.integers(1, 64))
def test_runs_decode_as_the_reference_reader(lines: list[bytes], chunk: int) -> None:
    store = _store(lines, chunk)
    end = store.end(JOURNAL)
    decoder = FrameDecoder(JOURNAL, CONTENT_TYPE_NDJSON, None)
    # An application's own decode takes the general loop (one frame() a line): the same envelopes here.
    general = FrameDecoder(JOURNAL, CONTENT_TYPE_NDJSON, lambda record: JsonMessage.from_json(record))
    assert decoder.json_messages and not general.json_messages
    got: list[tuple[int, int, bytes, Any] | tuple[int, None]] = []
    for item in read_runs(store, JOURNAL, CONTENT_TYPE_NDJSON, 0, end):
        assert isinstance(item, LineRun)  # whole lines only: nothing over-long, nothing cut at the end
        pos = item.begin
        envs = decoder.lines(item.begin, item.lines)
        assert envs == general.lines(item.begin, item.lines)
        for line, env in zip(item.lines, envs, strict=True):
            assert env == decoder.frame(pos, pos + len(line) + 1, line + b"\n")  # the per-frame path agrees
            got.append(_shown(env, pos))
            pos += len(line) + 1
        assert item.end == pos  # the run ends where its last line does
    assert got == _reference(store)


@pytest.mark.parametrize("n", [RUN_LINES, 3 * RUN_LINES + 5])
def test_a_chunk_of_many_lines_comes_in_runs_of_at_most_run_lines_that_tile_it(n: int) -> None:
    """One chunk read holds every line: the runs cut it in order, each beginning where the last ended."""
    lines = [b'{"id":"m%d"}' % i + b" " * (i % 7) for i in range(n)]
    store = _store(lines, 1 << 20)
    runs = list(read_runs(store, JOURNAL, CONTENT_TYPE_NDJSON, 0, store.end(JOURNAL)))
    assert all(isinstance(run, LineRun) for run in runs)
    assert [len(run.lines) for run in runs] == [RUN_LINES] * (n // RUN_LINES) + (
        [n % RUN_LINES] if n % RUN_LINES else []
    )
    pos = 0
    for run in runs:
        assert run.begin == pos
        pos += sum(len(line) + 1 for line in run.lines)
        assert run.end == pos
    assert pos == store.end(JOURNAL) and [line for run in runs for line in run.lines] == lines


def _model(store: InMemoryJournals, ring: int) -> list[Any]:
    """The docs a plain Sequencer delivers (queue_uncommitted and step only), in order."""
    envs = [
        Envelope(JOURNAL, begin, rest[0], _Doc(rest[2]), rest[1])
        for begin, *rest in _reference(store)
        if rest[0] is not None
    ]
    seq, out = Sequencer(buffer=ring), []
    for env in envs:
        if seq.queue_uncommitted(env) is QueueOutcome.ACK_COMMIT_REPLAY:
            _, begin, end = seq.replay_range()
            seq.start_replay([e for e in envs if begin <= e.begin and e.end <= end])
        while (out_env := seq.step()) is not None:
            if not out_env.is_ack:
                out.append(out_env.message.doc)
    return out


class _Doc:
    def __init__(self, doc: Any) -> None:
        self.doc = doc


def _run(cluster: Cluster, store: InMemoryJournals, ring: int, cuts: list[int], rows: bool) -> tuple[Any, ...]:
    """Apply the journal in polls ending at ``cuts``: by runs (the Consumer's path) or one row per frame."""
    delivered: list[Any] = []
    app = f"diff{next(_names)}"

    def mapper(message: Any) -> list[Insert]:
        delivered.append(message.doc)
        return [Insert(f"{app}:k", 1.0, str(message.doc.get("id")))]  # each run's own key: its own applied count

    applier = Applier(cluster, app, mapper, journals=store, ring=ring)
    stats, begin = BatchStats(), 0
    for cut in cuts:
        if rows:
            frames = read_range_frames(store, JOURNAL, CONTENT_TYPE_NDJSON, begin, cut, lost_rows=True)
            applier.apply(JOURNAL, frames, stats)
        else:
            applier.apply_range(store, JOURNAL, CONTENT_TYPE_NDJSON, begin, cut, stats)
        begin = cut
    checkpoint = StateStore(cluster, app).load_journal(JOURNAL)
    counts = {k: v for k, v in stats.counters().items() if k != "lag"}
    return delivered, counts, checkpoint.offset, sorted(checkpoint.states)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=journals(), chunk=st.integers(1, 64), ring=st.integers(1, 6), cut=st.floats(0, 1))
# Found here, reduced (each failed before the fix): a zero clock inside its own producer's span, delivered when
# read, was delivered again by the span's replay (its ACK read in the next poll: the ring restored empty). The
# model (one read, ring 4) has the span in its ring.
@example(
    lines=[
        b'{"UUID":"00000001-0000-1000-8001-020202020202","id":"m0"}',  # producer 2, clock 16, CONTINUE_TXN
        b'{"UUID":"00000000-0000-1000-8000-020202020202","id":"m1"}',  # producer 2, clock 0
        b'{"UUID":"00000001-0000-1000-8002-020202020202","id":"m2"}',  # producer 2, clock 16, ACK_TXN
    ],
    chunk=1,
    ring=4,
    cut=0.5,  # a poll boundary after m1
)
# The same for a clock going back within a span (m2: dropped when queued), its ACK at that clock: the replay
# delivered m2.
@example(
    lines=[
        b'{"UUID":"00000001-0000-1000-8000-010101010101","id":"m0"}',  # producer 1, clock 16, OUTSIDE_TXN
        b'{"UUID":"00000003-0000-1000-8001-010101010101","id":"m1"}',  # clock 48, CONTINUE_TXN
        b'{"UUID":"00000002-0000-1000-8001-010101010101","id":"m2"}',  # clock 32, CONTINUE_TXN
        b'{"UUID":"00000002-0000-1000-8002-010101010101","id":"m3"}',  # clock 32, ACK_TXN
    ],
    chunk=64,
    ring=4,
    cut=0.7,  # a poll boundary after m2
)
def test_the_pipeline_delivers_as_the_per_frame_path_and_the_sequencer(
    shards: Any, lines: list[bytes], chunk: int, ring: int, cut: float
) -> None:
    store = _store(lines, chunk)
    end = store.end(JOURNAL)
    boundaries = list(itertools.accumulate(len(line) + 1 for line in lines))
    cuts = sorted({boundaries[int(cut * (len(boundaries) - 1))], end}) if boundaries else [end]
    with Cluster.from_urls(shards.urls, prefix=f"pdiff{next(_names)}:") as cluster:
        runs = _run(cluster, store, ring, cuts, rows=False)
        per_frame = _run(cluster, store, ring, cuts, rows=True)
    assert runs == per_frame
    assert runs[0] == _model(store, ring)
