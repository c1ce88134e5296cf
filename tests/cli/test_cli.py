"""The ``zcluster`` command against real servers (standalone shards and a Redis Cluster), through CliRunner."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import doc, fails, ok, rows, run
from rich.console import Console

from zcluster import Cluster, Count, Cursor, Incr, KeyMember, KeyScoreMember
from zcluster.cli.output import console as plain_console
from zcluster.testing import LocalRedisCluster, LocalShards


def b64(raw: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(raw).decode()}


@dataclass
class Conn:
    """Connection flags for the CLI and a library Cluster over the same servers and prefix."""

    args: list[str]
    cluster: Cluster

    def __call__(self, *args: str) -> list[str]:
        return [*self.args, *args]


@pytest.fixture(params=["shards", "cluster"])
def conn(request: pytest.FixtureRequest, prefix: str) -> Iterator[Conn]:
    if request.param == "shards":
        urls = request.getfixturevalue("shards").urls
        args = [a for u in urls for a in ("--url", u)]
        cluster = Cluster.from_urls(urls, prefix=prefix)
    else:
        url = request.getfixturevalue("redis_cluster").url
        args = ["--cluster-url", url]
        cluster = Cluster.from_cluster_url(url, prefix=prefix)
    with cluster:
        yield Conn([*args, "--prefix", prefix], cluster)


def test_insert_select_score_delete_round_trip(conn: Conn) -> None:
    out = ok(conn("insert", "t", "1", "a", "t", "2", "b", "t", "3", "c")).stdout
    assert "3 tuple(s): 3 applied, 0 stale" in out
    assert "1 applied, 0 stale" in ok(conn("insert", "t", "2", "a")).stdout
    assert "0 applied, 1 stale" in ok(conn("insert", "t", "1.5", "a")).stdout
    assert "1 applied" in ok(conn("insert", "neg", "-2.5", "-m")).stdout  # negative scores are not options
    scored = json.loads(ok(conn("--json", "score", "--", "neg", "-m")).stdout)  # "--": a member starting with "-"
    assert scored["members"][0]["score"] == -2.5

    page = doc(conn("select", "t"))["keys"]
    assert page == [
        {
            "key": "t",
            "members": [{"score": 3.0, "member": "c"}, {"score": 2.0, "member": "b"}, {"score": 2.0, "member": "a"}],
            "next": None,
            "error": None,
        }
    ]
    members = doc(conn("score", "t", "a", "t", "zz"))["members"]
    assert members[0] == {"key": "t", "member": "a", "present": True, "inserted": True, "score": 2.0, "error": None}
    assert members[1]["present"] is False and members[1]["score"] is None

    assert "1 applied, 0 stale" in ok(conn("delete", "t", "2", "b")).stdout  # delete wins the tie
    assert "0 applied, 1 stale" in ok(conn("delete", "t", "1", "c")).stdout  # c was inserted at 3

    table = rows(ok(conn("select", "t")))
    assert ["t", "3", "c"] in table and ["t", "2", "a"] in table
    assert not any("b" in row for row in table)
    assert ["t", "b", "deleted", "2"] in rows(ok(conn("score", "t", "b")))
    # The library reads what the CLI wrote, under the same prefix.
    assert conn.cluster.select(["t"])["t"] == [KeyScoreMember("t", 3.0, "c"), KeyScoreMember("t", 2.0, "a")]


def test_json_round_trips_raw_bytes(conn: Conn) -> None:
    key, member = b"k\xff", b"\xfe\x00m"
    lines = [
        {"key": b64(key), "score": 5, "member": b64(member)},
        {"key": b64(key), "score": 0.1, "member": "tab\there é"},
        ["plain", -2.5, "x"],
    ]
    stdin = "".join(json.dumps(line) + "\n" for line in lines)
    assert doc(conn("insert", "--file", "-"), input=stdin) == {
        "op": "insert",
        "tuples": 3,
        "applied": 3,
        "stale": 0,
        "unconfirmed": 0,
        "failures": [],
    }
    # argv holds non-UTF-8 bytes as surrogate escapes, as Python decodes a real command line.
    raw_key = key.decode("utf-8", "surrogateescape")
    selected = doc(conn("select", raw_key, "plain"))["keys"]
    assert selected[0]["key"] == b64(key)
    assert selected[0]["members"] == [
        {"score": 5.0, "member": b64(member)},
        {"score": 0.1, "member": "tab\there é"},
    ]
    assert selected[1]["members"] == [{"score": -2.5, "member": "x"}]
    assert conn.cluster.score([KeyMember(key, member)])[KeyMember(key, member)].score == 5.0

    # The JSON output is valid JSON-lines input: delete exactly what was selected.
    deletes = "".join(
        json.dumps({"key": k["key"], "score": m["score"], "member": m["member"]}) + "\n"
        for k in selected
        for m in k["members"]
    )
    assert doc(conn("delete", "--file", "-"), input=deletes)["applied"] == 3
    assert conn.cluster.select([key, "plain"]) == {key: [], "plain": []}
    # Human output escapes the bytes instead of printing them raw.
    ok(conn("insert", raw_key, "1", "\udcfe"))
    assert ["k\\xff", "1", "\\xfe"] in rows(ok(conn("select", raw_key)))


def test_tsv_file_and_bad_line_sends_nothing(conn: Conn, tmp_path: Path) -> None:
    path = tmp_path / "tuples.tsv"
    path.write_bytes(b"f\t1\tone\r\nf\t2\tmember\twith tab\n\nf\t3\t\xff\n")
    assert "3 applied" in ok(conn("insert", "--file", str(path))).stdout
    members = doc(conn("select", "f"))["keys"][0]["members"]
    assert members == [
        {"score": 3.0, "member": b64(b"\xff")},
        {"score": 2.0, "member": "member\twith tab"},
        {"score": 1.0, "member": "one"},
    ]
    braced = tmp_path / "braced.tsv"
    braced.write_text("{b}\t1\tm\n")  # would look like JSON lines to --format auto
    assert "1 applied" in ok(conn("insert", "--file", str(braced), "--format", "tsv")).stdout
    assert conn.cluster.select(["{b}"])["{b}"] == [KeyScoreMember("{b}", 1.0, "m")]
    bad = tmp_path / "bad.tsv"
    bad.write_text("g\t1\tok\ng\tNaN\tbad\n")
    result = fails(conn("insert", "--file", str(bad)), code=2)
    assert "line 2" in result.stderr and "finite" in result.stderr
    assert conn.cluster.select(["g"])["g"] == []  # the good first line was not sent either


def test_select_paging_with_cursors_and_offset(conn: Conn) -> None:
    ok(conn("insert", *[x for i in range(1, 6) for x in ("p", str(i), f"m{i}")]))

    def page(*args: str) -> tuple[list[str], str | None]:
        (entry,) = doc(conn("select", "p", "--limit", "2", *args))["keys"]
        return [m["member"] for m in entry["members"]], entry["next"]

    first, cursor = page()
    assert first == ["m5", "m4"] and cursor == str(Cursor(4.0, "m4"))
    assert cursor is not None
    second, cursor = page("--start", cursor)
    assert second == ["m3", "m2"] and cursor is not None
    third, cursor = page("--start", cursor)
    assert third == ["m1"] and cursor is None
    assert page("--stop", str(Cursor(2.0, "m2")), "--limit", "10")[0] == ["m5", "m4", "m3"]
    assert page("--offset", "1")[0] == ["m4", "m3"]
    human = ok(conn("select", "p", "--limit", "2")).stdout
    assert f"next page: --start {Cursor(4.0, 'm4')}" in human
    mixed = fails(conn("select", "p", "--offset", "1", "--start", str(Cursor(3.0, "m3"))), code=2)
    assert "--offset cannot be combined" in mixed.stderr
    assert "invalid cursor" in fails(conn("select", "p", "--start", "nonsense"), code=2).stderr
    assert "no members" in ok(conn("select", "never-written")).stdout


def test_keys_match_and_include_removed(conn: Conn) -> None:
    ok(conn("insert", "a1", "1", "m", "a2", "1", "m", "b1", "1", "m"))
    ok(conn("delete", "r1", "1", "m", "a1", "0", "other"))  # r1 holds only a tombstone

    def scanned(*args: str) -> list[str]:
        found = doc(conn("keys", *args))["keys"]
        assert len(found) == len(set(found)), found  # each key once
        return sorted(found)

    assert scanned() == ["a1", "a2", "b1"]
    assert scanned("--match", "a*") == ["a1", "a2"]
    assert scanned("--include-removed") == ["a1", "a2", "b1", "r1"]
    assert scanned("--include-removed", "--match", "r*", "--count", "1") == ["r1"]
    assert sorted(ok(conn("keys", "--count", "1")).stdout.split()) == ["a1", "a2", "b1"]


def test_keys_progress_on_a_terminal(shards: LocalShards, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()

    def fake_console(stderr: bool = False) -> Console:
        return Console(file=stream, force_terminal=True, width=100) if stderr else plain_console(stderr)

    monkeypatch.setattr("zcluster.cli.reads.console", fake_console)
    args = [*(a for u in shards.urls for a in ("--url", u)), "--prefix", prefix]
    ok([*args, "insert", "x", "1", "m"])
    assert ok([*args, "keys"]).stdout.split() == ["x"]
    assert "scanning" in stream.getvalue() and shards.servers[0].url.split("//")[1] in stream.getvalue()
    assert "scanning" not in run([*args, "keys"]).stderr  # not a terminal: no progress display


def test_info(conn: Conn) -> None:
    ok(conn("insert", "i1", "1", "m", "i2", "1", "m", "i3", "1", "m"))
    ok(conn("delete", "i4", "1", "m"))
    info = doc(conn("info"))
    shards = info["shards"]
    assert len(shards) == len(conn.cluster.shards)
    assert {s["shard"] for s in shards} == set(conn.cluster.shards)
    assert sum(s["keys"] for s in shards) == 3
    assert sum(s["removed_only"] for s in shards) == 1
    for s in shards:
        assert s["error"] is None
        assert s["dbsize"] >= s["keys"] + s["removed_only"]
        assert s["used_memory"] > 0
        assert s["version"].split()[0] in ("redis", "valkey")
        if s["keys"] or s["removed_only"]:
            assert s["script_loaded"] is True
        assert s["open_slots"] == ([] if conn.args[0] == "--cluster-url" else None)  # none open; no slots
    human = ok(conn("info")).stdout
    assert all(s["shard"] in human for s in shards) and "loaded" in human
    assert all(s["keys"] is None for s in doc(conn("info", "--no-scan"))["shards"])


def test_info_names_the_slots_a_dead_reshard_left_open(redis_cluster: LocalRedisCluster, prefix: str) -> None:
    rc, slot = redis_cluster, 4321
    src = rc.slot_owner(slot)
    dst = (src + 1) % len(rc.servers)
    names = [f"127.0.0.1:{s.port}" for s in rc.servers]
    args = ["--cluster-url", rc.url, "--prefix", prefix, "info", "--no-scan"]
    try:
        rc.open_slot(slot, dst)  # as redis-cli leaves it when it dies mid-reshard
        found = {s["shard"]: s["open_slots"] for s in doc([*args, "--json"])["shards"]}
        assert found[names[src]] == [f"{slot} migrating to {names[dst]}"]
        assert found[names[dst]] == [f"{slot} importing from {names[src]}"]
        assert [v for k, v in found.items() if k not in (names[src], names[dst])] == [[]]
        warned = ok(args).stderr
        assert f"Warning: {names[src]} holds slot(s) open for a migration: {slot} migrating to" in warned
        assert "redis-cli --cluster fix" in warned
    finally:
        for server in rc.servers:  # cancelled (SETSLOT STABLE): the slot stays where it was
            with server.client() as r:
                r.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
    assert all(not s["open_slots"] for s in doc([*args, "--json"])["shards"])
    assert "Warning" not in ok(args).stderr


def test_options_from_environment(
    shards: LocalShards, redis_cluster: LocalRedisCluster, prefix: str, dead_port: int
) -> None:
    env = {"ZCLUSTER_URLS": ",".join(shards.urls), "ZCLUSTER_PREFIX": prefix}
    ok(["insert", "e", "1", "m"], env=env)
    with Cluster.from_urls(shards.urls, prefix=prefix) as c:
        assert c.select(["e"])["e"] == [KeyScoreMember("e", 1.0, "m")]
    # Flags win over the environment.
    dead = {"ZCLUSTER_URLS": f"redis://127.0.0.1:{dead_port}", "ZCLUSTER_PREFIX": prefix}
    assert doc(["--url", shards.urls[0], "--url", shards.urls[1], "select", "e"], env=dead)["keys"][0]["members"]
    cluster_env = {"ZCLUSTER_CLUSTER_URL": redis_cluster.url, "ZCLUSTER_PREFIX": prefix}
    ok(["insert", "e", "2", "m"], env=cluster_env)
    assert doc(["score", "e", "m"], env=cluster_env)["members"][0]["score"] == 2.0


def test_routing_and_max_size(shards: LocalShards, prefix: str) -> None:
    args = [*(a for u in shards.urls for a in ("--url", u)), "--prefix", prefix]
    ok([*args, "--routing", "roshi", "insert", *[x for i in range(8) for x in (f"k{i}", "1", "m")]])
    with Cluster.from_urls(shards.urls, prefix=prefix, routing="roshi") as c:
        assert all(p.inserted for p in c.score([KeyMember(f"k{i}", "m") for i in range(8)]).values())
    bounded = [*(a for u in shards.urls for a in ("--url", u)), "--prefix", f"{prefix}b", "--max-size", "2"]
    ok([*bounded, "insert", "s", "1", "a", "s", "2", "b", "s", "3", "c"])  # another store: another layout
    assert [m["member"] for m in doc([*bounded, "select", "s"])["keys"][0]["members"]] == ["c", "b"]


@pytest.mark.parametrize("score", ["nan", "NaN", "inf", "-inf", "1e400", "abc", "", "9007199254740993"])
def test_bad_score_is_rejected_before_sending(conn: Conn, score: str) -> None:
    result = fails(conn("insert", "bad", "1", "ok", "bad", score, "m"), code=2)
    assert repr(score) in result.stderr or score in result.stderr
    assert "score" in result.stderr
    assert conn.cluster.select(["bad"])["bad"] == []


def test_usage_errors(shards: LocalShards, redis_cluster: LocalRedisCluster, prefix: str) -> None:
    args = ["--url", shards.urls[0], "--prefix", prefix]
    assert "triples" in fails([*args, "insert", "k", "1"], code=2).stderr
    assert "triples" in fails([*args, "delete", "k", "1", "m", "k"], code=2).stderr
    assert "nothing to insert" in fails([*args, "insert"], code=2).stderr
    assert "pairs" in fails([*args, "score", "k", "m", "k"], code=2).stderr
    assert "line 1" in fails([*args, "insert", "--file", "-", "--format", "jsonl"], code=2, input="{oops\n").stderr
    assert "no servers" in fails(["keys"], code=2, env={"ZCLUSTER_URLS": "", "ZCLUSTER_CLUSTER_URL": ""}).stderr
    both = fails(["--url", shards.urls[0], "--cluster-url", redis_cluster.url, "keys"], code=2)
    assert "not both" in both.stderr
    assert "--routing" in fails(["--cluster-url", redis_cluster.url, "--routing", "roshi", "keys"], code=2).stderr
    # A prefix the library refuses (ConfigError) is a usage error, as a bad URL is.
    assert "braces" in fails(["--url", shards.urls[0], "--prefix", "a{b", "keys"], code=2).stderr
    assert (
        "must not be empty" in fails([*args, "insert", "", "1", "m"], code=2).stderr
    )  # the library's check: bad input, exit 2


@pytest.mark.parametrize(
    "command",
    [["insert", "k", "1", "m"], ["delete", "k", "1", "m"], ["select", "k"], ["score", "k", "m"], ["keys"], ["info"]],
)
def test_unreachable_shard_is_named(command: list[str], dead_port: int) -> None:
    port = dead_port
    result = fails(["--url", f"redis://:hunter2@127.0.0.1:{port}", *command])
    assert f"127.0.0.1:{port}" in result.stderr
    assert "hunter2" not in result.output


def test_unreachable_cluster_seed(dead_port: int) -> None:
    port = dead_port
    assert f"127.0.0.1:{port}" in fails(["--cluster-url", f"redis://127.0.0.1:{port}", "keys"]).stderr


def test_one_failed_shard_reports_and_keeps_the_others(shards: LocalShards, prefix: str, dead_port: int) -> None:
    dead = f"127.0.0.1:{dead_port}"
    args = ["--url", shards.urls[0], "--url", f"redis://{dead}", "--prefix", prefix]
    tuples = [x for i in range(20) for x in (f"k{i}", "1", "m")]
    result = fails([*args, "insert", *tuples, "--json"])
    summary = json.loads(result.stdout)
    assert summary["tuples"] == 20 and 0 < summary["applied"] < 20
    assert summary["applied"] + summary["unconfirmed"] == 20 and summary["stale"] == 0
    assert [f["shard"] for f in summary["failures"]] == [dead]
    assert dead in result.stderr and "not confirmed" in result.stderr
    selected = json.loads(fails([*args, "select", *(f"k{i}" for i in range(20)), "--json"]).stdout)["keys"]
    answered = [k for k in selected if k["error"] is None]
    assert len(answered) == summary["applied"] and all(k["members"] for k in answered)
    assert all(dead in k["error"] for k in selected if k["error"] is not None)
    info = fails([*args, "info", "--json"])
    assert [s["error"] is not None for s in json.loads(info.stdout)["shards"]] == [False, True]


@pytest.fixture
def secured() -> Iterator[LocalShards]:
    """A standalone server that requires the password ``s3cret``."""
    with LocalShards(1, extra=["--requirepass", "s3cret"]) as s:
        yield s


def test_password_never_printed(secured: LocalShards, prefix: str) -> None:
    port = secured.servers[0].port
    url = f"redis://:s3cret@127.0.0.1:{port}"
    args = ["--url", url, "--prefix", prefix]
    outputs = []
    assert doc([*args, "info"])["shards"][0]["script_loaded"] is False
    for command in (["insert", "k", "1", "m"], ["select", "k"], ["score", "k", "m"], ["keys"], ["info"]):
        outputs += [ok([*args, *command]), ok([*args, *command, "--json"])]
    assert doc([*args, "info"])["shards"][0]["script_loaded"] is True
    assert doc([*args, "select", "k"])["keys"][0]["members"] == [{"score": 1.0, "member": "m"}]
    outputs.append(ok(["--prefix", prefix, "keys"], env={"ZCLUSTER_URLS": url}))
    assert f"127.0.0.1:{port}" in outputs[-3].stdout  # info names the shard ...
    assert all("s3cret" not in r.output for r in outputs)  # ... but never the password

    wrong = ["--url", f"redis://:wr0ng@127.0.0.1:{port}", "--prefix", prefix]
    for command in (["insert", "k", "2", "m"], ["select", "k"], ["keys"], ["info"]):
        result = fails([*wrong, *command])
        assert f"127.0.0.1:{port}" in result.stderr, result.stderr
        assert "wr0ng" not in result.output and "s3cret" not in result.output
    nopass = fails(["--url", f"redis://127.0.0.1:{port}", "--prefix", prefix, "keys"])
    assert "Authentication" in nopass.stderr and f"127.0.0.1:{port}" in nopass.stderr


def test_top_and_counters_read_aggregates(conn: Conn) -> None:
    c = conn.cluster
    c.increment("j", [(i, Incr("lb", f"p{i % 4}", float(i))) for i in range(12)] + [(20, Count("views", "home", 7))])
    table = rows(ok(conn("top", "lb", "-n", "3")))
    assert [r for r in table if r and r[0] in "123"] == [["1", "p3", "21"], ["2", "p2", "18"], ["3", "p1", "15"]]
    page = doc(conn("top", "lb", "-n", "2", "--offset", "2"))
    assert [(e["rank"], e["member"], e["total"]) for e in page["entries"]] == [(3, "p1", 15.0), (4, "p0", 12.0)]
    assert doc(conn("counters", "views", "none"))["keys"] == [
        {"key": "views", "counters": [{"field": "home", "total": 7}], "error": None},
        {"key": "none", "counters": [], "error": None},
    ]
    c.increment("k/2", [((9, 1, 0), Incr("lb", "p0", 1.0))])
    assert doc(conn("fences", "lb", "none"))["keys"] == [
        {
            "key": "lb",
            "aggregate": True,
            "fences": [
                {"source": "j", "position": [11, 0, 0], "held": 12},
                {"source": "k/2", "position": [9, 1, 0], "held": 1},
            ],
            "error": None,
        },
        {"key": "none", "aggregate": False, "fences": [], "error": None},
    ]
    human = ok(conn("fences", "lb", "none")).stdout
    assert ["lb", "k/2", "9:1:0", "1"] in rows(ok(conn("fences", "lb"))) and "none: not an aggregate key" in human
