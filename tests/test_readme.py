"""The README's examples run as printed: the first example, the publisher's, then the plain consumer's reading
what it published, the chain's, the farm's, the migration's; and deploy/README.md's exporter.

Only the servers' addresses are replaced (by local servers and a namespace of this test), and the consumer's
endless ``run`` line is left out; a snippet that no longer runs, or no longer does what its comments say,
fails here. The Spark snippets are not run here: :data:`NOT_RUN_HERE` says why, and a test checks that every
README snippet is either run here or listed there."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import zcluster
from zcluster.testing import LocalShards, free_port

README_PATH = Path(__file__).resolve().parents[1] / "README.md"
README = README_PATH.read_text()


def snippet(marker: str) -> str:
    """The README's one ```python block containing `marker`."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README, re.S) if marker in b]
    assert len(blocks) == 1, f"expected one README python block with {marker!r}, found {len(blocks)}"
    return blocks[0]


def test_the_publisher_and_the_consumer_examples_run_as_printed(shards: LocalShards, prefix: str) -> None:
    journals = f"{shards.urls[0]}?prefix={prefix}j:"
    publish = snippet("AsyncPublisher(store)").replace("redis://127.0.0.1:7001?prefix=j:", journals)
    assert journals in publish
    consume = snippet('with Consumer(cluster, "file:///data/journals"').replace(
        '"file:///data/journals"', repr(journals)
    )
    consume = consume.replace('zcluster.connect("redis://127.0.0.1:7001")', "zcluster.connect(URLS, prefix=PREFIX)")
    consume = "\n".join(line for line in consume.splitlines() if "consumer.run(" not in line)
    assert repr(journals) in consume and "URLS" in consume

    exec(compile(publish, "README publisher", "exec"), {})
    exec(compile(publish, "README publisher, again", "exec"), {})  # journals exist: created once, used twice
    exec(compile(consume, "README consumer", "exec"), {"URLS": shards.urls, "PREFIX": prefix})

    cluster = zcluster.connect(shards.urls, prefix=prefix)
    try:
        # Both runs' messages are committed; the second copy of each writes the same tuple (idempotent).
        got = cluster.select(["timeline:42", "timeline:7"], limit=10)
        assert [(m.member, m.score) for m in got["timeline:42"]] == [("e-1", 1700000000.25)]
        assert [(m.member, m.score) for m in got["timeline:7"]] == [("e-2", 1700000000.5)]
    finally:
        cluster.close()


def test_the_migration_example_runs_as_printed(prefix: str) -> None:
    code = snippet("from zcluster.migration import migrate")
    with LocalShards(3) as three:
        a, b, c = three.urls
        for old, new in (("redis://a:6379", a), ("redis://b:6379", b), ("redis://c:6379", c)):
            assert old in code
            code = code.replace(f'"{old}"', repr(new))
        code = code.replace("])\nprint", f"], prefix={prefix!r})\nprint")  # the test's namespace
        assert f"prefix={prefix!r}" in code
        with zcluster.Cluster.from_urls([a, b], prefix=prefix) as before:
            before.insert([(f"k{i}", 1.0, "m") for i in range(300)])
        scope: dict[str, object] = {}
        exec(compile(code, "README migration", "exec"), scope)
        report = scope["report"]
        assert report.copied > 0 and report.pause < 60  # type: ignore[attr-defined]
        with zcluster.Cluster.from_urls([a, b, c], prefix=prefix) as after:
            assert all(v for v in after.select([f"k{i}" for i in range(300)]).values())


