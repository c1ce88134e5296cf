"""The layout guard (issue 28, item 1): a client whose shard list, routing or max_size disagrees with the
store's is refused before it reads or writes anything; unmarked stores are adopted only when their keys sit
where the list routes them. Real servers throughout."""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from zcluster import Cluster, ConfigError, LayoutMismatchError
from zcluster._keys import KeyLayout
from zcluster._markers import marker_key
from zcluster.farm import Farm
from zcluster.state import StateStore
from zcluster.testing.redis_cluster import LocalRedisCluster
from zcluster.testing.servers import LocalShards

_names = itertools.count()
KEYS = [f"user:{i}" for i in range(300)]


@pytest.fixture(scope="module")
def three() -> Iterator[LocalShards]:
    with LocalShards(3) as s:
        yield s


@pytest.fixture
def pre() -> str:
    return f"lg{next(_names)}:"


def written(urls: list[str], prefix: str, **options: Any) -> None:
    """A store laid out by ``urls``, holding one member per key of KEYS."""
    with Cluster.from_urls(urls, prefix=prefix, **options) as c:
        c.insert([(k, 1.0, "m") for k in KEYS])


def raw_keys(urls: list[str], prefix: str) -> int:
    """Redis keys of ``prefix`` on every server (markers included)."""
    total = 0
    for url in urls:
        with redis.Redis.from_url(url) as r:
            total += sum(1 for _ in r.scan_iter(match=f"{{{prefix}*", count=1000))
    return total


def markers(urls: list[str], prefix: str) -> list[dict[str, Any] | None]:
    out = []
    for url in urls:
        with redis.Redis.from_url(url) as r:
            raw = r.get(marker_key(KeyLayout(prefix)))
        out.append(None if raw is None else json.loads(raw))
    return out


def unmark(urls: list[str], prefix: str) -> None:
    """Make the store look written before this release: no marker anywhere."""
    for url in urls:
        with redis.Redis.from_url(url) as r:
            r.delete(marker_key(KeyLayout(prefix)))


@pytest.mark.parametrize(
    ("pick", "options", "expected"),
    [
        ([0, 1, 2], {}, "laid out for 2 shard(s)"),
        ([0], {}, "a shard was removed"),
        ([1, 0], {}, "the list was reordered"),
        ([0, 1], {"max_size": 10}, "max_size=None; this client has max_size=10"),
        ([0, 1], {"routing": "roshi"}, "routing='jump'"),
    ],
    ids=["added", "removed", "reordered", "max_size", "routing"],
)
def test_a_client_with_another_layout_is_refused_before_it_reads_or_writes(
    three: LocalShards, pre: str, pick: list[int], options: dict[str, Any], expected: str
) -> None:
    urls = three.urls
    written(urls[:2], pre)
    before = raw_keys(urls, pre)
    with Cluster.from_urls([urls[i] for i in pick], prefix=pre, **options) as c:
        for call in (
            lambda: c.insert([(k, 2.0, "other") for k in KEYS]),
            lambda: c.select(KEYS),
            lambda: list(c.keys()),
        ):
            with pytest.raises(LayoutMismatchError) as info:
                call()
            assert expected in str(info.value)
            assert pre in str(info.value)
    if pick == [0, 1, 2]:
        assert "to grow the store, migrate it online first (zcluster migrate" in str(info.value)
    assert raw_keys(urls, pre) == before  # nothing was written anywhere
    with Cluster.from_urls(urls[:2], prefix=pre) as c:  # the original list still reads everything
        assert all(v == [(k, 1.0, "m")] for k, v in c.select(KEYS).items())


def test_a_shard_of_another_store_is_refused(three: LocalShards, pre: str) -> None:
    a = [three.urls[0], three.urls[1]]
    b = [f"{three.urls[0]}/1", f"{three.urls[1]}/1"]  # another store, same prefix, other databases
    written(a, pre)
    written(b, pre)
    with Cluster.from_urls([a[0], b[1]], prefix=pre) as c, pytest.raises(LayoutMismatchError) as info:
        c.select(["x"])
    assert "belong to different stores" in str(info.value)
    assert markers(a, pre)[0]["id"] != markers(b, pre)[0]["id"]  # type: ignore[index]


