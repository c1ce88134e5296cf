"""Process plumbing for the local test servers: free loopback ports, and children that die with their parent.

:func:`free_port` is re-exported as :func:`zcluster.testing.free_port`.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from zcluster.errors import ZClusterError

__all__ = ["free_port"]


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
