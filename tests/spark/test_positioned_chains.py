"""Exactly-once chains from a positioned source (Kafka's shape: rows with partition and offset, no UUIDs):
``PositionedSink(publish=url)`` publishes one derived message per row into file journals and Redis Streams
journals, each (topic, partition)'s rows of a batch one consumer transaction (:mod:`zcluster.spark.positioned`).
A read-committed reader downstream must see each derived message once, and a ``Consumer`` (stage B of
tests/state/chain_helpers.py) reading them into a leaderboard must equal the model of the rows, after: a batch
whose partitions Spark cut over two tasks; the batch run again, and again from a new checkpoint directory; a
task failing after appending its messages, before its save (retried by Spark); an attempt dying after its save,
before its ACKs; a zombie attempt saving after a newer claim; and on Spark Connect.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_positioned_split import ROWS, split_batch, two_topics

from zcluster import Cluster, ConfigError, Count, FencedError, MapperError, Publish
from zcluster.journal import FileJournals, RedisJournals
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.mapping import fnv1a32
from zcluster.message.readers import ReadCommittedIter, ReadUncommittedIter
from zcluster.message.records import JsonMessage
from zcluster.message.sequencer import Sequencer
from zcluster.message.uuid import get_producer_id
from zcluster.spark import ZClusterSink
from zcluster.spark.positioned import PositionedSink
from zcluster.state import Consumer, StateStore, progress, txn
from zcluster.testing import LocalShards

sys.path.insert(0, str(Path(__file__).parents[1] / "state"))
from chain_helpers import B_SELECTOR, OUTPUTS, board, create, stage_b

pytestmark = pytest.mark.spark
_ids = itertools.count()


def derive(row: dict[str, Any]) -> list[Any]:
    """Stage A's mapper: a row counted per partition, and one derived message to the output of its user."""
    user = row["user"]
    message = JsonMessage({"user": user, "pts": row["points"], "src": f"{row['partition']}:{row['offset']}"})
    return [Count("rows", row["partition"], 1), Publish(OUTPUTS[fnv1a32(user) % len(OUTPUTS)], message)]


def split_rows() -> list[dict[str, Any]]:
    """The rows of ``split_batch`` (test_positioned_split), as the mapper sees them."""
    half = ROWS // 2
    return [
        {
            "partition": "p0" if i % 2 == 0 else "p1",
            "offset": (i % half) * 2 + (i >= half),
            "user": f"u{i % 6}",
            "points": i % 7 + 1,
        }
        for i in range(ROWS)
    ]


