"""The ``zcluster`` command's error paths: URL errors, shards failing a scan, score text, the missing extra."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest
from cli_helpers import doc, fails, ok

from zcluster import Cluster
from zcluster._encode import check_score
from zcluster.cli.output import parse_score
from zcluster.testing import LocalShards, free_port

PASSWORD = "pw5ecr"

# URLs the library refuses; each holds the password, or a piece of it when an unescaped character cuts it.
BAD_URLS = [
    f"redis://:{PASSWORD}@127.0.0.1:99999",  # port out of range
    f"redis://:{PASSWORD}@127.0.0.1:port",  # port not a number
    "redis://:pw5/ecr@127.0.0.1:6379",  # unescaped '/' in the password
    "redis://:pw5#ecr@127.0.0.1:6379",  # unescaped '#'
    "redis://:pw5?ecr@127.0.0.1:6379",  # unescaped '?'
    "redis://[::1",  # unclosed IPv6 host
    f"redis://:{PASSWORD}@[::1",
    f"http://:{PASSWORD}@127.0.0.1:6379",  # not a Redis scheme
    f"redis://user:{PASSWORD}@127.0.0.1:6379/zero",  # the path is not a database number
    f"redis://:{PASSWORD}@127.0.0.1:6379?socket_timeout=soon",  # a query option redis-py refuses
]


def _one_clean_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    for piece in (PASSWORD, "pw5", "ecr"):
        assert piece not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize("where", ["--url", "--cluster-url", "ZCLUSTER_URLS", "ZCLUSTER_CLUSTER_URL"])
def test_every_url_error_is_one_usage_error_line_without_the_password(url: str, where: str) -> None:
    if where.startswith("--"):
        result = fails([where, url, "keys"], code=2)
    else:
        result = fails(["keys"], code=2, env={"ZCLUSTER_URLS": "", "ZCLUSTER_CLUSTER_URL": "", where: url})
    line = _one_clean_error_line(result.stderr)
    assert "URL" in line
    assert result.stdout == ""


def test_a_url_error_among_good_ones_is_named(shards: LocalShards) -> None:
    result = fails(["--url", shards.urls[0], "--url", f"redis://:{PASSWORD}@127.0.0.1:99999", "keys"], code=2)
    assert "127.0.0.1:99999" in _one_clean_error_line(result.stderr)
    both = fails(["--url", shards.urls[0], "--url", f"redis+cluster://:{PASSWORD}@127.0.0.1:1", "keys"], code=2)
    assert "one seed URL" in _one_clean_error_line(both.stderr)


@pytest.mark.parametrize("flag", ["--url", "--cluster-url"])
def test_a_bad_prefix_is_a_usage_error_before_any_server_is_contacted(flag: str) -> None:
    dead = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}"  # nobody listens: the prefix is refused first
    result = fails([flag, dead, "--prefix", "a{b", "keys"], code=2)
    assert "braces" in _one_clean_error_line(result.stderr)


def test_cluster_url_takes_both_seed_forms(shards: LocalShards, dead_port: int) -> None:
    port = dead_port
    for url in (f"redis://:{PASSWORD}@127.0.0.1:{port}", f"redis+cluster://:{PASSWORD}@127.0.0.1:{port}"):
        result = fails(["--cluster-url", url, "keys"])  # a seed that does not answer: not a usage error
        assert f"127.0.0.1:{port}" in _one_clean_error_line(result.stderr)


@pytest.fixture
def half(shards: LocalShards, prefix: str) -> list[str]:
    """Keys written to the first shared shard (through a Cluster over that shard alone)."""
    with Cluster.from_urls([shards.urls[0]], prefix=prefix) as c:
        c.insert([(f"h{i}", 1.0, "m") for i in range(5)])
        c.delete([("gone", 1.0, "m")])
    return [f"h{i}" for i in range(5)]


@pytest.mark.parametrize("dead_first", [False, True])
def test_keys_lists_the_reachable_shards_then_names_the_failed_one(
    shards: LocalShards, prefix: str, dead_first: bool, dead_port: int
) -> None:
    dead = f"127.0.0.1:{dead_port}"
    urls = [shards.urls[0], f"redis://:{PASSWORD}@{dead}"]
    listed = urls[::-1] if dead_first else urls
    with Cluster.from_urls(listed, prefix=prefix) as c:  # the store's own layout: the layout guard checks it
        wrote = c.insert([(f"h{i}", 1.0, "m") for i in range(12)], raise_on_error=False)
        half = [f"h{i}" for i, applied in enumerate(wrote.applied) if applied]  # those of the live shard
        removed = c.delete([(f"gone{i}", 1.0, "m") for i in range(12)], raise_on_error=False)
        gone = [f"gone{i}" for i, applied in enumerate(removed.applied) if applied]
    assert half and gone
    args = [a for u in listed for a in ("--url", u)]
    result = fails([*args, "--prefix", prefix, "keys", "--count", "2"])
    assert sorted(result.stdout.split()) == sorted(half)
    assert dead in _one_clean_error_line(result.stderr)

    result = fails([*args, "--prefix", prefix, "keys", "--include-removed", "--json"])
    document = json.loads(result.stdout)
    assert sorted(document["keys"]) == sorted([*half, *gone])
    assert [e["shard"] for e in document["errors"]] == [dead]
    assert "Connection" in document["errors"][0]["error"]
    assert dead in _one_clean_error_line(result.stderr)
    assert PASSWORD not in result.output


def test_keys_json_has_no_errors_when_every_shard_answers(shards: LocalShards, prefix: str, half: list[str]) -> None:
    document = doc(["--url", shards.urls[0], "--prefix", prefix, "keys"])
    assert sorted(document["keys"]) == half and document["errors"] == []


@pytest.mark.parametrize("text", ["1_000", "0x10", "١٢", "1e", "--5", "1 000", "5.5.5", "e5", "infinit", "+"])
def test_python_only_and_malformed_score_spellings_are_not_numbers(text: str) -> None:
    with pytest.raises(ValueError, match="is not a number"):
        parse_score(text, "argument 2")
    result = fails(["--url", "redis://127.0.0.1:1", "insert", "k", text, "m"], code=2)
    assert "not a number" in result.stderr  # refused before the (dead) server is contacted


@pytest.mark.parametrize(
    ("text", "value"),
    [("+5", 5.0), ("-0", 0.0), (".5", 0.5), ("5.", 5.0), ("1E3", 1000.0), (" 7 ", 7.0), ("9007199254740992", 2.0**53)],
)
def test_decimal_score_spellings(text: str, value: float) -> None:
    assert parse_score(text, "x") == value


@pytest.mark.parametrize(
    ("value", "number"),
    [
        ("nan", float("nan")),
        ("-Infinity", float("-inf")),
        ("1e400", float("inf")),
        ("9007199254740993", 2**53 + 1),
        (2**53 + 1, 2**53 + 1),
        (float("inf"), float("inf")),
        (10**400, 10**400),
    ],
)
def test_score_rules_are_the_librarys(value: object, number: float) -> None:
    with pytest.raises(ValueError) as library:
        check_score(number)
    with pytest.raises(ValueError) as cli:
        parse_score(value, "line 3")
    assert str(cli.value) == f"line 3: {value!r}: {library.value}"


@pytest.mark.parametrize("value", [True, None, [1], {"n": 1}])
def test_json_scores_must_be_numbers(value: object) -> None:
    with pytest.raises(ValueError, match="score must be a number"):
        parse_score(value, "line 1")


def test_json_integer_scores_exact_as_doubles_are_accepted() -> None:
    assert parse_score(2**60, "x") == 2.0**60
    assert parse_score(-5, "x") == -5.0


@pytest.mark.parametrize("missing", ["click", "rich"])
def test_without_the_cli_extra_the_command_says_what_to_install(missing: str) -> None:
    code = f"import sys; sys.modules[{missing!r}] = None\nfrom zcluster.cli import main\nmain()\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2, out
    assert out.stderr.splitlines() == ["Error: the zcluster command needs click and rich: pip install 'zcluster[cli]'"]
    assert out.stdout == ""


def test_the_console_script_and_the_package_entry() -> None:
    (entry,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "zcluster"]
    assert entry.value == "zcluster.cli:main"
    assert callable(entry.load())
    code = "import sys, zcluster.cli\nprint(sorted(m for m in ('click', 'rich') if m in sys.modules))\n"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"
    out = subprocess.run([sys.executable, "-m", "zcluster.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "keys" in out.stdout and "insert" in out.stdout


def test_version_and_help_need_no_servers() -> None:
    assert "version" in ok(["--version"]).stdout
    assert "--cluster-url" in ok(["--help"]).stdout


def test_a_shard_list_the_store_was_not_laid_out_with_is_a_usage_error(shards: LocalShards, prefix: str) -> None:
    with Cluster.from_urls(shards.urls, prefix=prefix) as c:
        c.insert([("k", 1.0, "m")])
    reordered = ["--url", shards.urls[1], "--url", shards.urls[0], "--prefix", prefix]
    result = fails([*reordered, "keys"], code=2)
    assert "the list was reordered" in _one_clean_error_line(result.stderr)
    result = fails(["--url", shards.urls[0], "--url", shards.urls[1], "--prefix", prefix, "--max-size", "3", "keys"], 2)
    assert "max_size=None; this client has max_size=3" in _one_clean_error_line(result.stderr)
