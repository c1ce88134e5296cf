"""The built wheel carries the Lua scripts, the Redis module's source and, where a C compiler is, the hot path
compiled with mypyc (hatch_build.py): install it into a fresh venv outside the checkout, build the module from
it, and write through the module; without the ``cli`` extra, the ``zcluster`` command says how to get it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zcluster._native import EXTENSIONS, MODULES
from zcluster.testing import LocalShards

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)
def test_wheel_installs_outside_the_checkout_and_writes(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(ROOT)], check=True
    )
    wheel = next((tmp_path / "dist").glob("zcluster-*.whl"))
    listing = subprocess.run(
        [sys.executable, "-m", "zipfile", "-l", str(wheel)], check=True, capture_output=True, text=True
    ).stdout
    assert "zcluster/lua/write.lua" in listing and "zcluster/py.typed" in listing
    assert "zcluster/module/zcluster_module.c" in listing and "zcluster/module/abi.h" in listing
    native = shutil.which("cc") is not None and not os.environ.get("ZCLUSTER_PURE")
    assert ("zcluster_native__mypyc" in listing) == native, listing
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True)
    script = (
        "import sys, zcluster, zcluster._scripts as s\n"
        "assert 'site-packages' in zcluster.__file__, zcluster.__file__\n"
        "c = zcluster.Cluster.from_urls([sys.argv[1]])\n"
        "c.insert([zcluster.KeyScoreMember('j', 1.0, 'm')])  # the server asked, by the script\n"
        "r = c.insert([zcluster.KeyScoreMember('k', 1.0, 'm')])  # by the module\n"
        "import zcluster._native as n\n"
        "print(r.applied, c.select(['k'])['k'][0].member, s.write_script().sha, len(n.compiled()),\n"
        "      list(c._transport.native.values()))\n"
    )
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the wheel's package, not a checkout's
    build = "import sys, pathlib, zcluster._server_module as m; print(m.build(pathlib.Path(sys.argv[1])))"
    module = subprocess.run(
        [str(venv / "bin" / "python"), "-c", build, str(tmp_path / "redis-module.so")],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=alone,
    ).stdout.strip()
    assert module == str(tmp_path / "redis-module.so")
    with LocalShards(1, extra=["--loadmodule", module]) as shards:
        run = subprocess.run(
            [str(venv / "bin" / "python"), "-c", script, shards.urls[0]],
            check=False,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=alone,
        )
        module_calls = shards.servers[0].client().info("commandstats").get("cmdstat_zcluster.write", {}).get("calls")
    assert run.returncode == 0, run.stderr
    assert module_calls == 1  # the second insert went through the module the wheel built
    out = run.stdout.split()
    assert out[:2] == ["[True]", "m"] and out[4] == "[True]"
    assert int(out[3]) == (len(MODULES + EXTENSIONS) if native else 0)  # the compiled modules are the ones loaded
    # click and rich are the cli extra: without them the command says so in one line (exit 2).
    command = subprocess.run(
        [str(venv / "bin" / "zcluster"), "keys"], capture_output=True, text=True, cwd=tmp_path, env=alone
    )
    assert command.returncode == 2 and "zcluster[cli]" in command.stderr and len(command.stderr.splitlines()) == 1
