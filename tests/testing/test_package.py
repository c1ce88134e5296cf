"""zcluster.testing as users see it: lazy names, nothing started at import, the pytest plugin, traffic."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import zcluster.testing
from zcluster.testing import LocalShards


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def test_every_exported_name_resolves() -> None:
    for name in zcluster.testing.__all__:
        assert getattr(zcluster.testing, name) is not None, name
    assert set(zcluster.testing.__all__) <= set(dir(zcluster.testing))


def test_importing_starts_nothing_and_loads_neither_redis_nor_pytest() -> None:
    code = "import sys, zcluster.testing\nprint(sorted(m for m in ('redis', 'pytest') if m in sys.modules))\n"
    assert _python(code) == "[]"
    code = (
        "import threading, zcluster.testing.servers, zcluster.testing.redis_cluster\nprint(threading.active_count())\n"
    )
    assert _python(code) == "1"  # the spawner thread is started on first need only


def test_traffic_imports_no_spark() -> None:
    code = "import sys, zcluster.testing.traffic\nprint('pyspark' in sys.modules, 'zcluster.spark' in sys.modules)\n"
    assert _python(code) == "False False"


def test_a_server_started_from_a_short_lived_thread_outlives_it() -> None:
    with LocalShards(1) as shards:
        shards.kill(0)
        thread = threading.Thread(target=shards.start, args=(0,))
        thread.start()
        thread.join()
        time.sleep(0.2)  # a server tied to the dead thread would be going now
        with shards.servers[0].client() as c:
            assert c.ping()


def test_the_plugin_in_a_users_own_test_suite(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["zcluster.testing.plugin"]\n')
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            from zcluster import Cluster, KeyScoreMember

            def test_prefixes_differ(prefix, request):
                assert prefix.endswith(":")
                assert request.getfixturevalue("shards").urls

            def test_both_topologies(any_cluster: Cluster, prefix: str) -> None:
                assert any_cluster.prefix == prefix.encode()
                any_cluster.insert([("k", 1.0, "m")])
                assert any_cluster.select(["k"])["k"] == [KeyScoreMember("k", 1.0, "m")]

            def test_cluster_fixture(redis_cluster) -> None:
                assert redis_cluster.url.startswith("redis://")
            """
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "4 passed" in out.stdout
