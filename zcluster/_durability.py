"""The durability waits of a shard call.

Durability (:class:`zcluster.Durability`): every pipeline that carries writes ends with ``WAIT`` and/or
``WAITAOF`` on its own connection (they cover only the writes of the connection that sends them; a
pooled connection picked separately would wait for nothing). Whether a server has WAITAOF is read from
its reply ("unknown command" before Redis 7.2), every time: the command travels in the same round trip
as the writes, so this costs nothing, and a server upgraded in place is never misjudged from a cache.
A confirmation that falls short is asked for again on the same connection (holding it), until
``Durability.deadline``: after a failover the promoted replica has no replica of its own until the old
master rejoins as one, and a durable write waits for that instead of failing after one ``timeout``. Only
the waits are sent again, never the writes, so nothing is applied twice (increments included).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from zcluster._pipelines import Command, pipeline, read_replies, streamed
from zcluster._topology import Shard
from zcluster.errors import DurabilityError
from zcluster.types import Durability

log = logging.getLogger("zcluster")


class Waits:
    """The durability waits of one shard call: appended to each of its pipelines, judged per reply.

    With ``local_aof``: ``WAITAOF 1 0 <ms>`` (the master's own fsync); with ``replicas``: ``WAIT <n> <ms>``
    (replicas that received the writes). ``WAITAOF <n>`` is not used for replicas: it counts only replicas
    that fsynced to an AOF of their own, so replicas with ``appendonly no`` would never count (tested:
    Valkey answers ``[1, 0]`` where WAIT says 1), and the same Durability would mean something else
    before Redis 7.2. A shortfall the server did not refuse is asked again on the same connection until
    the deadline (counted from the call's first waits, across its resends); the last shortfall is kept
    and raised by :meth:`check` once the call is done, so every reply of the call is read first and each
    connection goes back to its pool clean.
    """

    def __init__(self, durability: Durability | None) -> None:
        self.durability = durability
        self.commands: list[Command] = []
        if durability is not None:
            ms = durability.timeout_ms
            if durability.local_aof:
                self.commands.append(("WAITAOF", 1, 0, ms))
            if durability.replicas:
                self.commands.append(("WAIT", durability.replicas, ms))
        self.until: float | None = None  # when asking again stops (set when the call first sends its waits)
        self.shortfall: DurabilityError | None = None
        self.on_replica = False  # a WAIT refused because the node is a replica (a failed-over master)
        self.asked_again = False  # logged once per call

    def begin(self) -> None:
        """Forget what an earlier attempt of the call (on a node since replaced) judged; keep the deadline."""
        self.shortfall = None
        self.on_replica = False

    def pipeline(self, node: Shard, commands: list[Command]) -> list[Any]:
        """:func:`pipeline` of ``commands`` (with waits: one raw round trip, the connection held while the
        waits are asked again); the commands' replies."""
        if not self.commands:
            return pipeline(node.client, commands)
        return self.streamed(node, [commands])

    def streamed(self, node: Shard, chunks: list[list[Command]]) -> list[Any]:
        """:func:`~zcluster._pipelines.streamed` with the waits sent after the last chunk on the same connection."""
        if not self.commands or not chunks:
            return streamed(node.client, chunks)
        asked = self.durability
        assert asked is not None
        if self.until is None:
            self.until = time.monotonic() + asked.waits_for
        n = len(self.commands)

        def settle(conn: Any, replies: list[Any]) -> None:
            if self.shortfall is not None:  # an earlier pipeline of the call fell short for good
                return
            self._judge(node.name, replies[-n:])
            while self._again():
                self._judge(node.name, self._ask(conn))

        replies = streamed(node.client, [*chunks[:-1], [*chunks[-1], *self.commands]], settle)
        return replies[:-n]

    def _again(self) -> bool:
        """Whether to ask again: a shortfall the server did not refuse (a refusal stays one), time left."""
        short = self.shortfall
        if short is None or short.reason or self.until is None:
            return False
        left = self.until - time.monotonic()
        if left <= 0:
            return False
        if not self.asked_again:
            self.asked_again = True
            log.warning(
                "%s: %s; asking again for up to %.1f s (Durability.deadline)", short.shard, short.shortfall, left
            )
        self.shortfall = None
        return True

    def _ask(self, conn: Any) -> list[Any]:
        """The waits again on ``conn`` (they cover its writes), none blocking past the deadline."""
        assert self.until is not None and self.durability is not None
        ms = max(1, min(self.durability.timeout_ms, round((self.until - time.monotonic()) * 1000)))
        commands = [(*c[:-1], ms) for c in self.commands]
        conn.send_packed_command(conn.pack_commands(commands))
        return read_replies(conn, len(commands), [])

    def _judge(self, name: str, replies: list[Any]) -> None:
        asked = self.durability
        if asked is None or self.shortfall is not None:
            return
        local: bool | None = None
        replicas: int | None = None
        reasons: list[str] = []
        for command, reply in zip(self.commands, replies, strict=True):
            if isinstance(reply, BaseException):
                text = str(reply).strip()
                self.on_replica |= "replica" in text.lower()
                if command[0] == "WAITAOF" and "unknown command" in text.lower():
                    reasons.append("the server has no WAITAOF (Redis < 7.2): its AOF fsync cannot be confirmed")
                else:
                    reasons.append(f"{command[0]} refused: {text}")
                if command[0] == "WAITAOF":
                    local = False
            elif command[0] == "WAITAOF":
                local = int(reply[0]) >= 1
            else:
                replicas = int(reply)
        if (asked.local_aof and not local) or (replicas or 0) < asked.replicas or reasons:
            self.shortfall = DurabilityError(name, asked, replicas, local, "; ".join(reasons))

    def check(self) -> None:
        """Raise the shortfall seen, if any."""
        if self.shortfall is not None:
            raise self.shortfall
