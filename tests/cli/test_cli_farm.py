"""The ``zcluster`` command on a farm of replicas (``--replica``): ``diff``, ``walk``, and the other commands.

Three standalone servers, one replica each (isolated per test by prefix); divergence is made by writing to
one replica alone through a library Cluster.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis
from cli_helpers import doc, fails, ok, rows, run
from rich.console import Console

from zcluster import Cluster, Count, Incr, KeyScoreMember
from zcluster.cli.output import console as plain_console
from zcluster.testing import LocalRedisCluster, LocalShards

SECRET = "s3cret"


@pytest.fixture(scope="module")
def servers() -> Iterator[LocalShards]:
    """Three standalone servers: one replica each (the farm's tests share them, isolated by prefix)."""
    with LocalShards(3) as s:
        yield s


@pytest.fixture
def args(servers: LocalShards, prefix: str) -> list[str]:
    """Group options naming the three replicas."""
    return [*(a for u in servers.urls for a in ("--replica", u)), "--prefix", prefix]


def on(url: str, prefix: str) -> Cluster:
    """A library Cluster over one replica alone, to make it diverge."""
    return Cluster.from_urls([url], prefix=prefix)


def test_diff_agreement_and_difference(servers: LocalShards, args: list[str], prefix: str) -> None:
    assert "2 applied" in ok([*args, "insert", "k", "1", "a", "k", "2", "b"]).stdout  # on every replica
    agreed = ok([*args, "diff", "k", "never"])
    assert "k: replicas agree" in agreed.stdout and "never: no records on any replica" in agreed.stdout
    assert ["a", "inserted", "1", "inserted", "1", "inserted", "1", "inserted", "1"] in rows(agreed)
    document = doc([*args, "diff", "k"])
    assert document["agree"] is True and document["failed"] is False
    assert [r["name"] for r in document["replicas"]] == ["replica0", "replica1", "replica2"]

    with on(servers.urls[1], prefix) as one:
        one.delete([("k", 3, "a")])  # replica1 alone: a tombstone above the insert
        one.insert([("k", 1, "c")])  # and a member the others lack
    result = run([*args, "diff", "k"])
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert "k: replicas differ on 2 of 3 member(s)" in result.stdout
    table = rows(result)
    assert ["a", "inserted", "1", "*", "deleted", "3", "inserted", "1", "*", "deleted", "3"] in table
    assert ["b", "inserted", "2", "inserted", "2", "inserted", "2", "inserted", "2"] in table
    assert ["c", "absent", "*", "inserted", "1", "absent", "*", "inserted", "1"] in table
    assert "* differs from the merged record" in result.stdout

    result = run([*args, "diff", "k", "--json"])
    assert result.exit_code == 3
    (key,) = json.loads(result.stdout)["keys"]
    assert key["key"] == "k" and key["agree"] is False and key["differing"] == 2 and key["errors"] == {}
    a = next(m for m in key["members"] if m["member"] == "a")
    assert a["merged"] == {"state": "deleted", "score": 3.0}
    assert a["replicas"] == {
        "replica0": {"state": "inserted", "score": 1.0, "differs": True},
        "replica1": {"state": "deleted", "score": 3.0, "differs": False},
        "replica2": {"state": "inserted", "score": 1.0, "differs": True},
    }
    c = next(m for m in key["members"] if m["member"] == "c")
    assert c["replicas"]["replica0"] == {"state": "absent", "score": None, "differs": True}
    only = json.loads(run([*args, "diff", "k", "--differing", "--json"]).stdout)["keys"][0]["members"]
    assert sorted(m["member"] for m in only) == ["a", "c"]
    assert not any(r and r[0] == "b" for r in rows(run([*args, "diff", "k", "--differing"])))


def test_diff_delete_wins_a_tie(servers: LocalShards, args: list[str], prefix: str) -> None:
    with on(servers.urls[0], prefix) as zero, on(servers.urls[2], prefix) as two:
        zero.insert([("t", 5, "m")])
        two.delete([("t", 5, "m")])
    (key,) = json.loads(run([*args, "diff", "t", "--json"]).stdout)["keys"]
    (member,) = key["members"]
    assert member["merged"] == {"state": "deleted", "score": 5.0}
    assert [r and r["differs"] for r in member["replicas"].values()] == [True, True, False]


def test_walk_repairs_a_diverged_replica(servers: LocalShards, args: list[str], prefix: str) -> None:
    ok([*args, "insert", *(x for i in range(10) for x in (f"w{i}", "1", "m"))])
    with on(servers.urls[2], prefix) as two:
        two.delete([("w0", 2, "m"), ("w1", 2, "m")])
        two.insert([("w2", 3, "m"), ("new", 1, "x")])
    assert run([*args, "diff", "w0", "w1", "w2", "new", "w3"]).exit_code == 3

    report = doc([*args, "walk", "--batch-size", "3"])
    # SCAN may return a key more than once (repairing w0/w1 gives replica0 their tombstone keys mid-sweep; see
    # WalkReport): every key is compared at least once, and only the diverged ones are counted as such.
    assert report["keys"] >= 11 and report["diverged"] == 4
    assert report["repaired"] == 8 and report["repair_failures"] == 0  # 4 records onto 2 replicas each
    assert report["complete"] is True and report["position"] is None and report["failures"] == []
    assert report["interrupted"] is False

    assert ok([*args, "diff", "w0", "w1", "w2", "new", "w3"]).stdout.count("replicas agree") == 5
    for url in servers.urls:
        with on(url, prefix) as c:
            assert c.select(["w0", "w2", "new"]) == {
                "w0": [],
                "w2": [KeyScoreMember("w2", 3.0, "m")],
                "new": [KeyScoreMember("new", 1.0, "x")],
            }
    again = ok([*args, "walk"]).stdout
    assert "11 key(s) compared, 0 diverged, 0 record(s) repaired" in again
    assert "complete" in again


def test_walk_stops_at_max_keys_and_resumes(servers: LocalShards, args: list[str], prefix: str) -> None:
    with on(servers.urls[0], prefix) as zero:
        zero.insert([(f"r{i}", 1, "m") for i in range(6)])
    first = doc([*args, "walk", "--batch-size", "2", "--max-keys", "2"])
    assert 2 <= first["keys"] < 6 and first["complete"] is False
    assert isinstance(first["position"], str)
    human = ok([*args, "walk", "--batch-size", "1", "--max-keys", "1", "--resume", first["position"]]).stdout
    assert "stopped at --max-keys 1: resume with --resume " in human
    middle_keys = int(human.split(" key(s) compared")[0].split()[-1])
    position = human.split("--resume ")[-1].strip()
    rest = doc([*args, "walk", "--resume", position, "--rate", "10000"])
    assert rest["complete"] is True and rest["position"] is None
    assert first["keys"] + middle_keys + rest["keys"] == 6
    assert first["diverged"] + int(human.split(" diverged")[0].split()[-1]) + rest["diverged"] == 6
    assert run([*args, "diff", *(f"r{i}" for i in range(6))]).exit_code == 0


@pytest.mark.parametrize("position", ["garbage", "5/111111/", "0/1/9:0", "0/2/", "1/1/"])
def test_walk_refuses_a_bad_resume_position(args: list[str], position: str) -> None:
    result = fails([*args, "walk", "--resume", position], code=2)
    assert "Invalid value for '--resume'" in result.stderr
    if position == "0/1/9:0":  # well formed, but replica0 has no shard 9
        assert "not a scan position of this cluster (1 masters): '9:0'" in result.stderr
    else:
        assert f"not a walk position of this farm (3 replicas): {position!r}" in result.stderr
    assert "an earlier walk of the same replicas" in result.stderr


def test_walk_and_diff_need_a_farm(servers: LocalShards, prefix: str) -> None:
    no_env = {"ZCLUSTER_URLS": "", "ZCLUSTER_CLUSTER_URL": "", "ZCLUSTER_REPLICAS": ""}
    for command in (["walk"], ["diff", "k"]):
        assert "needs a farm: pass --replica" in fails(command, code=2, env=no_env).stderr
        assert "needs a farm" in fails(["--url", servers.urls[0], *command], code=2).stderr
        single = fails(["--replica", servers.urls[0], *command], code=2)
        assert "at least 2" in single.stderr
    assert "no servers" in fails(["keys"], code=2, env=no_env).stderr
    assert (
        "Missing argument" in fails(["--replica", servers.urls[0], "--replica", servers.urls[1], "diff"], code=2).stderr
    )


def test_replica_excludes_url_and_cluster_url(servers: LocalShards) -> None:
    for other in (["--url", servers.urls[1]], ["--cluster-url", servers.urls[1]]):
        for command in (["keys"], ["walk"], ["diff", "k"], ["insert", "k", "1", "m"]):
            result = fails(["--replica", servers.urls[0], "--replica", servers.urls[2], *other, *command], code=2)
            assert "not both" in result.stderr
    both_env = {"ZCLUSTER_REPLICAS": ";".join(servers.urls), "ZCLUSTER_URLS": servers.urls[0]}
    assert "not both" in fails(["keys"], code=2, env=both_env).stderr
    # Flags win over the environment, whichever kind they name.
    assert ok(["--url", servers.urls[0], "keys"], env={"ZCLUSTER_REPLICAS": "redis://127.0.0.1:1"})
    flags = [a for u in servers.urls[:2] for a in ("--replica", u)]
    assert ok([*flags, "keys"], env={"ZCLUSTER_URLS": "redis://127.0.0.1:1"})
    assert "empty --replica" in fails(["--replica", " , ", "--replica", servers.urls[0], "keys"], code=2).stderr


def test_replicas_from_the_environment_with_several_shards(servers: LocalShards, prefix: str) -> None:
    # Two replicas: servers 0 and 1 together (routed shards), and server 2 alone.
    env = {"ZCLUSTER_REPLICAS": f"{servers.urls[0]}, {servers.urls[1]} ; {servers.urls[2]};", "ZCLUSTER_PREFIX": prefix}
    ok(["insert", *(x for i in range(8) for x in (f"e{i}", "1", "m"))], env=env)
    with Cluster.from_urls(servers.urls[:2], prefix=prefix) as pair, on(servers.urls[2], prefix) as alone:
        keys = [f"e{i}" for i in range(8)]
        assert pair.select(keys) == alone.select(keys) == {k: [KeyScoreMember(k, 1.0, "m")] for k in keys}
        alone.delete([("e1", 2, "m")])
    document = json.loads(run(["diff", "e0", "e1", "--json"], env=env).stdout)
    assert [r["name"] for r in document["replicas"]] == ["replica0", "replica1"]
    assert [k["agree"] for k in document["keys"]] == [True, False]
    assert doc(["walk"], env=env)["diverged"] == 1
    assert ok(["diff", "e1"], env=env)


def test_a_redis_cluster_seed_as_a_replica(servers: LocalShards, redis_cluster: LocalRedisCluster, prefix: str) -> None:
    seed = redis_cluster.url.replace("redis://", "redis+cluster://", 1)
    args = ["--replica", servers.urls[0], "--replica", seed, "--prefix", prefix]
    with on(servers.urls[0], prefix) as zero:
        zero.insert([(f"c{i}", 1, "m") for i in range(5)])
    assert run([*args, "diff", "c0"]).exit_code == 3
    assert doc([*args, "walk"])["repaired"] == 5
    assert ok([*args, "diff", *(f"c{i}" for i in range(5))]).stdout.count("replicas agree") == 5
    with Cluster.from_cluster_url(redis_cluster.url, prefix=prefix) as cluster:
        assert cluster.select(["c3"])["c3"] == [KeyScoreMember("c3", 1.0, "m")]


def test_the_other_commands_on_a_farm(servers: LocalShards, args: list[str], prefix: str) -> None:
    assert doc([*args, "insert", "f", "1", "a", "f", "2", "b"])["applied"] == 2
    assert doc([*args, "delete", "f", "3", "a"])["applied"] == 1
    with on(servers.urls[1], prefix) as one:
        one.insert([("f", 5, "late")])  # on one replica only: a farm read merges it in (and repairs)
    members = doc([*args, "select", "f"])["keys"][0]["members"]
    assert members == [{"score": 5.0, "member": "late"}, {"score": 2.0, "member": "b"}]
    assert doc([*args, "score", "f", "a"])["members"][0]["inserted"] is False
    assert doc([*args, "keys"])["keys"] == ["f"]
    assert doc([*args, "keys", "--include-removed"])["keys"] == ["f"]
    shards = doc([*args, "info"])["shards"]
    assert [s["shard"].split("/")[0] for s in shards] == ["replica0", "replica1", "replica2"]
    assert all(s["keys"] == 1 for s in shards)
    assert ok([*args, "diff", "f"])  # the select repaired replica 0 and 2


def test_a_dead_replica(servers: LocalShards, prefix: str, dead_port: int) -> None:
    dead = f"127.0.0.1:{dead_port}"
    args = ["--replica", servers.urls[0], "--replica", servers.urls[1], "--replica", f"redis://{dead}"]
    args += ["--prefix", prefix]
    # Writes reach the quorum (2 of 3): a warning names the replica that missed them, exit 0.
    written = ok([*args, "insert", "d", "1", "m", "--json"])
    assert json.loads(written.stdout)["replica_failures"][0]["shard"] == f"replica2/{dead}"
    assert f"Warning: shard replica2/{dead}" in written.stderr
    assert doc([*args, "select", "d"])["keys"][0]["members"] == [{"score": 1.0, "member": "m"}]

    result = fails([*args, "diff", "d", "--json"])
    (key,) = json.loads(result.stdout)["keys"]
    assert key["agree"] is True and f"replica2/{dead}" in key["errors"]["replica2"]
    assert key["members"][0]["replicas"]["replica2"] is None
    assert f"replica2/{dead}" in fails([*args, "diff", "d"]).stderr

    walked = fails([*args, "walk", "--json"])
    report = json.loads(walked.stdout)
    assert report["complete"] is True and report["keys"] == 1
    assert [f["shard"] for f in report["failures"]] == [f"replica2/{dead}"]
    assert f"replica2/{dead} could not be scanned or read" in walked.stderr


def test_repairs_that_fail_are_reported(prefix: str) -> None:
    with LocalShards(2) as own:
        with on(own.urls[0], prefix) as zero:
            zero.insert([("x", 1, "m"), ("y", 1, "m")])
        redis.Redis.from_url(own.urls[1]).config_set("min-replicas-to-write", 1)  # refuses every write
        args = [*(a for u in own.urls for a in ("--replica", u)), "--prefix", prefix]
        result = fails([*args, "walk", "--json"])
        report = json.loads(result.stdout)
        assert report["diverged"] == 2 and report["repair_failures"] == 2 and report["repaired"] == 0
        assert f"could not be repaired on replica1/127.0.0.1:{own.servers[1].port}" in result.stderr


def test_walk_progress_on_a_terminal(
    servers: LocalShards, args: list[str], prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()

    def fake_console(stderr: bool = False) -> Console:
        return Console(file=stream, force_terminal=True, width=200) if stderr else plain_console(stderr)

    monkeypatch.setattr("zcluster.cli.replicas.console", fake_console)
    with on(servers.urls[1], prefix) as one:
        one.insert([("p", 1, "m")])
    ok([*args, "walk", "--batch-size", "1"])
    shown = stream.getvalue()
    assert "walking replica" in shown and "keys compared" in shown and "diverged" in shown and "repaired" in shown
    assert "keys compared" not in run([*args, "walk"]).stderr  # not a terminal: no progress display


def test_password_never_printed(servers: LocalShards, prefix: str, dead_port: int) -> None:
    with LocalShards(1, extra=["--requirepass", SECRET]) as secured:
        port = secured.servers[0].port
        url = f"redis://:{SECRET}@127.0.0.1:{port}"
        args = ["--replica", url, "--replica", servers.urls[0], "--prefix", prefix]
        outputs = []
        for command in (
            ["insert", "k", "1", "m"],
            ["select", "k"],
            ["score", "k", "m"],
            ["keys"],
            ["info"],
            ["diff", "k"],
            ["walk"],
        ):
            outputs += [ok([*args, *command]), ok([*args, *command, "--json"])]
        with on(servers.urls[0], prefix) as plain:
            plain.insert([("k", 2, "n")])
        outputs += [run([*args, "diff", "k"]), run([*args, "diff", "k", "--json"]), ok([*args, "walk", "--json"])]
        outputs.append(ok(["--prefix", prefix, "diff", "k"], env={"ZCLUSTER_REPLICAS": f"{url};{servers.urls[0]}"}))
        assert f"127.0.0.1:{port}" in outputs[-2].stdout  # the walk names the replica's server ...
        assert json.loads(outputs[-2].stdout)["replicas"][0]["where"] == f"redis://***@127.0.0.1:{port}"

        dead = f"redis://:{SECRET}@127.0.0.1:{dead_port}"
        wrong = f"redis://:wr0ng{SECRET}@127.0.0.1:{port}"
        # With a live and a dead shard in one replica, the key must route to the dead one to fail.
        split = Cluster.from_urls([url, dead], prefix=prefix)
        dead_name = dead.rsplit("@", 1)[1]
        on_dead = next(f"k{i}" for i in range(1000) if split.shard_of(f"k{i}") == dead_name)
        split.close()
        for bad in (dead, wrong, f"{url},{dead}", f"redis+cluster://:{SECRET}@127.0.0.1:{dead_port}"):
            failing = ["--replica", url, "--replica", bad, "--prefix", prefix]
            key = on_dead if "," in bad else "k"
            for command in (["diff", key], ["walk"], ["insert", key, "3", "m"], ["keys"], ["info"]):
                # url,dead is not the layout url's store was marked with (1 shard): the layout guard refuses
                # what connects to url (exit 2); diff and insert of the key on the dead shard never do
                code = 2 if "," in bad and command[0] in ("walk", "keys", "info") else 1
                outputs += [fails([*failing, *command], code), fails([*failing, *command, "--json"], code)]
                assert code == 1 or "a shard was added" in outputs[-1].stderr
        for bad in (f"redis://:{SECRET}@127.0.0.1:99999", f"{url},redis+cluster://:{SECRET}@127.0.0.1:1"):
            outputs.append(fails(["--replica", url, "--replica", bad, "diff", "k"], code=2))
        outputs.append(fails(["--replica", url, "--url", url, "keys"], code=2))
        outputs.append(fails(["--replica", url, "walk"], code=2))
        assert all(SECRET not in r.output for r in outputs)  # ... but never the password
        assert all("Error: replica1: " in r.stderr for r in outputs[-4:-2])  # the bad URL's replica is named


def _fingerprints(server: redis.Redis) -> int:
    """Script calls ``server`` ran to an end (``EVALSHA``: a walk's fingerprints of a step's keys)."""
    stats = server.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


def _interruptible(args: list[str]) -> subprocess.Popen[str]:
    """The command in a child process whose Ctrl-C (SIGINT) raises KeyboardInterrupt, as in a shell."""
    code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\nfrom zcluster.cli import main\n"
    code += "main()\n"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_ctrl_c_stops_the_walk_and_prints_where_to_resume(servers: LocalShards, args: list[str], prefix: str) -> None:
    with on(servers.urls[0], prefix) as zero:
        zero.insert([(f"i{i}", 1, "m") for i in range(200)])
    probe = redis.Redis.from_url(servers.urls[2])
    before = _fingerprints(probe)
    # --rate 5: a step of 5 keys a second, so the walk (40 s) is surely under way when Ctrl-C lands
    child = _interruptible([*args, "walk", "--rate", "5", "--batch-size", "5", "--json"])
    try:
        deadline = time.monotonic() + 120
        while _fingerprints(probe) == before:  # the walk compared keys (it fingerprints them on every replica)
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, (stdout, stderr)
    report = json.loads(stdout)
    assert report["interrupted"] is True and report["complete"] is False
    assert 0 < report["keys"] < 200
    assert f"Interrupted: resume with --resume {report['position']}" in stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr

    rest = doc([*args, "walk", "--resume", report["position"]])
    assert rest["complete"] is True and report["keys"] + rest["keys"] == 200
    assert ok([*args, "diff", *(f"i{i}" for i in range(200))]).stdout.count("replicas agree") == 200


def test_top_and_counters_on_a_farm_read_the_leading_replica(
    servers: LocalShards, args: list[str], prefix: str
) -> None:
    with on(servers.urls[0], prefix) as zero, on(servers.urls[1], prefix) as one:
        for c in (zero, one):  # two replicas hold both increments; replica2 none of them
            c.increment("j", [(1, Incr("lb", "ada", 5.0)), (2, Count("views", "home", 3))])
        zero.increment("j", [(3, Incr("lb", "bob", 7.0))])  # replica0 leads: one more of the same source
    page = doc([*args, "top", "lb", "-n", "5"])
    assert [(e["rank"], e["member"], e["total"]) for e in page["entries"]] == [(1, "bob", 7.0), (2, "ada", 5.0)]
    assert doc([*args, "counters", "views"])["keys"] == [
        {"key": "views", "counters": [{"field": "home", "total": 3}], "error": None}
    ]
    before = doc([*args, "fences", "lb"])["keys"]
    assert [(k["replica"], [f["held"] for f in k["fences"]]) for k in before] == [
        ("replica0", [2]),
        ("replica1", [2]),  # repaired by the reads above: it held 1
        ("replica2", [2]),
    ]
    for url in servers.urls:  # the reads repaired the replicas behind the leading one
        with on(url, prefix) as c:
            assert [(str(t.member), t.score) for t in c.top(["lb"])["lb"]] == [("bob", 7.0), ("ada", 5.0)]