def test_the_chain_example_runs_as_printed(shards: LocalShards, prefix: str, tmp_path: Path) -> None:
    from zcluster.journal.files import FileJournals
    from zcluster.message import Flags, build_uuid, format_uuid
    from zcluster.message.framing import CONTENT_TYPE_NDJSON
    from zcluster.message.journals import JournalSpec
    from zcluster.message.readers import ReadCommittedIter
    from zcluster.message.sequencer import Sequencer

    code = snippet("publish=")
    events, scores = tmp_path / "events", tmp_path / "scores"
    for old, new in (("file:///data/events", f"file://{events}"), ("file:///data/scores", f"file://{scores}")):
        assert old in code
        code = code.replace(f'"{old}"', repr(new))
    code = code.replace('zcluster.connect("redis://127.0.0.1:7001")', "zcluster.connect(URLS, prefix=PREFIX)")
    with FileJournals(events) as store:
        store.create(JournalSpec("e/0", {"content-type": CONTENT_TYPE_NDJSON}))
        items = ["a", "b", "a"]
        producer = b"\x01" * 6
        uuids = [format_uuid(build_uuid(producer, (i + 1) << 4, Flags.OUTSIDE_TXN)) for i in range(len(items))]
        store.append_many(
            "e/0", [json.dumps({"UUID": u, "item": x}).encode() + b"\n" for u, x in zip(uuids, items, strict=True)]
        )
    assert not scores.exists()  # the snippet creates its downstream journal itself (it used to fail without)

    for _ in range(2):  # a second run delivers nothing again, publishes nothing again
        exec(compile(code, "README chain", "exec"), {"URLS": shards.urls, "PREFIX": prefix})

    with FileJournals(scores) as store:
        spec = JournalSpec("scores/part-0", {"content-type": CONTENT_TYPE_NDJSON})
        derived = [e.message.doc for e in ReadCommittedIter(store, spec, Sequencer()) if not e.is_ack]
    assert sorted(d["item"] for d in derived) == ["a", "a", "b"]  # each event's derived message, committed once
    with zcluster.connect(shards.urls, prefix=prefix) as cluster:
        assert cluster.counters(["views"])["views"] == {"a": 2, "b": 1}


def test_the_first_example_runs_as_printed(shards: LocalShards, prefix: str) -> None:
    code = snippet("c.apply([Insert(")
    listed = '["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"], max_size=10_000'
    assert listed in code
    code = code.replace(listed, "URLS, max_size=10_000, prefix=PREFIX")
    exec(compile(code, "README first example", "exec"), {"URLS": shards.urls, "PREFIX": prefix})
    with zcluster.connect(shards.urls, prefix=prefix, max_size=10_000) as cluster:
        assert cluster.select(["timeline:42"])["timeline:42"] == []  # the newer delete won


def test_the_farm_example_runs_as_printed() -> None:
    code = snippet("from zcluster.farm import Farm")
    with LocalShards(3) as three:
        olds = ("redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379")
        for old, new in zip(olds, three.urls, strict=True):
            assert f'"{old}"' in code
            code = code.replace(f'"{old}"', repr(new))
        scope: dict[str, object] = {}
        exec(compile(code, "README farm", "exec"), scope)
        assert scope["r"].confirmed == [3]  # type: ignore[attr-defined]
        scope["farm"].close()  # type: ignore[attr-defined]


def test_the_deploy_exporter_example_runs_as_printed(shards: LocalShards, prefix: str, tmp_path: Path) -> None:
    """deploy/README.md's exporter, in its own process (it registers into prometheus_client's global
    registry and serves until the process ends): it lacked an import, and bound every interface."""
    text = (README_PATH.parent / "deploy" / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    assert 'addr="127.0.0.1"' in code and "from zcluster.state import Consumer" in code
    port = free_port()
    code = code.replace("start_http_server(9108,", f"start_http_server({port},").replace('"app:"', repr(prefix))
    prologue = f"urls = {shards.urls!r}\njournals = {f'file://{tmp_path}'!r}\ndef mapper(msg):\n    return []\n"
    epilogue = (
        "import urllib.request\n"
        "consumer.poll()\n"
        f"print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics', timeout=30).read().decode())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", prologue + code + epilogue], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert 'zcluster_applier_batches_total{app="myapp"} 1.0' in done.stdout
    assert "zcluster_shard_errors_total" in done.stdout  # at 0 before any error (issue 39, item 7)


RUN_HERE = (
    "c.apply([Insert(",
    'with Consumer(cluster, "file:///data/journals"',
    "AsyncPublisher(store)",
    "publish=",
    "from zcluster.farm import Farm",
    "from zcluster.migration import migrate",
)
"""Markers of the README snippets the tests above run as printed."""
NOT_RUN_HERE = {
    '"timelines", journals="file:///data/journals")': "a streaming query that runs until stopped (Spark)",
    "import jobs": "a driver importing the reader's own module (Spark)",
    'spark.read.format("zcluster")': "a fragment: `spark` is the reader's session (tests/spark/test_reader.py)",
    'spark.read.format("zcluster-journal")': "a fragment: `spark` is the reader's session (tests/spark/)",
    'mapper, "stats"': "a Spark sink beside the cluster calls (tests/spark/test_sink_increments.py)",
}
"""The README snippets not run here, and why."""


def test_every_readme_snippet_is_run_here_or_says_why_not() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    for block in blocks:
        found = [m for m in (*RUN_HERE, *NOT_RUN_HERE) if m in block]
        assert len(found) == 1, f"a README snippet matched by {found} (want one marker):\n{block}"
    assert len(blocks) == len(RUN_HERE) + len(NOT_RUN_HERE)
