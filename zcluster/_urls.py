"""Redis URLs: parsing, clients, and keeping credentials out of every message.

Every error about a URL names it in its redacted form (:func:`redact_url`): the user-info part (whatever
stands between ``scheme://`` and the last ``@`` of the address, so a password holding an unescaped ``/``,
``#``, ``?`` or ``@`` is still covered) is replaced by ``***``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote, urlsplit

import redis

from zcluster.errors import ConfigError

SCHEMES = ("redis", "rediss", "unix")
_AUTH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)(.*)@", re.DOTALL)


def redact_url(url: str) -> str:
    """``url`` with its user-info replaced by ``***``; a URL without ``@`` is returned as it is."""
    return _AUTH.sub(r"\1***@", url, count=1)


def secrets_of(urls: Iterable[str]) -> list[str]:
    """The passwords (raw and percent-decoded) in ``urls``, also of URLs that do not parse."""
    out: list[str] = []
    for url in urls:
        m = _AUTH.match(url)
        if m is None:
            continue
        _, sep, password = m.group(2).partition(":")
        if sep and password:
            out += [password, unquote(password)]
    return [s for s in out if s]


def redact(text: str, urls: Iterable[str]) -> str:
    """``text`` with every password of ``urls`` replaced by ``***`` (for messages that quote a server)."""
    for secret in sorted(set(secrets_of(urls)), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _split(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``; any parse failure is a :class:`ConfigError` naming it redacted."""
    if not isinstance(url, str):
        raise ConfigError(f"a Redis URL must be a str, not {type(url).__name__}")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        # urllib's message may quote a piece of a password that an unescaped '/', '#' or '?' cut off
        reason = "does not parse" if "@" in url else str(exc)
        hint = (
            ": check the port (0-65535) and the host; a password holding '/', '#', '?' or '@' must be percent-encoded"
            if "@" in url
            else ""
        )
        raise ConfigError(f"invalid Redis URL {redact_url(url)!r}: {reason}{hint}") from None
    if parts.scheme not in SCHEMES:
        raise ConfigError(
            f"unsupported URL scheme {parts.scheme!r} in {redact_url(url)!r} (use redis://, rediss:// or unix://)"
        )
    db = parts.path.lstrip("/")
    if parts.scheme != "unix" and db and not db.isdigit():
        raise ConfigError(f"invalid Redis URL {redact_url(url)!r}: the path must be a database number, not {db!r}")
    return parts.scheme, host or "", port


def safe_name(url: str) -> str:
    """``host:port`` of a Redis URL (the socket path for ``unix://``): never user, password or query."""
    scheme, host, port = _split(url)
    if scheme == "unix":
        return urlsplit(url).path
    return f"{host or 'localhost'}:{port or 6379}"


def with_host(url: str, host: str, port: int) -> str:
    """``url`` pointing at ``host:port`` instead, keeping its scheme, credentials and query."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@{host}:{port}" if auth else f"{host}:{port}"
    return parts._replace(netloc=netloc, path="").geturl()


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A binary-safe redis-py client for ``url`` (ACL user/password, ``rediss://`` TLS options in the query)."""
    name = safe_name(url)  # validates the URL first, with a redacted message
    options.setdefault("decode_responses", False)
    options.setdefault("health_check_interval", 0)
    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("socket_timeout", 30.0)
    try:
        return redis.Redis.from_url(url, **options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid Redis URL for {name}: {redact(str(exc), [url])}") from None
