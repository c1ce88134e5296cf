"""``spark.read.format("zcluster")``'s options and data it cannot give (issue 39, item 10): bad integer options
fail the planning with a ConfigError naming the option and the value; numPartitions is bounded; a key or member
that is not UTF-8 is named with its server; a store whose migration cut over is followed, never an internal
StoreMoved. Real servers and a real migration; the reader driven as Spark's tasks drive it (and one real
Spark read)."""

from __future__ import annotations

from typing import Any

import pytest

from zcluster import Cluster, ConfigError, KeyScoreMember, LayoutMismatchError, NotUtf8Error, PartialScanError
from zcluster.migration import migrate
from zcluster.spark.reader import MAX_PARTITIONS, TupleReader
from zcluster.testing import LocalShards

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("limit", "99999999999999999999999"),  # passed the planning, then failed every task as a shard failure
        ("limit", "²"),  # str.isdigit() says yes, int() a raw ValueError
        ("limit", "9" * 5000),  # int() refuses over 4300 digits
        ("batch", "0"),
        ("batch", "-3"),
        ("numPartitions", "20000"),  # 16,384 one-slot tasks on a Redis Cluster
        ("numPartitions", str(MAX_PARTITIONS + 1)),
    ],
)
def test_a_bad_integer_option_fails_the_planning_naming_it(shards: Any, prefix: str, option: str, value: str) -> None:
    where = {"urls": ",".join(shards.urls), "prefix": prefix}
    with pytest.raises(ConfigError, match=f"option {option.lower()} must be an integer from 1 to ") as info:
        TupleReader({**where, option.lower(): value})  # what Spark's planning calls, on the driver
    assert repr(value)[:40] in str(info.value)


def test_the_bounds_themselves_are_taken(shards: Any, prefix: str) -> None:
    where = {"urls": ",".join(shards.urls), "prefix": prefix}
    reader = TupleReader({**where, "limit": str(1 << 62), "numpartitions": str(MAX_PARTITIONS), "keys": "a,b"})
    assert reader.options.limit == 1 << 62 and reader.options.partitions == MAX_PARTITIONS
    assert len(reader.partitions()) == 2  # a key list: at most a partition a key


def test_a_key_or_member_that_is_not_utf8_is_named_with_its_server(spark: Any, shards: Any, prefix: str) -> None:
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        cluster.insert([(b"bad\xffkey", 1.0, "m"), ("good", 2.0, b"bad\xfemember"), ("fine", 1.0, "x")])
        where = {"urls": ",".join(shards.urls), "prefix": prefix}
        (part,) = TupleReader({**where, "keys": "fine,good", "numpartitions": "1"}).partitions()
        with pytest.raises(NotUtf8Error) as info:
            list(TupleReader(where).read(part))
        assert (info.value.key, info.value.member) == (b"good", b"bad\xfemember")
        assert info.value.where == cluster.shard_of("good")
        scans = TupleReader(where).partitions()
        with pytest.raises(NotUtf8Error) as info:
            for part in scans:
                list(TupleReader(where).read(part))
        assert info.value.key in (b"bad\xffkey", b"good")
        assert str(info.value).startswith(f"{'key' if info.value.member is None else 'member'} b")
        # Through Spark: the error's text, not Arrow's "Invalid UTF8 payload" naming nothing.
        df = spark.read.format("zcluster").options(**where, pattern="bad*").load()
        with pytest.raises(Exception, match=r"key b'bad\\xffkey' on 127.0.0.1:\d+ is not UTF-8"):
            df.collect()
        df = spark.read.format("zcluster").options(**where, keys="good,fine").load()
        with pytest.raises(Exception, match=r"member b'bad\\xfemember' of key b'good' on 127.0.0.1:\d+ is not"):
            df.collect()


def test_a_read_of_a_store_whose_migration_cut_over_follows_it(prefix: str) -> None:
    with LocalShards(2) as own:
        source, target = own.urls[:1], own.urls
        rows = [KeyScoreMember(f"k{i}", float(i), f"m{i}") for i in range(40)]
        with Cluster.from_urls(source, prefix=prefix) as cluster:
            cluster.insert(rows)
        where = {"urls": ",".join(source), "prefix": prefix, "keys": ",".join(r.key for r in rows)}
        reader = TupleReader({**where, "numpartitions": "1"})
        (part,) = reader.partitions()
        assert len(_read(reader, part)) == 40  # this process's shared store is settled on the source's layout
        scan = TupleReader({"urls": ",".join(source), "prefix": prefix})
        (shard,) = scan.partitions()
        migrate(source, target, prefix=prefix, namespaces=[prefix])
        # The key list is read again on the new layout (it raised the internal StoreMoved).
        assert sorted(_read(reader, part)) == sorted((r.key, r.score, r.member) for r in rows)
        # A scan planned on the old layout fails with a public error saying the store moved.
        with pytest.raises((LayoutMismatchError, PartialScanError), match="moved"):
            _read(scan, shard)


def _read(reader: TupleReader, part: Any) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for batch in reader.read(part) for r in batch.to_pylist()]
