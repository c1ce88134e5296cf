"""``spark.read.format("zcluster")`` of aggregate keys (``kind`` = totals, counts, aggregates) and of a farm
(``replicas`` with a read strategy, one replica diverged), in local Spark against real Redis servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Count, Incr, KeyScoreMember
from zcluster.spark.reader import TupleReader
from zcluster.testing import LocalShards

pytestmark = pytest.mark.spark


def read(spark: Any, where: dict[str, str], **options: str) -> Any:
    reader = spark.read.format("zcluster")
    for name, value in {**where, **options}.items():
        reader = reader.option(name, value)
    return reader.load()


def fill(cluster: Cluster) -> None:
    """Leaderboards ``lb:<i>`` (sums), counters ``cnt:<i>``, 2P-sets ``u:<i>``."""
    incs: list[Any] = [Incr(f"lb:{i}", f"p{j}", float(j * 10 + i)) for i in range(20) for j in range(1 + i % 4)]
    incs += [Count(f"cnt:{i}", f"f{j}", j + 1 + 2**40) for i in range(20) for j in range(1 + i % 3)]
    cluster.increment("src", list(enumerate(incs)))
    cluster.insert([KeyScoreMember(f"u:{i}", 1.0, "m") for i in range(5)])


def test_leaderboards_and_counters_with_their_kind_and_another_kind_refused(
    spark: Any, shards: Any, prefix: str
) -> None:
    cluster = Cluster.from_urls(shards.urls, prefix=prefix)
    fill(cluster)
    where = {"urls": ",".join(shards.urls), "prefix": prefix}
    totals = read(spark, where, pattern="lb:*", kind="totals")
    assert totals.schema.simpleString() == "struct<key:string,kind:string,member:string,total:double,count:bigint>"
    expected = {
        k: [("totals", t.member, t.score, None) for t in v]
        for k, v in cluster.top([f"lb:{i}" for i in range(20)], 0, 99).items()
    }
    got: dict[str, list[tuple[Any, ...]]] = {}
    for r in totals.collect():
        got.setdefault(r["key"], []).append(tuple(r)[1:])
    assert {k: sorted(v, key=lambda t: -t[2]) for k, v in got.items()} == expected

    top = read(spark, where, pattern="cnt:*", kind="counts", limit="2").collect()
    counters = cluster.counters([f"cnt:{i}" for i in range(20)])
    want = {
        (k, "counts", f, None, c)
        for k, fields in counters.items()
        for c, f in sorted(((c, f) for f, c in fields.items()), reverse=True)[:2]
    }
    assert {tuple(r) for r in top} == want and len(top) == len(want)
    assert max(r["count"] for r in top) == 3 + 2**40  # int64, exact

    both = read(spark, where, keys="lb:3,cnt:2,nothing", kind="aggregates").collect()
    assert sorted((r["key"], r["kind"], r["member"]) for r in both) == [
        ("cnt:2", "counts", "f0"), ("cnt:2", "counts", "f1"), ("cnt:2", "counts", "f2"),
        ("lb:3", "totals", "p0"), ("lb:3", "totals", "p1"), ("lb:3", "totals", "p2"), ("lb:3", "totals", "p3"),
    ]  # fmt: skip

    # A key of another kind than the one asked: KeyKindError naming it, whichever way it was met.
    refusals = [
        ({"keys": "u:1,lb:2"}, "key b'lb:2' on .* is a sums \\(Incr\\) aggregate key, not a 2P-set"),
        ({"keys": "cnt:1", "tombstones": "true"}, "key b'cnt:1' .* counters \\(Count\\) aggregate key, not a 2P-set"),
        ({"keys": "u:1", "kind": "totals"}, "key b'u:1' on .* is a 2P-set, not a sums \\(Incr\\) aggregate key"),
        ({"keys": "lb:1", "kind": "counts"}, "key b'lb:1' .* sums \\(Incr\\) aggregate key, not a counters"),
        ({"keys": "cnt:1", "kind": "totals"}, "key b'cnt:1' .* counters \\(Count\\) aggregate key, not a sums"),
        ({"keys": "u:4", "kind": "aggregates"}, "key b'u:4' .* is a 2P-set, not an aggregate key"),
        ({"pattern": "*"}, "KeyKindError: key b'(lb|cnt):"),
    ]
    for options, message in refusals:
        with pytest.raises(Exception, match=message):
            read(spark, where, **options).collect()
    with pytest.raises(Exception, match="option tombstones is for kind 'set'"):
        read(spark, where, kind="totals", tombstones="true").collect()
    with pytest.raises(Exception, match="option kind must be one of set, totals, counts, aggregates, not 'sums'"):
        read(spark, where, kind="sums").collect()
    assert read(spark, where, pattern="none:*", kind="counts").collect() == []
    cluster.close()


def test_a_farm_read_with_a_strategy_and_a_diverged_replica(spark: Any, prefix: str) -> None:
    with LocalShards(2) as a, LocalShards(1) as b:
        one, two = Cluster.from_urls(a.urls, prefix=prefix), Cluster.from_urls(b.urls, prefix=prefix)
        rows = [KeyScoreMember(f"t:{i}", float(j), f"m{j}") for i in range(30) for j in range(3)]
        for c in (one, two):
            c.insert(rows)
            c.increment("src", [(0, Incr("lb", "x", 5.0)), (1, Incr("lb", "y", 2.0))])
        # Replica b diverged: it missed a later insert and a delete, and holds a key replica a never got.
        one.insert([KeyScoreMember("t:0", 9.0, "late")])
        one.delete([KeyScoreMember("t:1", 5.0, "m2")])
        two.insert([KeyScoreMember("only-b", 1.0, "z"), KeyScoreMember("t:1", 7.0, "b-only")])
        two.increment("src", [(2, Incr("lb", "y", 10.0))])  # b's copy leads: its fences hold more
        where = {"replicas": json.dumps([a.urls, b.urls[0]]), "prefix": prefix}

        def held(c: Cluster) -> set[tuple[str, str]]:
            keys = [k for batch in c.keys() for k in batch if k != "lb"]
            return {(k, t.member) for k, v in c.select(keys, limit=99).items() for t in v}

        # "one" reads a single replica's view (round robin), never the merge "all" reads.
        views = [{x for x in held(c) if x[0] in ("t:0", "t:1")} for c in (one, two)]
        for _ in range(3):
            single = read(spark, where, read="one", keys="t:0,t:1", numPartitions="1").collect()
            assert {(r["key"], r["member"]) for r in single} in views
        merged = {(r["key"], r["member"]) for r in read(spark, where, read="all", pattern="[ot]*").collect()}
        assert {("t:0", "late"), ("only-b", "z"), ("t:1", "b-only")} <= merged and ("t:1", "m2") not in merged
        assert len(merged) == 30 * 3 + 1 - 1 + 2
        lb = read(spark, where, keys="lb", kind="totals").collect()
        assert [(r["member"], r["total"]) for r in lb] == [("y", 12.0), ("x", 5.0)]  # the leading copy

        # The merge is neither replica's view (and its read repair made them agree since).
        assert {x for x in merged if x[0] in ("t:0", "t:1")} not in views
        with pytest.raises(Exception, match=r"key b'lb' on replica .* is a sums \(Incr\) aggregate key, not a 2P-set"):
            read(spark, where).collect()
        with pytest.raises(Exception, match="a farm \\(option replicas\\) is read with kind set, totals or counts"):
            read(spark, where, tombstones="true").collect()
        with pytest.raises(Exception, match="option read \\(a farm's read strategy\\) goes with option replicas"):
            read(spark, {"urls": a.urls[0]}, read="one").collect()
        one.close()
        two.close()


CONNECT = textwrap.dedent(
    """
    import json, sys
    from zcluster.spark import local_session

    spark = local_session("local[2]", connect=True)
    try:
        where = {"urls": sys.argv[1], "prefix": sys.argv[2]}
        sets = spark.read.format("zcluster").options(**where, pattern="u:*", limit="1").load()
        totals = spark.read.format("zcluster").options(**where, kind="aggregates").option("keys", "lb:3,cnt:1").load()
        out = {"sets": [list(r) for r in sets.collect()], "aggregates": [list(r) for r in totals.collect()]}
        out["schema"] = totals.schema.simpleString()
        try:
            spark.read.format("zcluster").options(**where, keys="lb:1").load().collect()
        except Exception as error:
            out["refused"] = str(error)
        print(json.dumps(out))
    finally:
        spark.stop()
    """
)


def test_the_reader_on_spark_connect(shards: Any, prefix: str) -> None:
    """Sets, aggregates and a refused key through a Spark Connect session (run it under
    ``flock /tmp/zc-connect.lock``: Connect's port is fixed)."""
    cluster = Cluster.from_urls(shards.urls, prefix=prefix)
    fill(cluster)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", CONNECT, ",".join(shards.urls), prefix],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(map(tuple, out["sets"])) == [(f"u:{i}", 1.0, "m") for i in range(5)]
    assert out["schema"] == "struct<key:string,kind:string,member:string,total:double,count:bigint>"
    want = [["lb:3", "totals", f"p{j}", float(j * 10 + 3), None] for j in (3, 2, 1, 0)]
    want += [["cnt:1", "counts", f"f{j}", j + 1 + 2**40] for j in (1, 0)]
    assert sorted(out["aggregates"], key=str) == sorted(
        [w if len(w) == 5 else [*w[:3], None, w[3]] for w in want], key=str
    )
    assert "key b'lb:1'" in out["refused"] and "is a sums (Incr) aggregate key, not a 2P-set" in out["refused"]
    cluster.close()


def test_every_kind_reads_the_same_rows_over_resp2_and_resp3(shards: Any, prefix: str) -> None:
    """The reader builds its rows from raw replies, whose shapes are the connection's protocol's (pairs and
    maps in RESP3, flat lists in RESP2): the same rows either way. In-process, the reader's own calls."""
    cluster = Cluster.from_urls(shards.urls, prefix=prefix)
    fill(cluster)
    cluster.delete([KeyScoreMember("u:1", 2.0, "m"), KeyScoreMember("u:gone", 1.0, "x")])
    got: dict[int, dict[str, list[Any]]] = {}
    for protocol in (2, 3):
        urls = ",".join(f"{u}?protocol={protocol}" for u in shards.urls)
        options = [
            {"pattern": "u:*"},
            {"pattern": "u:*", "tombstones": "true"},
            {"pattern": "lb:*", "kind": "totals", "limit": "2"},
            {"pattern": "cnt:*", "kind": "counts"},
        ]
        got[protocol] = {}
        for o in options:
            reader = TupleReader({"urls": urls, "prefix": prefix, **o})
            rows = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
            got[protocol][json.dumps(o)] = sorted(rows, key=str)
    assert got[2] == got[3]
    sets, tombstones, totals, counts = got[3].values()
    assert sorted(r["key"] for r in sets) == ["u:0", "u:2", "u:3", "u:4"]
    assert {"key": "u:1", "score": 2.0, "member": "m", "inserted": False} in tombstones
    assert len(totals) == sum(min(2, 1 + i % 4) for i in range(20))
    assert {"key": "cnt:2", "kind": "counts", "member": "f2", "total": None, "count": 3 + 2**40} in counts
    cluster.close()


def test_counts_hide_the_fences_of_one_key_counters_and_read_keys_made_before_it(shards: Any, prefix: str) -> None:
    """A counters key keeps its fences in its totals hash (``lua/incr.lua``): ``counts`` and ``aggregates``
    reads drop them, and still read a key made before that layout (fences in a K- hash), over RESP2 and 3.
    In-process, the reader's own calls."""
    cluster = Cluster.from_urls(shards.urls, prefix=prefix)
    cluster.increment("src", [(1, Count("new", "a", 4)), (2, Count("new", "b", 1))])
    ((shard, kb),) = cluster._encoder.keys(["old"])
    client = cluster._transport.topology.shards[shard].client
    client.hset(cluster._layout.adds(kb), mapping={"a": 2, "c": 9})
    client.hset(cluster._layout.removes(kb), "src", "7:0:0:2")
    ((shard, kb),) = cluster._encoder.keys(["new"])
    assert cluster._transport.topology.shards[shard].client.exists(cluster._layout.removes(kb)) == 0  # one key
    want = {
        ("new", "a", 4), ("new", "b", 1), ("old", "a", 2), ("old", "c", 9),
    }  # fmt: skip
    for protocol in (2, 3):
        urls = ",".join(f"{u}?protocol={protocol}" for u in shards.urls)
        for kind in ("counts", "aggregates"):
            reader = TupleReader({"urls": urls, "prefix": prefix, "keys": "new,old,nothing", "kind": kind})
            rows = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
            assert {(r["key"], r["member"], r["count"]) for r in rows} == want and len(rows) == 4, (protocol, kind)
    cluster.close()