def test_the_same_shard_listed_twice_is_refused_before_connecting(three: LocalShards, pre: str) -> None:
    with pytest.raises(ConfigError, match="listed twice, at places 0 and 1"):
        Cluster.from_urls(["redis://127.0.0.1:1", "redis://127.0.0.1:1"], prefix=pre)  # nothing listens there
    url = three.urls[0]
    alias = url.replace("127.0.0.1", "localhost")
    with Cluster.from_urls([url, alias], prefix=pre) as c, pytest.raises(LayoutMismatchError) as info:
        c.insert([("k", 1.0, "m")])
    assert "the same server is listed twice" in str(info.value)


def test_an_unmarked_store_is_not_adopted_by_a_list_that_misplaces_its_keys(
    three: LocalShards, pre: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the guard, this client read about a third of the keys as empty, silently."""
    urls = three.urls
    written(urls[:2], pre)
    unmark(urls, pre)
    with Cluster.from_urls(urls, prefix=pre) as c, pytest.raises(LayoutMismatchError) as info:
        c.select(KEYS)
    text = str(info.value)
    assert "has no layout marker" in text and "routed elsewhere" in text and "nothing was marked" in text
    assert markers(urls, pre) == [None, None, None]
    with caplog.at_level(logging.WARNING, logger="zcluster"), Cluster.from_urls(urls[:2], prefix=pre) as c:
        assert all(v == [(k, 1.0, "m")] for k, v in c.select(KEYS).items())
    adopted = [r for r in caplog.records if "adopted the store" in r.getMessage()]
    assert len(adopted) == 1 and "key(s) sampled" in adopted[0].getMessage()
    got = markers(urls[:2], pre)
    assert got[0] is not None and got[1] is not None
    assert got[0]["id"] == got[1]["id"] and [got[0]["index"], got[1]["index"]] == [0, 1]


def test_concurrent_first_clients_agree_on_one_layout(three: LocalShards, pre: str) -> None:
    urls = three.urls
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def first_use() -> None:
        with Cluster.from_urls(urls, prefix=pre) as c:
            barrier.wait()
            try:
                c.insert([(k, 1.0, "m") for k in KEYS[:50]])
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({m["id"] for m in markers(urls, pre) if m is not None}) == 1


def test_a_shard_restarted_empty_is_marked_again_and_a_replaced_one_is_refused(pre: str) -> None:
    with LocalShards(3) as s:
        c = Cluster.from_urls(s.urls[:2], prefix=pre)
        c.insert([(k, 1.0, "m") for k in KEYS])
        layout = markers(s.urls[:2], pre)[1]["id"]  # type: ignore[index]
        s.kill(1)
        s.start(1)
        with redis.Redis.from_url(s.urls[1]) as r:
            r.flushall()
        c.insert([(k, 2.0, "m") for k in KEYS])  # reconnects: marked again, with its peers' layout
        assert markers(s.urls[:2], pre)[1]["id"] == layout  # type: ignore[index]
        assert all(v == [(k, 2.0, "m")] for k, v in c.select(KEYS).items())
        c.close()
        with Cluster.from_urls([s.urls[0], s.urls[2]], prefix=pre) as other, pytest.raises(LayoutMismatchError) as e:
            other.select(KEYS)
        assert "a shard replaced, or a wrong URL" in str(e.value)
        assert markers(s.urls, pre)[2] is None


def test_a_password_never_appears_in_the_message(pre: str) -> None:
    with LocalShards(2, extra=["--requirepass", "s3cret-pw"]) as s:
        urls = [f"redis://:s3cret-pw@127.0.0.1:{server.port}" for server in s.servers]
        written(urls, pre)
        with Cluster.from_urls([urls[1], urls[0]], prefix=pre) as c, pytest.raises(LayoutMismatchError) as e:
            c.select(["k"])
        assert "reordered" in str(e.value) and "s3cret-pw" not in str(e.value)


def test_a_redis_cluster_records_its_routing(redis_cluster: LocalRedisCluster, pre: str) -> None:
    with Cluster.from_cluster_url(redis_cluster.url, prefix=pre, max_size=5) as c:
        c.insert([(k, 1.0, "m") for k in KEYS[:20]])
        assert sorted(k for batch in c.keys() for k in batch) == sorted(KEYS[:20])  # the marker is no key
        nodes = [f"redis://{n}" for n in c.shards]
    with Cluster.from_cluster_url(redis_cluster.url, prefix=pre) as c, pytest.raises(LayoutMismatchError) as e:
        c.select(KEYS[:20])
    assert "max_size=5" in str(e.value)
    with Cluster.from_urls(nodes, prefix=pre, max_size=5) as c, pytest.raises(LayoutMismatchError) as e:
        c.select(KEYS[:20])
    assert "Redis Cluster" in str(e.value) and "redis+cluster://" in str(e.value)


def test_each_farm_replica_is_guarded(three: LocalShards, pre: str) -> None:
    urls = three.urls
    written(urls[:2], pre)
    with pytest.raises(LayoutMismatchError, match="reordered"):
        farm = Farm([Cluster.from_urls([urls[1], urls[0]], prefix=pre), Cluster.from_urls(urls[:2], prefix=pre)])
        try:
            farm.insert([(k, 3.0, "m") for k in KEYS])
        finally:
            farm.close()


def test_a_state_store_of_a_client_with_another_layout_is_refused(three: LocalShards, pre: str) -> None:
    urls = three.urls
    with Cluster.from_urls(urls[:2], prefix=pre) as c:
        StateStore(c, "app").commit_batch("q", 0)
    with Cluster.from_urls(urls, prefix=pre) as c, pytest.raises(LayoutMismatchError, match="a shard was added"):
        StateStore(c, "app").committed_batch("q")


def test_a_store_wiped_on_every_shard_and_marked_again_by_another_client_is_followed(
    three: LocalShards, pre: str
) -> None:
    # Every shard loses the store (flushed, or restarted empty together) under a long-lived client; another
    # process marks it again first, with a new layout id. The same shard list, routing and max_size: the
    # long-lived client follows the new id instead of refusing its shards as "another store's".
    urls = three.urls
    old = Cluster.from_urls(urls, prefix=pre)
    try:
        old.insert([(k, 1.0, "m") for k in KEYS])
        before = markers(urls, pre)[0]
        for url in urls:
            with redis.Redis.from_url(url) as r:
                r.delete(*r.scan_iter(match=f"{{{pre}*", count=1000))
        with Cluster.from_urls(urls, prefix=pre) as new:
            new.insert([(k, 2.0, "n") for k in KEYS[:50]])
        after = markers(urls, pre)
        assert before is not None and all(m is not None and m["id"] == after[0]["id"] != before["id"] for m in after)
        for shard in old._transport.topology.shards:
            shard.client.connection_pool.disconnect()  # the long-lived client's next calls open new connections
        assert old.insert([(k, 3.0, "o") for k in KEYS]).applied_count == len(KEYS)
        assert all(len(v) == 2 for v in old.select(KEYS[:50]).values())
    finally:
        old.close()
    # a shard holding another store's marker is still refused
    other = f"{pre}x:"
    written(urls, other)
    with redis.Redis.from_url(urls[1]) as r:
        r.set(marker_key(KeyLayout(pre)), r.get(marker_key(KeyLayout(other))))
    with pytest.raises(LayoutMismatchError, match="another store"), Cluster.from_urls(urls, prefix=pre) as c:
        c.select(KEYS)
