"""Replica plumbing shared by :class:`~zcluster.testing.LocalShards` and ``LocalRedisCluster``.

A replica counts as *online* when all of these hold: its own ``INFO replication`` reports
``master_link_status:up``; its master's ``INFO replication`` lists it (by port) with ``state=online``; and
``WAIT`` on that master counts it (the replica has acknowledged the master's replication offset); and, with
AOF on, the replica is not rewriting its AOF. ``WAIT`` makes sure the master already streams writes to it:
after a full sync, a master may hold its stream back until the replica's first periodic acknowledgement,
up to a second later. The AOF check is there because a replica with AOF restarts it after every full sync:
until that rewrite is done, what it receives goes to a temporary file that a kill discards, so a killed
and restarted replica would come back empty.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from zcluster.errors import ZClusterError
from zcluster.testing._local import LocalServer

__all__ = ["replica_problems", "requirepass", "wait_replicas_online"]


def requirepass(extra: Sequence[str]) -> str | None:
    """The password of a ``--requirepass <pw>`` pair in server options, else None."""
    args = list(extra)
    for i, arg in enumerate(args[:-1]):
        if arg == "--requirepass":
            return args[i + 1]
    return None


_PROBE = {"socket_connect_timeout": 0.5, "socket_timeout": 5.0, "retry": Retry(NoBackoff(), 0)}


def _master_listing(replica: LocalServer, group: Sequence[LocalServer], password: str | None) -> LocalServer | str:
    """The master (in ``group``) of ``replica`` if its link is up and that master lists it online, else why not."""
    where = f"replica on port {replica.port}"
    try:
        with replica.client(password=password, **_PROBE) as c:
            info = c.info("replication")
            persistence = c.info("persistence")
        if info.get("role") != "slave":
            return f"{where}: role:{info.get('role')}"
        where += f" of the master on port {info.get('master_port')}"
        if info.get("master_link_status") != "up":
            return f"{where}: master_link_status:{info.get('master_link_status')}"
        rewriting = persistence.get("aof_rewrite_in_progress") or persistence.get("aof_rewrite_scheduled")
        if persistence.get("aof_enabled") and rewriting:
            return f"{where}: still rewriting its AOF after the sync"
        master = next((s for s in group if s.port == info.get("master_port")), None)
        if master is None:
            return f"{where}: that master is not one of this group's servers"
        with master.client(password=password, **_PROBE) as c:
            listed = c.info("replication")
    except redis.RedisError as exc:
        return f"{where}: {exc.__class__.__name__}: {exc}"
    for key, value in listed.items():
        if key.startswith("slave") and isinstance(value, dict) and value.get("port") == replica.port:
            return master if value.get("state") == "online" else f"{where}: listed with state={value.get('state')}"
    return f"{where}: its master does not list it yet"


def replica_problems(
    replicas: Sequence[LocalServer], group: Sequence[LocalServer], password: str | None = None
) -> list[str]:
    """What keeps any of ``replicas`` (of masters in ``group``) from being online; empty if nothing does.

    Blocks up to a second per master in ``WAIT``.
    """
    problems: list[str] = []
    waiting: dict[int, tuple[LocalServer, list[LocalServer]]] = {}
    for r in replicas:
        found = _master_listing(r, group, password)
        if isinstance(found, str):
            problems.append(found)
        else:
            waiting.setdefault(found.port, (found, []))[1].append(r)
    if problems:
        return problems
    for master, rs in waiting.values():
        try:
            with master.client(password=password, **_PROBE) as c:
                counted = int(c.execute_command("WAIT", len(rs), 1000))
        except redis.RedisError as exc:
            problems.append(f"master on port {master.port}: WAIT: {exc}")
            continue
        if counted < len(rs):
            ports = ", ".join(str(r.port) for r in rs)
            problems.append(f"master on port {master.port}: WAIT counted {counted} of its replicas on ports {ports}")
    return problems


def wait_replicas_online(
    replicas: Sequence[LocalServer], group: Sequence[LocalServer], timeout: float, password: str | None = None
) -> None:
    """Wait until every one of ``replicas`` is online; a :class:`ZClusterError` naming the ports if not in time."""
    deadline = time.monotonic() + timeout
    while True:
        problems = replica_problems(replicas, group, password)
        if not problems:
            return
        if time.monotonic() > deadline:
            raise ZClusterError(f"replicas not online after {timeout}s: " + "; ".join(problems))
        time.sleep(0.02)
