"""Fuzz tier (hypothesis) for the input edges, against the shared real test servers.

* ``Cluster.insert``: any list mixing valid tuples with bad items (wrong arity, non-str/bytes keys or members,
  empty keys, NaN/inf/inexact or overflowing ints/bools/strings as scores, str/bytes mixes of one key) either
  applies wholly (every valid tuple then reads back through ``score()``) or raises :class:`InvalidTupleError`
  naming the index of the first bad item, with the key space under the test's prefix unchanged.
* The ``zcluster`` command: score text (``parse_score`` and ``insert`` arguments) and connection URLs
  (``ClusterConfig.of`` and ``--url``/``--cluster-url``, with passwords holding ``/``, ``#``, ``?``, ``@``):
  never a traceback; bad input is one ``Error:`` line and exit status 2; no password ever in the output.

``ZC_FUZZ_EXAMPLES`` raises the example count for a longer hunt.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zcluster import Cluster, InvalidTupleError, KeyMember, KeyScoreMember
from zcluster._keys import glob_escape
from zcluster.cli import cli
from zcluster.cli.output import parse_score
from zcluster.config import ClusterConfig
from zcluster.errors import ConfigError
from zcluster.testing import LocalShards, closed_port
from zcluster.types import to_bytes

EXAMPLES = int(os.environ.get("ZC_FUZZ_EXAMPLES", "80"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_runs = itertools.count()

# -- Cluster.insert -----------------------------------------------------------------------------------------

# Key and member text: hash-tag braces, ':', NUL, non-ASCII, and the surrogateescape range (\udc80-\udcff is
# how a str spells a non-UTF-8 byte, so "\udc80" and b"\x80" are one key).
TEXT = st.text(alphabet="ab{}:/\x00é\udc80\udcff", max_size=5)


def _blob(text: str, as_bytes: bool) -> str | bytes:
    return text.encode("utf-8", "surrogateescape") if as_bytes else text


# A valid tuple, as (container, key text, key as bytes?, score, member text, member as bytes?). The key gets
# a per-run tag when it is built, so runs never see each other's writes.
valid_score = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**53), 2**53),
    st.integers(0, 1023).flatmap(lambda e: st.sampled_from([2**e, -(2**e)])),  # big but exact as a double
)
valid_spec = st.tuples(st.sampled_from(["tuple", "list", "ksm"]), TEXT, st.booleans(), valid_score, TEXT, st.booleans())

bad_score = st.one_of(
    st.sampled_from([math.nan, -math.nan, math.inf, -math.inf, True, False, None, b"1", Decimal(1), Fraction(1, 2)]),
    st.integers(2**53 + 1, 2**1023).map(lambda n: n | 1),  # odd beyond 2**53: not exact as a double
    st.integers(2**1024, 10**400).flatmap(lambda n: st.sampled_from([n, -n])),  # beyond a double's range
    st.text(max_size=4),
    st.complex_numbers(allow_nan=False, max_magnitude=10),
)
bad_blob = st.one_of(
    st.integers(),
    st.floats(),
    st.none(),
    st.booleans(),
    st.binary(max_size=3).map(bytearray),
    st.lists(st.text(max_size=2), max_size=2),
)
good_key = TEXT.filter(bool).flatmap(lambda t: st.sampled_from([t, _blob(t, True)]))
good_member = TEXT.flatmap(lambda t: st.sampled_from([t, _blob(t, True)]))
any_value = st.one_of(st.text(max_size=3), st.floats(), st.integers(), st.none(), st.binary(max_size=3))

# Bad items: each is certainly invalid, whatever the implementation checks first.
bad_item = st.one_of(
    st.lists(any_value, max_size=6).filter(lambda v: len(v) != 3).flatmap(lambda v: st.sampled_from([v, tuple(v)])),
    st.one_of(st.none(), st.integers(), st.floats()),  # not a sequence at all
    st.text(max_size=6),  # a str of 3 characters unpacks, but its score is a str
    st.binary(max_size=6),  # bytes of 3 unpack to ints
    st.dictionaries(st.text(max_size=2), st.integers(), min_size=3, max_size=3),  # unpacks to its str keys
    st.tuples(st.sampled_from(["", b""]), valid_score, good_member),  # the empty key
    st.tuples(bad_blob, valid_score, good_member),
    st.tuples(good_key, valid_score, bad_blob),
    st.tuples(good_key, bad_score, good_member),
    st.tuples(st.one_of(good_key, bad_blob), bad_score, st.one_of(good_member, bad_blob)),
)
valid_item = valid_spec.map(lambda s: ("valid", s))
item_spec = st.one_of(valid_item, valid_item, bad_item.map(lambda b: ("bad", b)))
# Half the runs are valid throughout (they must apply), half mix in bad items (they must send nothing).
runs = st.one_of(st.lists(valid_item, max_size=10), st.lists(item_spec, max_size=10))


def build(spec: tuple[str, Any], tag: str) -> Any:
    kind, value = spec
    if kind == "bad":
        return value
    container, key, key_bytes, score, member, member_bytes = value
    item = (_blob(tag + key, key_bytes), score, _blob(member, member_bytes))
    return {"tuple": tuple, "list": list, "ksm": lambda t: KeyScoreMember(*t)}[container](item)


@pytest.fixture
def raw_clients(request: pytest.FixtureRequest, any_cluster: Cluster) -> Iterator[list[Any]]:
    """A plain redis-py client per server of the topology under test (for snapshots of the raw key space)."""
    group = "shards" if request.node.callspec.params["any_cluster"] == "shards" else "redis_cluster"
    clients = [s.client() for s in request.getfixturevalue(group).servers]
    yield clients
    for c in clients:
        c.close()


def key_space(clients: list[Any], prefix: str) -> dict[bytes, object]:
    """Every Redis key under ``prefix`` on every server, with its content."""
    out: dict[bytes, object] = {}
    pattern = b"{" + glob_escape(prefix.encode()) + b"*"
    for c in clients:
        for key in c.scan_iter(match=pattern, count=1000):
            kind = c.type(key)
            out[key] = c.zrange(key, 0, -1, withscores=True) if kind == b"zset" else (kind, c.dump(key))
    return out


@FUZZ
@given(specs=runs)
def test_insert_applies_wholly_or_names_the_first_bad_item_and_sends_nothing(
    any_cluster: Cluster, raw_clients: list[Any], prefix: str, specs: list[tuple[str, Any]]
) -> None:
    tag = f"r{next(_runs)}/"  # one per run: items of a run may share keys (as str and as bytes), runs never do
    items = [build(spec, tag) for spec in specs]
    first_bad = next((i for i, (kind, _) in enumerate(specs) if kind == "bad"), None)
    if first_bad is not None:
        before = key_space(raw_clients, prefix)
        with pytest.raises(InvalidTupleError) as info:
            any_cluster.insert(items)
        assert info.value.index == first_bad, (info.value, items)
        assert str(info.value).startswith(f"tuple #{first_bad} ") and "nothing of this call was sent" in str(info.value)
        assert key_space(raw_clients, prefix) == before
        return
    result = any_cluster.insert(items)
    assert result.ok and len(result.applied) == len(items)
    best: dict[KeyMember, float] = {}  # the highest score of each member wins (insert-only)
    for key, score, member in items:
        km = KeyMember(to_bytes(key), to_bytes(member))
        best[km] = max(best.get(km, -math.inf), float(score))
    presence = any_cluster.score(list(best))
    for km, score in best.items():
        got = presence[km]
        assert got.present and got.inserted and got.score == score, (km, got, score)


@pytest.mark.parametrize("where", ["key", "member"])
def test_a_lone_surrogate_is_an_invalid_tuple(shards: LocalShards, prefix: str, where: str) -> None:
    bad = ("k", 1.0, "\ud800") if where == "member" else ("\ud800", 1.0, "m")
    with Cluster.from_urls(shards.urls, prefix=prefix) as c, pytest.raises(InvalidTupleError) as info:
        c.insert([("k", 1.0, "m"), bad])
    assert info.value.index == 1


def test_an_integer_score_of_5000_digits_is_an_invalid_tuple(shards: LocalShards, prefix: str) -> None:
    with Cluster.from_urls(shards.urls, prefix=prefix) as c, pytest.raises(InvalidTupleError) as info:
        c.insert([("k", 1.0, "m"), ("k", 10**5000, "m")])
    assert info.value.index == 1


# -- the command line: scores -------------------------------------------------------------------------------

number_text = st.one_of(
    st.from_regex(r"\s?[+-]?(?:[0-9]{0,30}\.?[0-9]{0,20}(?:[eE][+-]?[0-9]{1,4})?|inf|infinity|nan)\s?", fullmatch=True),
    st.floats().map(repr),
    st.integers(-(2**70), 2**70).map(str),
    st.integers(4290, 4310).map(lambda n: "9" * n),  # around int()'s digit limit
)
score_text = st.one_of(st.text(), number_text)


def error_lines(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("Error:")]


def clean_exit(result: Result) -> None:
    """Never a traceback: success, or a handled exit."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (result.exception, result.output)
    assert "Traceback" not in result.output


