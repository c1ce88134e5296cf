"""The README's examples run as printed: the publisher's, then the plain consumer's reading what it published.

Only the servers' addresses are replaced (by the session's local shards and a namespace of this test), and
the consumer's endless ``run`` line is left out; a snippet that no longer runs, or no longer does what its
comments say, fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import zcluster
from zcluster.testing import LocalShards

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


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
    with FileJournals(scores) as store:
        store.create(JournalSpec("scores/part-0", {"content-type": CONTENT_TYPE_NDJSON}))

    for _ in range(2):  # a second run delivers nothing again, publishes nothing again
        exec(compile(code, "README chain", "exec"), {"URLS": shards.urls, "PREFIX": prefix})

    with FileJournals(scores) as store:
        spec = JournalSpec("scores/part-0", {"content-type": CONTENT_TYPE_NDJSON})
        derived = [e.message.doc for e in ReadCommittedIter(store, spec, Sequencer()) if not e.is_ack]
    assert sorted(d["item"] for d in derived) == ["a", "a", "b"]  # each event's derived message, committed once
    with zcluster.connect(shards.urls, prefix=prefix) as cluster:
        assert cluster.counters(["views"])["views"] == {"a": 2, "b": 1}
