"""``spark.read.format("zcluster")`` in local Spark against real Redis servers: standalone shards and a Redis
Cluster, by pattern and by key list, limits, tombstones, bad options, a killed shard."""

from __future__ import annotations

import json
from typing import Any

import pytest

from zcluster import Cluster, KeyScoreMember
from zcluster.testing import LocalShards

pytestmark = pytest.mark.spark


def fill(cluster: Cluster) -> dict[str, list[tuple[str, float]]]:
    """60 keys ``u:<i>`` of 1..5 members, two members deleted, and ``other:x``; returns the expected members
    of the ``u:*`` keys, highest score first."""
    rows = [KeyScoreMember(f"u:{i}", float(j), f"m{j}") for i in range(60) for j in range(1 + i % 5)]
    cluster.insert([*rows, KeyScoreMember("other:x", 1.0, "x")])
    cluster.delete([KeyScoreMember("u:4", 9.0, "m4"), KeyScoreMember("u:gone", 1.0, "ghost")])
    state = cluster.select([f"u:{i}" for i in range(60)], limit=99)
    return {k: [(t.member, t.score) for t in v] for k, v in state.items()}


def rows(df: Any) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {}
    for r in df.collect():
        out.setdefault(r["key"], []).append(tuple(r)[1:])
    return {k: sorted(v, key=lambda t: (-t[0], t[1])) for k, v in out.items()}


def read(spark: Any, where: dict[str, str], **options: str) -> Any:
    reader = spark.read.format("zcluster")
    for name, value in {**where, **options}.items():
        reader = reader.option(name, value)
    return reader.load()


def members(state: dict[str, list[tuple[str, float]]]) -> dict[str, list[tuple[Any, ...]]]:
    return {k: sorted(((s, m) for m, s in v), key=lambda t: (-t[0], t[1])) for k, v in state.items() if v}


def test_pattern_keys_limit_and_tombstones_on_standalone_shards(spark: Any, shards: Any, prefix: str) -> None:
    cluster = Cluster.from_urls(shards.urls, prefix=prefix)
    expected = fill(cluster)
    where = {"urls": ",".join(shards.urls), "prefix": prefix}

    df = read(spark, where, pattern="u:*")
    assert df.schema.simpleString() == "struct<key:string,score:double,member:string>"
    assert df.rdd.getNumPartitions() == 2  # one per shard
    got = rows(df)
    assert got == members(expected)
    assert len({cluster.shard_of(k) for k in got}) == 2  # both shards' keys came

    listed = read(spark, where, keys=json.dumps(["u:3", "u:4", "u:3", "nothing"]), numPartitions="2")
    assert rows(listed) == {k: members(expected)[k] for k in ("u:3", "u:4")}  # u:3 once, though listed twice
    assert rows(read(spark, where, keys=" u:1 ,u:2")) == {k: members(expected)[k] for k in ("u:1", "u:2")}

    top = rows(read(spark, where, pattern="u:*", limit="2"))
    assert top == {k: v[:2] for k, v in members(expected).items()}

    # Tombstones: u:4's deleted m4, and u:gone, which holds nothing else, come with inserted = false.
    both = rows(read(spark, where, pattern="u:*", tombstones="TRUE"))
    assert both["u:4"] == [(9.0, "m4", False), *((s, m, True) for s, m in members(expected)["u:4"] if m != "m4")]
    assert both["u:gone"] == [(1.0, "ghost", False)]
    assert {k: [(s, m) for s, m, ins in v if ins] for k, v in both.items() if k != "u:gone"} == members(expected)
    cluster.close()


def test_nothing_matching_and_unknown_options(spark: Any, shards: Any, prefix: str) -> None:
    where = {"urls": ",".join(shards.urls), "prefix": prefix}
    empty = read(spark, where, pattern="no-such-*", tombstones="true")
    assert empty.collect() == []
    assert empty.columns == ["key", "score", "member", "inserted"]
    assert read(spark, where, keys="[]").collect() == []
    with pytest.raises(Exception, match="does not know option\\(s\\) colour; known: urls, cluster_url"):
        read(spark, where, pattern="*", colour="red").collect()
    with pytest.raises(Exception, match="'keys' or 'pattern', not both"):
        read(spark, where, pattern="*", keys="a").collect()
    with pytest.raises(Exception, match="option limit must be an integer from 1 to 4611686018427387904, not '0'"):
        read(spark, where, limit="0").collect()