@FUZZ
@given(text=score_text)
def test_parse_score_returns_a_finite_float_or_names_where(text: str) -> None:
    try:
        value = parse_score(text, "argument 2")
    except ValueError as exc:
        assert str(exc).startswith("argument 2: ")
        return
    assert isinstance(value, float) and math.isfinite(value)
    assert value == float(text.strip())
    if re.fullmatch(r"\s*[+-]?[0-9]+\s*", text):
        assert value == int(text.strip())  # integers are exact, or refused


@FUZZ
@given(key=st.text(min_size=1), score=score_text, member=st.text())
def test_cli_insert_scores_write_or_are_one_usage_error(shards: LocalShards, key: str, score: str, member: str) -> None:
    prefix = f"fz{next(_runs)}:"
    result = CliRunner().invoke(cli, ["--url", shards.urls[0], "--prefix", prefix, "insert", "--", key, score, member])
    clean_exit(result)
    try:
        expected = parse_score(score, "x")
    except ValueError:
        assert result.exit_code == 2 and len(error_lines(result)) == 1, result.output
        assert result.stdout == ""
        with Cluster.from_urls([shards.urls[0]], prefix=prefix) as c:
            assert sum(len(batch) for batch in c.keys(include_removed=True)) == 0  # nothing was written
        return
    assert result.exit_code == 0, result.output
    with Cluster.from_urls([shards.urls[0]], prefix=prefix) as c:
        got = c.score([KeyMember(key, member)])[KeyMember(key, member)]
    assert got.present and got.inserted and got.score == expected


