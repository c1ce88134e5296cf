"""Process plumbing for the local test servers: free loopback ports, children that die with their parent,
and the process tree under a pid (fault tests find the process to kill or pause there, from ``/proc``).

:func:`free_port`, :func:`closed_port`, :func:`descendants` and :func:`cmdline` are re-exported by
:mod:`zcluster.testing`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from zcluster.errors import ZClusterError

__all__ = ["closed_port", "cmdline", "descendants", "free_port"]


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


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that nothing listens on, for the block: bound and never listening, so a
    connection to it is refused at once, and no other process can take it meanwhile. A port :func:`free_port`
    found free can be: another test's server, started on a free port of its own, once answered a test's
    "dead" shard and failed it (2026-11-29)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, ``pid`` first (read from Linux's ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # the process ended meanwhile
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a TCP socket listening on ``port`` (from Linux's ``/proc``; True where
    there is no ``/proc/net/tcp`` to tell)."""
    if not os.path.exists("/proc/net/tcp"):
        return True
    inodes = set()
    with contextlib.suppress(OSError):  # the process ended: it holds nothing
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[len("socket:[") : -1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:  # sl local_address rem_address st ... inode
                fields = line.split()
                listening = fields[3] == "0A"  # TCP_LISTEN
                if listening and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                    return True
    return False


def cmdline(pid: int) -> str:
    """The command line of process ``pid``, its arguments joined by spaces; "" once it has ended."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


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