def test_a_killed_shard_fails_the_read_naming_it(spark: Any, prefix: str) -> None:
    with LocalShards(2) as own:
        cluster = Cluster.from_urls(own.urls, prefix=prefix)
        fill(cluster)
        where = {"urls": ",".join(own.urls), "prefix": prefix}
        assert len(read(spark, where, pattern="u:*").collect()) == sum(1 + i % 5 for i in range(60)) - 1
        dead = cluster.shards[1]
        own.kill(1)
        with pytest.raises(Exception, match=f"shard\\(s\\) not fully scanned: {dead}"):
            read(spark, where, pattern="u:*").collect()
        keys = [f"u:{i}" for i in range(60)]
        with pytest.raises(Exception, match=f"failed shard\\(s\\): {dead}"):
            read(spark, where, keys=",".join(keys)).collect()
        cluster.close()


def test_a_redis_cluster_by_pattern_and_the_writer_is_the_same_source(
    spark: Any, redis_cluster: Any, prefix: str
) -> None:
    cluster = Cluster.from_cluster_url(redis_cluster.url, prefix=prefix)
    expected = fill(cluster)
    where = {"cluster_url": redis_cluster.url, "prefix": prefix}
    df = read(spark, where, pattern="u:*")
    assert df.rdd.getNumPartitions() == 3  # one per master
    assert rows(df) == members(expected)
    # What the reader gives, the writer takes (op defaults to insert): a copy under another prefix.
    df.write.format("zcluster").option("cluster_url", redis_cluster.url).option("prefix", prefix + "copy:").mode(
        "append"
    ).save()
    assert rows(read(spark, {**where, "prefix": prefix + "copy:"})) == members(expected)
    cluster.close()


def test_a_store_with_max_size_or_roshi_routing_reads_with_the_options_it_was_written_with(
    spark: Any, shards: Any, prefix: str
) -> None:
    # Issue 37: a store with max_size could not be read (the guard wants max_size=50, the reader did not know
    # the option). The reader now takes every option of the writer's, from the one parser.
    where = {"urls": ",".join(shards.urls), "prefix": prefix}
    rows_in = [(f"k{i}", float(j), f"m{j}") for i in range(20) for j in range(3)]
    written = spark.createDataFrame(rows_in, "key string, score double, member string")
    writer = written.write.format("zcluster").mode("append")
    for name, value in {**where, "max_size": "50"}.items():
        writer = writer.option(name, value)
    writer.save()
    expected = {f"k{i}": [(float(j), f"m{j}") for j in (2, 1, 0)] for i in range(20)}
    assert rows(read(spark, where, max_size="50")) == expected
    with pytest.raises(Exception, match="max_size=50"):  # the guard: the store was laid out with it
        read(spark, where).collect()
    with pytest.raises(Exception, match="option max_size must be a positive integer, not 'many'"):
        read(spark, where, max_size="many").collect()

    roshi = {"urls": ",".join(shards.urls), "prefix": prefix + "r:", "routing": "roshi"}
    with Cluster.from_urls(shards.urls, prefix=prefix + "r:", routing="roshi") as cluster:
        cluster.insert([KeyScoreMember(f"r{i}", 1.0, "m") for i in range(20)])
        assert len({cluster.shard_of(f"r{i}") for i in range(20)}) == 2
    assert rows(read(spark, roshi)) == {f"r{i}": [(1.0, "m")] for i in range(20)}
    with pytest.raises(Exception, match=r"(?i)routing"):
        read(spark, {**roshi, "routing": "jump"}).collect()
    with pytest.raises(Exception, match="unknown routing 'hash'"):
        read(spark, {**roshi, "routing": "hash"}).collect()