def test_cli_an_empty_key_argument_is_a_usage_error(shards: LocalShards) -> None:
    result = CliRunner().invoke(cli, ["--url", shards.urls[0], "--prefix", "fz:", "insert", "--", "", "1", "m"])
    clean_exit(result)
    assert len(error_lines(result)) == 1
    assert result.exit_code == 2


# -- the command line and ClusterConfig: URLs ---------------------------------------------------------------

# Passwords are runs of Q, X, Z and J (letters nothing else in a URL or a message here uses) around the
# characters that cut a URL short: any run of three of them in the output is a leak.
LEAK = re.compile(r"[QXZJ]{3,}")
password = st.lists(
    st.tuples(
        st.text(alphabet="QXZJ", min_size=3, max_size=5),
        st.sampled_from(["", "/", "#", "?", "@", ":", "%", " ", "&", "="]),
    ),
    min_size=1,
    max_size=3,
).map(lambda parts: "".join(a + b for a, b in parts))
LOWER = "abcdefghiklmnoprstuvwy"  # no q, x, z, j
query_option = st.one_of(
    password.map(lambda p: f"password={p}"),
    st.tuples(
        st.sampled_from(["db", "socket_timeout", "protocol", "client_name", "foo", "retry", "ssl_ca_certs", "timeout"]),
        st.text(alphabet=LOWER + "0123456789.-", max_size=4),
    ).map("=".join),
)


