"""``zcluster server-module``: builds the Redis module, prints a path a running server loads (MODULE LOAD),
after which a client writes through it; a compiler that fails is one clean error line."""

from __future__ import annotations

from pathlib import Path

import redis
from cli_helpers import doc, fails, ok

from zcluster import Cluster, Insert
from zcluster._server_module import PROTOCOL
from zcluster.testing import LocalShards


def test_the_printed_path_loads_into_a_running_server(tmp_path: Path) -> None:
    result = ok(["server-module", "--out", str(tmp_path / "m.so")])
    path = result.stdout.strip()
    assert path == str(tmp_path / "m.so") and Path(path).is_file()
    assert f"--loadmodule {path}" in result.stderr
    with LocalShards(1, extra=["--enable-module-command", "yes"]) as group:
        r = redis.Redis.from_url(group.urls[0])
        r.execute_command("MODULE", "LOAD", path)
        assert r.execute_command("ZCLUSTER.VERSION") == PROTOCOL
        with Cluster.from_urls(group.urls, prefix="clim:") as c:
            assert c.insert([Insert("k", 1.0, "m")]).applied == [True]  # the server asked, by the script
            assert c.insert([Insert("j", 1.0, "m")]).applied == [True]
            assert list(c._transport.native.values()) == [True]
        assert r.info("commandstats")["cmdstat_zcluster.write"]["calls"] == 1
        # an operator sees which servers have it
        assert doc(["--url", group.urls[0], "info", "--no-scan"])["shards"][0]["module_version"] == PROTOCOL
        assert f"v{PROTOCOL}" in ok(["--url", group.urls[0], "info", "--no-scan"]).stdout


def test_a_failing_compiler_is_one_error_line(tmp_path: Path) -> None:
    result = fails(["server-module", "--out", str(tmp_path / "m.so")], env={"CC": "false"})
    assert "building zcluster's Redis module with 'false' failed" in result.stderr
    assert not (tmp_path / "m.so").exists() and not list(tmp_path.iterdir())