def srcs(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{r['partition']}:{r['offset']}" for r in rows)


def points(rows: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        out[r["user"]] = out.get(r["user"], 0.0) + r["points"]
    return out


class Env:
    """The output journals (``url``, ``store``) and stage A's cluster (``urls``, ``prefix``)."""

    def __init__(self, url: str, store: Any, shards: LocalShards) -> None:
        self.url, self.store, self.urls = url, store, shards.urls
        self.prefix, self.app = f"pc{next(_ids)}:", f"pa{next(_ids)}"
        self.cluster = Cluster.from_urls(shards.urls, prefix=self.prefix)

    def sink(self, mapper: Any = derive, **kw: Any) -> PositionedSink:
        return PositionedSink(self.urls, mapper, self.app, prefix=self.prefix, publish=self.url, flush=16, **kw)

    def read(self, committed: bool, acks: bool = False) -> list[Any]:
        out = []
        for journal in OUTPUTS:
            spec = JournalSpec(journal, {"content-type": CONTENT_TYPE_NDJSON})
            it: Any = (
                ReadCommittedIter(self.store, spec, Sequencer()) if committed else ReadUncommittedIter(self.store, spec)
            )
            out += [e for e in it if acks or not e.is_ack]
        return out

    def committed(self) -> list[str]:
        return sorted(e.message.doc["src"] for e in self.read(committed=True))

    def board(self) -> dict[str, float]:
        """Stage B (a Consumer reading the outputs read-committed) run once into a board of its own."""
        with Consumer(self.cluster, self.store, stage_b, f"pb{next(_ids)}", selector=B_SELECTOR) as b:
            b.poll()
        return board(self.cluster)


@pytest.fixture(params=["file", "stream"])
def env(request: pytest.FixtureRequest, tmp_path: Path, shards: LocalShards) -> Iterator[Env]:
    if request.param == "file":
        root = tmp_path / "journals"
        url, store = f"file://{root}", FileJournals(root)
    else:
        url = f"{shards.urls[0]}?prefix=pcj{next(_ids)}:"
        store = RedisJournals.from_url(url)
    create(store)
    e = Env(url, store, shards)
    yield e
    e.cluster.close()
    store.close()


def test_a_batch_cut_over_two_tasks_publishes_once_and_its_replays_nothing(spark: Any, env: Env) -> None:
    """Each partition's rows of the batch are in both of the source's tasks (test_positioned_split): the
    sink's shuffle brings them into one transaction. The same batch again (a lost Spark commit) and through a
    new sink (a new checkpoint directory, a restarted driver) publishes nothing that commits."""
    rows = split_rows()
    sink = env.sink()
    sink(split_batch(spark), 0)
    assert (sink.history[0].delivered, sink.history[0].published) == (ROWS, ROWS)
    assert env.committed() == srcs(rows)
    sink(split_batch(spark), 0)  # the batch again
    env.sink()(split_batch(spark), 0)  # a new sink: batch ids from 0 again, the same offsets
    assert env.committed() == srcs(rows)
    assert len(env.read(committed=False)) == ROWS  # nothing appended again, even uncommitted
    assert sink.history[1].published == 0 and sink.history[1].seen == ROWS and sink.history[1].delivered == 0
    assert env.board() == points(rows)
    assert env.cluster.counters(["rows"])["rows"] == {"p0": ROWS // 2, "p1": ROWS // 2}
    # The partitions' checkpoints, as `zcluster consumers` shows them (with the journal store given).
    held = {p.journal: p for p in progress(env.cluster, env.app, env.store)}
    assert {name: (p.offset, p.error) for name, p in held.items()} == {"~-/p0": (238, None), "~-/p1": (240, None)}
    assert all(p.generation == 3 and p.ack_intents for p in held.values())  # three claims: one per batch run


def derive_topics(row: dict[str, Any]) -> list[Any]:
    """``derive`` for rows with a topic column: counted per (topic, partition), the topic in the message."""
    user, src = row["user"], f"{row['topic']}:{row['partition']}:{row['offset']}"
    message = JsonMessage({"user": user, "pts": row["points"], "src": src})
    return [Count("rows", f"{row['topic']}/{row['partition']}", 1), Publish(OUTPUTS[fnv1a32(user) % 2], message)]


def test_two_topics_sharing_a_partition_number_in_one_task_publish_each_row_once(spark: Any, env: Env) -> None:
    """One shuffle partition puts (A, 0) and (B, 0) into one task: each is its own transaction and checkpoint
    (``~A/0``, ``~B/0``), including for a new sink re-reading the same offsets. Before, the task ran them as
    one group under A's checkpoint: B's rows below A's offset were skipped (never counted nor published), B's
    later rows published under A's checkpoint, and re-reading them committed some messages twice."""
    batches = [{"A": range(100, 105)}, {"A": range(105, 107), "B": range(5)}, {"B": range(5, 10)}]
    every = [f"{t}:0:{o}" for b in batches for t, span in b.items() for o in span]
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        sink = env.sink(derive_topics)
        for batch_id, offsets in enumerate(batches):
            sink(two_topics(spark, offsets), batch_id)
        assert [h.published for h in sink.history] == [5, 7, 5]
        again = env.sink(derive_topics)  # a new checkpoint directory re-reading the same offsets
        again(two_topics(spark, {"A": range(105, 107), "B": range(10)}), 0)
        assert (again.history[0].published, again.history[0].seen) == (0, 12)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    assert env.committed() == sorted(every)  # each derived message committed exactly once
    assert len(env.read(committed=False)) == len(every)  # nothing appended again, even uncommitted
    assert env.cluster.counters(["rows"])["rows"] == {"A/0": 7, "B/0": 10}
    held = {p.journal: p.offset for p in progress(env.cluster, env.app)}
    assert held == {"~A/0": 107, "~B/0": 10}


def arm_failing_save(marker: str) -> None:
    """In the Python worker running the task: its checkpoint saves fail until ``marker`` exists, the first
    one creating it (the task dies with its messages appended, its checkpoint not saved)."""
    from zcluster.state import txn

    if getattr(txn.TxnStore.save_journal, "marker", None) == marker:
        return
    save = txn.TxnStore.save_journal

    def failing(self: Any, journal: str, saved: Any) -> Any:
        if not os.path.exists(marker):
            Path(marker).write_text(journal)
            raise RuntimeError(f"injected: the task dies after publishing, before saving {journal}")
        return save(self, journal, saved)

    failing.marker = marker  # type: ignore[attr-defined]
    txn.TxnStore.save_journal = failing  # type: ignore[method-assign]


class FailingSave:
    """``derive``, arming :func:`arm_failing_save` in each worker it runs in."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, row: dict[str, Any]) -> list[Any]:
        arm_failing_save(self.marker)
        return derive(row)


def write_files(src: Path, files: int, per_file: int) -> list[dict[str, Any]]:
    """JSON files of rows ``{partition, offset, user, points}``, offsets growing per partition across files
    (taken in that order: by mtime)."""
    src.mkdir()
    offsets = {"p0": 0, "p1": 0, "p2": 0}
    rows = []
    for f in range(files):
        lines = []
        for i in range(per_file):
            n = f * per_file + i
            part = f"p{i % 3}"
            row = {"partition": part, "offset": offsets[part], "user": f"u{n % 9}", "points": n % 5 + 1}
            offsets[part] += 1
            rows.append(row)
            lines.append(json.dumps(row))
        path = src / f"part-{f:03d}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
    return rows


def run_query(spark: Any, src: Path, sink: Any, checkpoint: Path) -> None:
    query = (
        spark.readStream.schema("partition STRING, offset LONG, user STRING, points LONG")
        .option("maxFilesPerTrigger", "4")
        .json(str(src))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(300), "the query never finished"
    assert query.exception() is None


def test_a_task_dying_between_its_publish_and_its_save_then_replays_publish_each_message_once(
    spark: Any, env: Env, tmp_path: Path
) -> None:
    """A streaming query (the JSON file source, 4 files a batch packed into two tasks on ``local[2]``): the first
    checkpoint save of any task fails once, after the transaction appended its messages; Spark runs the task
    again. Then the last batch is run again (its Spark commit removed) and every batch from a new checkpoint
    directory: read committed, each derived message once; the failed attempt's messages stay uncommitted."""
    rows = write_files(tmp_path / "src", files=8, per_file=24)
    marker = tmp_path / "failed"
    sink = env.sink(FailingSave(str(marker)))
    run_query(spark, tmp_path / "src", sink, tmp_path / "ckpt")
    assert marker.exists()  # a save failed, and Spark ran its task again
    assert env.committed() == srcs(rows)
    assert len(sink.history) == 2 and sum(b.published for b in sink.history) == len(rows)
    failed = len(env.read(committed=False)) - len(rows)
    assert failed > 0  # the failed attempt's messages are in the journals, never committed
    commits = ckpt_commits(tmp_path / "ckpt")
    commits[-1].unlink()  # Spark lost its last commit: the batch runs again
    (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    again = env.sink()
    run_query(spark, tmp_path / "src", again, tmp_path / "ckpt")
    run_query(spark, tmp_path / "src", again, tmp_path / "ckpt2")
    assert env.committed() == srcs(rows)
    assert len(env.read(committed=False)) == len(rows) + failed
    assert len(again.history) == 3 and sum(b.published for b in again.history) == 0
    assert sum(b.seen for b in again.history) == len(rows) + len(rows) // 2  # the last batch, then all
    assert env.board() == points(rows)


def ckpt_commits(checkpoint: Path) -> list[Path]:
    return sorted((p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def batch(rows: list[dict[str, Any]]) -> Iterator[Any]:
    return iter([pa.RecordBatch.from_pylist(rows)])


def test_a_zombie_attempt_saving_after_a_newer_claim_is_fenced_and_never_commits(env: Env) -> None:
    """No Spark: the sink's task function run twice on the same rows (a task attempt and its retry, or a
    speculative copy). The first claims the partition and stalls in its mapper; the second claims, publishes
    and saves; the first then appends its messages and its save raises FencedError: its intents are never
    appended, its messages never committed."""
    rows = [r for r in split_rows() if r["partition"] == "p0"][:30]
    claimed, resume = threading.Event(), threading.Event()

    def stalling(row: dict[str, Any]) -> list[Any]:
        claimed.set()  # the claim is made before the first row is mapped
        assert resume.wait(120)
        return derive(row)

    raised: list[BaseException] = []

    def zombie() -> None:
        try:
            list(replace(env.sink().job, mapper=stalling).run(batch(rows)))  # unpicklable: no check
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=zombie)
    thread.start()
    try:
        assert claimed.wait(120), raised
        list(env.sink().job.run(batch(rows)))  # the newer attempt: claims, publishes, saves, appends its ACKs
    finally:
        resume.set()
        thread.join(120)
    assert len(raised) == 1 and isinstance(raised[0], FencedError), raised
    assert env.committed() == srcs(rows)
    envelopes = env.read(committed=False, acks=True)
    messages = [e for e in envelopes if not e.is_ack]
    assert len(messages) == 2 * len(rows)  # the zombie appended its messages, uncommitted
    producers = {get_producer_id(e.uuid) for e in messages}
    acked = {get_producer_id(e.uuid) for e in envelopes if e.is_ack}
    assert len(producers) == 2 and len(acked) == 1  # the zombie's producer id is never ACKed
    assert env.board() == points(rows)


def test_a_fenced_save_adopted_by_the_newer_claim_commits_once_through_it(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Spark: an attempt's save lands, then a newer attempt claims (reading that save as the newest: it
    adopts it, appends its intents and skips every row) before the first reads its save back, which raises
    FencedError. The FencedError does not mean "never commits": the first attempt's messages commit once,
    through the newer claim, and nothing is published twice."""
    rows = [r for r in split_rows() if r["partition"] == "p0"][:20]
    save, records = txn.TxnStore.save_journal, txn.TxnStore._records
    saving, newer = [False], []

    def flagged(self: txn.TxnStore, journal: str, saved: Any) -> Any:
        saving[0] = True
        try:
            return save(self, journal, saved)
        finally:
            saving[0] = False

    def claimed_before_read_back(self: txn.TxnStore, journal: str) -> Any:
        if saving[0] and not newer:  # the first save's read-back: its record landed
            saving[0] = False
            newer.append(list(env.sink().job.run(batch(rows))))  # the newer attempt, start to end
        return records(self, journal)

    monkeypatch.setattr(txn.TxnStore, "save_journal", flagged)
    monkeypatch.setattr(txn.TxnStore, "_records", claimed_before_read_back)
    with pytest.raises(FencedError, match="may have adopted it"):
        list(env.sink().job.run(batch(rows)))
    (stats,) = newer[0]
    assert json.loads(stats.column("stats")[0].as_py())["published"] == 0  # it adopted the save: skipped all
    assert env.committed() == srcs(rows)  # the fenced attempt's messages, committed once
    assert len(env.read(committed=False)) == len(rows)
    assert env.board() == points(rows)


def test_acks_lost_after_the_save_are_appended_by_the_next_attempts_claim(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Spark: a task attempt saves its checkpoint and dies before appending its ACK intents (the append
    fails); nothing it published is read committed, `zcluster consumers` shows the intents pending. The next
    attempt's claim appends them: each message committed once, the attempt itself publishing nothing."""
    rows = [r for r in split_rows() if r["partition"] == "p1"][:20]  # offsets 2, 6, ... 78
    append = txn.Publishing._append

    def failing(self: txn.Publishing, intents: list[Any]) -> None:
        if intents:  # a commit's (the first claim has none to append again)
            raise OSError("injected: the task dies after its save, before its ACKs")
        append(self, intents)

    monkeypatch.setattr(txn.Publishing, "_append", failing)
    with pytest.raises(OSError, match="before its ACKs"):
        list(env.sink().job.run(batch(rows)))
    monkeypatch.setattr(txn.Publishing, "_append", append)
    assert env.committed() == [] and len(env.read(committed=False)) == len(rows)
    (held,) = progress(env.cluster, env.app, env.store)
    targets = sorted({derive(r)[1].journal for r in rows})
    assert (held.journal, held.offset, sorted(held.ack_intents)) == ("~-/p1", rows[-1]["offset"] + 1, targets)
    sink = env.sink()
    (stats,) = list(sink.job.run(batch(rows)))
    assert env.committed() == srcs(rows)
    assert len(env.read(committed=False)) == len(rows)  # nothing published again
    assert json.loads(stats.column("stats")[0].as_py())["published"] == 0
    assert env.board() == points(rows)


def test_a_publish_without_a_journal_store_is_a_mapper_error(spark: Any, shards: LocalShards) -> None:
    sink = PositionedSink(shards.urls, derive, f"np{next(_ids)}", prefix=f"np{next(_ids)}:")
    with pytest.raises(Exception, match="publish=") as info:
        sink(split_batch(spark), 0)
    assert MapperError.__name__ in str(info.value) and "offset" in str(info.value)


CONNECT = textwrap.dedent(
    """
    import json, sys
    sys.path[:0] = sys.argv[1:3]
    from test_positioned_chains import derive
    from test_positioned_split import split_batch
    from zcluster.spark import local_session
    from zcluster.spark.positioned import PositionedSink

    spark = local_session("local[2]", connect=True)
    try:
        name, publish, urls = sys.argv[3], sys.argv[4], sys.argv[5:]
        published = []
        for _ in range(2):  # the batch, then the batch again through a new sink (a new checkpoint directory)
            sink = PositionedSink(urls, derive, name, prefix=name + ":", publish=publish)
            sink(split_batch(spark), 0)
            published.append(sink.history[0].published)
        print(json.dumps(published))
    finally:
        spark.stop()
    """
)


@pytest.mark.parametrize("env", ["stream"], indirect=True)
def test_a_positioned_sink_publishes_once_on_spark_connect(env: Env) -> None:
    """The split batch through a Spark Connect session, twice (the second time through a new sink): published
    once, read committed once (Redis Streams journals)."""
    name = f"pcx{uuid.uuid4().hex[:8]}"
    here = Path(__file__).parent
    path = os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", CONNECT, str(here), str(here.parent / "state"), name, env.url, *env.urls],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [ROWS, 0]
    assert env.committed() == srcs(split_rows())
    assert env.board() == points(split_rows())


def test_a_sinks_task_job_shows_no_password_in_its_repr() -> None:
    """A task's job is in Spark's error reports and tracebacks: its URLs must not show their password (the
    cluster's config redacts its own; ``journals`` and ``publish`` were shown as given)."""
    urls = ["redis://:hunter2@127.0.0.1:1/0"]
    journals, publish = "redis://:hunter2@127.0.0.1:2/0?prefix=j:", "redis://u:hunter2@127.0.0.1:3/0?prefix=o:"
    positioned = PositionedSink(urls, derive, "pw", publish=publish)
    sink = ZClusterSink(urls, derive, "pw", journals=journals, publish=publish)
    for job in (positioned.job, sink.job):
        assert "hunter2" not in repr(job) and "hunter2" not in str(job)
    assert (sink.job.journals, sink.job.publish, positioned.job.publish) == (journals, publish, publish)


@pytest.mark.parametrize("env", ["file"], indirect=True)
def test_an_operator_restart_of_a_partition_checkpoint_is_refused(env: Env) -> None:
    """No Spark: a ``~<topic>/<partition>`` checkpoint follows the source's offsets. Restarted at offset 0, the
    same rows read again would publish and commit their derived messages a second time (their increments
    fenced): refused, nothing changed."""
    rows = [r for r in split_rows() if r["partition"] == "p0"][:10]
    list(env.sink().job.run(batch(rows)))
    state = StateStore(env.cluster, env.app)
    before = txn.TxnStore(state).load("~-/p0")
    with pytest.raises(ConfigError, match=r"~-/p0 is a PositionedSink's checkpoint .* new query_name") as info:
        state.restart_journal("~-/p0", reason="test", publish=env.store)
    assert env.app in str(info.value)
    assert txn.TxnStore(state).load("~-/p0") == before and state.audit() == []
    list(env.sink().job.run(batch(rows)))  # the same rows again: nothing more commits
    assert env.committed() == srcs(rows)