@st.composite
def urls(draw: st.DrawFn, live_port: int, dead_port: int) -> tuple[str, list[str]]:
    """A URL and the secrets in it (its password, and any password= query value)."""
    scheme = draw(st.sampled_from(["redis", "rediss", "redis+cluster", "unix", "http", "REDIS", ""]))
    user = draw(st.text(alphabet=LOWER, max_size=4))
    secret = draw(password)
    host = draw(st.sampled_from(["127.0.0.1", "localhost", "[::1]", "[::1", "", "127.0.0.1:"]))
    port = draw(
        st.one_of(
            st.sampled_from([str(dead_port), "", "0", "65536", "99999", "-1", "port", "1e3"]),
            st.text(alphabet="0123456789abc:", max_size=6),
            st.just(str(live_port)) if not scheme.startswith("rediss") else st.just(str(dead_port)),
        )
    )
    path = draw(st.sampled_from(["", "/", "/0", "/3", "/abc", "/-1"]))
    options = draw(st.lists(query_option, max_size=3))
    auth = draw(st.sampled_from([f"{user}:{secret}@", f":{secret}@", f"{user}@", ""]))
    query = "&".join(["socket_connect_timeout=0.5", *options]) if options or draw(st.booleans()) else ""
    url = f"{scheme}://{auth}{host}{':' + port if port else ''}{path}{'?' + query if query else ''}"
    secrets = [secret] if secret in auth else []
    return url, secrets + [o.partition("=")[2] for o in options if o.startswith("password=")]


@pytest.fixture(scope="module")
def dead_port() -> Iterator[int]:
    with closed_port() as port:  # the module's examples share it
        yield port


def assert_no_secret(text: str, secrets: list[str]) -> None:
    assert not LEAK.search(text), text
    for s in secrets:
        assert s not in text


@FUZZ
@given(data=st.data(), cluster=st.booleans(), as_list=st.booleans())
def test_cluster_config_takes_a_url_or_refuses_it_without_the_password(
    shards: LocalShards, dead_port: int, data: st.DataObject, cluster: bool, as_list: bool
) -> None:
    url, secrets = data.draw(st.one_of(urls(shards.servers[0].port, dead_port), st.text().map(lambda t: (t, []))))
    try:
        config = ClusterConfig.of([url] if as_list else url, cluster=cluster and not as_list)
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
        assert_no_secret(str(exc), secrets)
        return
    assert_no_secret(repr(config), secrets)


@FUZZ
@given(data=st.data(), flag=st.sampled_from(["--url", "--cluster-url"]), prefix=st.text(max_size=6))
def test_cli_urls_work_or_fail_in_one_error_line_without_the_password(
    shards: LocalShards, dead_port: int, data: st.DataObject, flag: str, prefix: str
) -> None:
    url, secrets = data.draw(urls(shards.servers[0].port, dead_port))
    args = [flag, url, "--prefix", f"fz{prefix}:", "keys"]
    result = CliRunner().invoke(cli, args, env={"ZCLUSTER_URLS": "", "ZCLUSTER_CLUSTER_URL": ""})
    clean_exit(result)
    assert_no_secret(result.output, secrets)
    if result.exit_code == 0:
        return
    assert result.exit_code in (1, 2), (result.exit_code, result.output)
    assert error_lines(result), result.output
    if result.exit_code == 2:  # a usage error: one line, nothing on stdout
        assert len(result.stderr.splitlines()) == 1 and result.stdout == "", result.output
