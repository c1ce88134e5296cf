"""Values the CLI must print exactly (non-finite totals, colliding fields and sources) and the exit status of
usage errors (issue 27, items 8, 12 and 13), against real standalone shards."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
import redis
from cli_helpers import doc, fails, ok, rows

from zcluster import Cluster, Count, Incr
from zcluster.cli.output import parse_json_blob
from zcluster.testing import LocalShards


@pytest.fixture
def cluster(shards: LocalShards, prefix: str) -> Iterator[Cluster]:
    with Cluster.from_urls(shards.urls, prefix=prefix) as c:
        yield c


def args(shards: LocalShards, prefix: str, *rest: str) -> list[str]:
    return [*(a for u in shards.urls for a in ("--url", u)), "--prefix", prefix, *rest]


def raw_adds(shards: LocalShards, prefix: str, key: str) -> tuple[redis.Redis, bytes]:
    """The server and name of ``key``'s add set (``{<prefix><key>}+``), found by looking at the servers."""
    for url in shards.urls:
        client = redis.Redis.from_url(url)
        name = f"{{{prefix}{key}}}+".encode()
        if client.exists(name):
            return client, name
        client.close()
    raise AssertionError(f"no add set of {key}")


def test_non_finite_totals_print_as_strings_in_json_and_as_words_in_tables(
    shards: LocalShards, prefix: str, cluster: Cluster
) -> None:
    cluster.increment("j", [(1, Incr("pts", "fine", 2.5))])
    cluster.insert([("tl", 1.0, "m")])
    # Old data: totals that overflowed before the library refused it, written as the servers hold them.
    client, sums = raw_adds(shards, prefix, "pts")
    client.zadd(sums, {b"up": float("inf"), b"down": float("-inf")})
    client, adds = raw_adds(shards, prefix, "tl")
    client.zadd(adds, {b"far": float("inf")})

    top = doc(args(shards, prefix, "top", "pts"))
    assert [(e["member"], e["total"]) for e in top["entries"]] == [("up", "inf"), ("fine", 2.5), ("down", "-inf")]
    table = rows(ok(args(shards, prefix, "top", "pts")))
    assert ["1", "up", "inf"] in table and ["3", "down", "-inf"] in table
    (page,) = doc(args(shards, prefix, "select", "tl"))["keys"]
    assert page["members"] == [{"score": "inf", "member": "far"}, {"score": 1.0, "member": "m"}]
    assert ["tl", "inf", "far"] in rows(ok(args(shards, prefix, "select", "tl")))
    (far,) = doc(args(shards, prefix, "score", "tl", "far"))["members"]
    assert far["score"] == "inf" and far["inserted"] is True
    (absent,) = doc(args(shards, prefix, "score", "tl", "nobody"))["members"]
    assert absent["score"] is None and absent["present"] is False  # absent stays null, not "nan"
    assert ["tl", "nobody", "absent", "-"] in rows(ok(args(shards, prefix, "score", "tl", "nobody")))


def test_counters_and_fences_json_keep_every_field_and_source_apart(
    shards: LocalShards, prefix: str, cluster: Cluster
) -> None:
    fields: list[str | bytes] = [b"\xff", "\\xff", b"\n", "\\x0a", "plain"]
    cluster.increment("j", [(i, Count("c", f, i + 1)) for i, f in enumerate(fields)])
    sources = ["\\xff", "s\n"]
    for s in sources:
        cluster.increment(s, [(1, Incr("lb", "a", 1.0))])
    cluster.increment("j\udcff", [(1, Incr("lb", "a", 1.0))])  # a source whose bytes are not UTF-8

    (key,) = doc(args(shards, prefix, "counters", "c"))["keys"]
    got = {parse_json_blob(e["field"], "field"): e["total"] for e in key["counters"]}
    want = dict(zip(fields, range(1, 6), strict=True))
    assert len(key["counters"]) == 5 and sum(got.values()) == 15
    assert {(k.encode("utf-8", "surrogateescape") if isinstance(k, str) else k): v for k, v in got.items()} == {
        (k.encode() if isinstance(k, str) else k): v for k, v in want.items()
    }
    assert {"field": {"b64": base64.b64encode(b"\xff").decode()}, "total": 1} in key["counters"]
    assert {"field": "\\xff", "total": 2} in key["counters"] and {"field": "\n", "total": 3} in key["counters"]

    (lb,) = doc(args(shards, prefix, "fences", "lb"))["keys"]
    shown = [f["source"] for f in lb["fences"]]
    assert len(shown) == 3 and "\\xff" in shown and "s\n" in shown
    assert {"b64": base64.b64encode(b"j\xff").decode()} in shown


def test_usage_errors_exit_2(shards: LocalShards, prefix: str, cluster: Cluster) -> None:
    huge = "99999999999999999999"
    for command in (
        ["top", "pts", "-n", huge],
        ["top", "pts", "--offset", huge],
        ["select", "k", "--limit", huge],
        ["select", "k", "--offset", huge],
        ["keys", "--count", huge],
        ["consumers", "app", "--selector", "a in (b"],
    ):
        result = fails(args(shards, prefix, *command), code=2)
        assert "shard" not in result.stderr, result.stderr
    assert (
        "malformed label selector" in fails(args(shards, prefix, "consumers", "x", "--selector", "a in (b"), 2).stderr
    )
    # The largest count taken still reaches the servers and is answered.
    cluster.increment("j", [(1, Incr("pts", "a", 1.0))])
    assert [e["member"] for e in doc(args(shards, prefix, "top", "pts", "-n", str((1 << 53) - 1)))["entries"]] == ["a"]
