"""The dispatcher: routes typed messages to handlers (Foreman-style commands and events).

Handlers subscribe to a command kind (exactly one handler), an event kind, or all events. For each
message the matching handlers run in subscription order with a :class:`Context`. Follow-up messages a
handler publishes through ``ctx.publish`` are collected and handed to the dispatcher's `publish`
function only after every handler succeeded, so a failed attempt publishes nothing. ``dispatch`` raises
the first handler error (the caller does not acknowledge the message: nack and retry, then dead-letter,
as :class:`zcluster.channels.workers.WorkerPool` does), UnknownKindError/UndecodableMessageError for bad
messages, and :class:`NoHandlerError` for a command nobody handles.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zcluster.channels.typed import Category, Kind, KindRegistry, TypedMessage, check
from zcluster.errors import NoHandlerError
from zcluster.message.envelope import Envelope

__all__ = ["Context", "Dispatcher", "Handler"]


@dataclass
class Context:
    """What a handler gets: the message body, its envelope, a logger, the attempt number (1 = first
    delivery in this process), and ``publish`` to queue follow-up messages (bodies of registered kinds)."""

    message: Any
    envelope: Envelope
    logger: logging.Logger
    attempt: int = 1
    followups: list[Any] = field(default_factory=list)

    @property
    def kind(self) -> Kind:
        msg: TypedMessage = self.envelope.message
        assert msg.kind is not None
        return msg.kind

    def publish(self, body: Any) -> None:
        """Queue `body` to be published once every handler of this message succeeded."""
        self.followups.append(body)


Handler = Callable[[Context], None]


class Dispatcher:
    """Routes envelopes of TypedMessages (read with ``decode=registry.decode``) to handlers.

    `publish` receives each follow-up body after a message's handlers all succeeded; without it,
    ``ctx.publish`` raises RuntimeError. Subscriptions are not safe to change while dispatching.
    """

    def __init__(
        self,
        registry: KindRegistry,
        *,
        publish: Callable[[Any], object] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.registry = registry
        self._publish = publish
        self._log = logger or logging.getLogger(__name__)
        self._subs: list[tuple[Kind | None, Handler]] = []  # None: every event

    def _kind(self, kind: Kind | type) -> Kind:
        return kind if isinstance(kind, Kind) else self.registry.kind_of(kind)

    def on_command(self, kind: Kind | type, handler: Handler) -> None:
        """Subscribe the one handler of a command kind. ValueError if it has one or is not a command."""
        k = self._kind(kind)
        if k.category is not Category.COMMAND:
            raise ValueError(f"{k} is an event, not a command")
        if any(s == k for s, _ in self._subs):
            raise ValueError(f"command {k} already has a handler")
        self._subs.append((k, handler))

    def on_event(self, kind: Kind | type, handler: Handler) -> None:
        """Subscribe `handler` to an event kind (any number of handlers, run in subscription order)."""
        k = self._kind(kind)
        if k.category is not Category.EVENT:
            raise ValueError(f"{k} is a command, not an event")
        self._subs.append((k, handler))

    def on_all_events(self, handler: Handler) -> None:
        """Subscribe `handler` to every event kind."""
        self._subs.append((None, handler))

    def handlers(self, kind: Kind) -> list[Handler]:
        """The handlers a message of `kind` runs, in order."""
        return [h for k, h in self._subs if k == kind or (k is None and kind.category is Category.EVENT)]

    def dispatch(self, env: Envelope, attempt: int = 1) -> int:
        """Run the handlers of `env`'s message, then publish its follow-ups; return how many handlers ran.

        A transaction's ACK runs nothing (returns 0); a record naming no kind raises UndecodableMessageError.
        Raises as the module docstring says; follow-ups are published only when no handler raised."""
        msg = check(env).message
        if not isinstance(msg, TypedMessage):
            raise TypeError(f"envelope at {env.journal!r}:{env.begin} holds {type(msg).__name__}, not a TypedMessage")
        if msg.kind is None:
            return 0
        handlers = self.handlers(msg.kind)
        if not handlers and msg.kind.category is Category.COMMAND:
            raise NoHandlerError(f"no handler for command {msg.kind} (journal {env.journal!r}, offset {env.begin})")
        ctx = Context(msg.body, env, self._log.getChild(str(msg.kind).replace("/", ".")), attempt)
        for h in handlers:
            h(ctx)
        if ctx.followups:
            if self._publish is None:
                raise RuntimeError(f"handler of {msg.kind} published follow-ups but the dispatcher has no publish")
            for body in ctx.followups:
                self._publish(body)
        return len(handlers)
