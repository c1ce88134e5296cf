"""Redis URLs: parsing, clients, and keeping credentials out of every message.

Every error about a URL names it in its redacted form (:func:`redact_url`): the user-info part (whatever
stands between ``scheme://``, or the start of a URL whose scheme is missing or malformed, and the last
``@``, so a password holding an unescaped ``/``, ``#``, ``?`` or ``@`` is still covered) and a
``password``/``ssl_password`` query option with the rest of the URL after it (redis-py accepts both) are
replaced by ``***``. A piece of the URL is quoted on its own only where it stands in that redacted form.

:func:`client_from_url` refuses, as a :class:`ConfigError`, what redis-py would only trip over at the first
command (an unknown or ill-typed query option, a timeout that is not a positive number), and bounds the TLS
handshake of ``rediss://`` by the connect timeout (:class:`TlsConnection`).
"""

from __future__ import annotations

import re
import socket
import ssl
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs, unquote, unquote_plus, urlsplit

import redis
from redis.connection import Connection, SSLConnection

from zcluster.errors import ConfigError

SCHEMES = ("redis", "rediss", "unix")
#: Schemes that name a Redis Cluster seed node, and the plain scheme its client connects with.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: Query options a URL may carry: those redis-py reads from text. Others (``retry``, ``connection_class``,
#: ``retry_on_error``, ...) would reach redis-py as strings and break at the first command.
QUERY_OPTIONS = frozenset(
    {
        "db",
        "username",
        "password",
        "client_name",
        "lib_name",
        "lib_version",
        "protocol",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_read_size",
        "retry_on_timeout",
        "max_connections",
        "health_check_interval",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_ca_data",
        "ssl_password",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
        "ssl_include_verify_flags",
        "ssl_exclude_verify_flags",
    }
)
# The user-info: from after the first "://" (or from the start, when no "://" comes before an '@': a URL
# without or with an empty or malformed scheme) to the last '@'.
_AUTH = re.compile(r"^([^@]*?://)?(.*)@", re.DOTALL)
# A query option whose name ends in "password" (password=, ssl_password=) and everything after it: an
# unescaped '&' or '#' in the value would cut it short, so the rest of the URL is taken as secret too.
_QUERY_SECRET = re.compile(r"([?&;][^=&#?;]*password=)(.*)$", re.IGNORECASE | re.DOTALL)


def redact_url(url: str) -> str:
    """``url`` with its user-info and password query values replaced by ``***``.

    Both are found in the original text and their union is replaced, so that neither rule can hide a secret
    from the other (an '@' inside a query password, a ``?password=`` inside the user-info).
    """
    spans: list[tuple[int, int]] = []
    auth = _AUTH.match(url)
    if auth is not None:
        spans.append((auth.start(2), auth.end(2)))
    query = _QUERY_SECRET.search(url)
    if query is not None:
        spans.append((query.start(2), len(url)))
    out: list[tuple[int, int]] = []
    done = 0
    for start, end in sorted(spans):
        if start < done:  # overlapping: extend the previous cut
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
        done = out[-1][1]
    text, pos = "", 0
    for start, end in out:
        text += url[pos:start] + "***"
        pos = end
    return text + url[pos:]


def secrets_of(urls: Iterable[str]) -> list[str]:
    """The passwords (raw and percent-decoded) in ``urls``, also of URLs that do not parse."""
    out: list[str] = []
    for url in urls:
        m = _AUTH.match(url)
        if m is not None:
            _, sep, password = m.group(2).partition(":")
            if sep and password:
                out += [password, unquote(password)]
        for _, rest in _QUERY_SECRET.findall(url):
            for value in (rest, rest.partition("&")[0], rest.partition("#")[0]):
                out += [value, unquote(value), unquote_plus(value)]
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
        scheme = f"{parts.scheme!r} " if parts.scheme in redact_url(url).lower() else ""
        raise ConfigError(f"unsupported URL scheme {scheme}in {redact_url(url)!r} (use redis://, rediss:// or unix://)")
    if "@" in parts.fragment or ("@" in parts.path and parts.scheme != "unix"):  # user-info cut by a '/' or '#'
        raise ConfigError(
            f"invalid Redis URL {redact_url(url)!r}: does not parse: a password holding '/', '#', '?' or '@' "
            "must be percent-encoded"
        )
    db = parts.path.lstrip("/")
    if parts.scheme != "unix" and db and not db.isdigit():
        shown = f": not {db!r}" if db in redact_url(url) else ""
        raise ConfigError(f"invalid Redis URL {redact_url(url)!r}: the path must be a database number{shown}")
    return parts.scheme, host or "", port


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` has a ``redis+cluster://`` or ``rediss+cluster://`` scheme (any case)."""
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower() in CLUSTER_SCHEMES


def seed_url(url: str) -> str:
    """``url`` with a Redis Cluster scheme (:data:`CLUSTER_SCHEMES`) written as the plain ``redis://`` /
    ``rediss://`` a seed node's client takes; any other URL (or a non-str, left to fail later) unchanged."""
    if not isinstance(url, str) or not is_cluster_url(url):
        return url
    scheme, _, rest = url.partition("://")
    return f"{CLUSTER_SCHEMES[scheme.lower()]}://{rest}"


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


# OpenSSL reasons for "the peer does not speak TLS": what a plain server's first bytes look like to a client.
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNKNOWN_PROTOCOL"})


class TlsConnection(SSLConnection):
    """redis-py's TLS connection, with ``socket_connect_timeout`` bounding the TLS handshake too.

    redis-py runs the handshake under ``socket_timeout`` (30 s by default here): a ``rediss://`` URL aimed at
    a plain server, which waits for the end of an inline command that never comes, hung that long and then
    said only "Timeout connecting to server". Here TCP connect and handshake share one connect deadline, and
    a handshake that times out or meets a non-TLS reply raises :class:`redis.ConnectionError` naming
    ``host:port`` (never credentials) and the likely cause.
    """

    def _connect(self) -> socket.socket:
        start = time.monotonic()
        sock: socket.socket = Connection._connect(self)  # TCP under socket_connect_timeout
        budget = self.socket_connect_timeout
        try:
            if budget is not None:
                sock.settimeout(max(budget - (time.monotonic() - start), 0.001))
            try:
                tls: socket.socket = self._wrap_socket_with_ssl(sock)
            except TimeoutError:  # socket.timeout
                raise redis.ConnectionError(
                    f"TLS handshake with {self.host}:{self.port} did not complete within {budget} s "
                    "(socket_connect_timeout): is the server plain redis:// (not rediss://)?"
                ) from None
            except ssl.SSLError as exc:
                if exc.reason not in _NOT_TLS:
                    raise
                raise redis.ConnectionError(
                    f"TLS handshake with {self.host}:{self.port} failed ({exc.reason}): "
                    "is the server plain redis:// (not rediss://)?"
                ) from None
            tls.settimeout(self.socket_timeout)
            return tls
        except BaseException:
            sock.close()
            raise


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A binary-safe redis-py client for ``url`` (ACL user/password, ``rediss://`` TLS options in the query).

    ``socket_connect_timeout`` (default 5 s) bounds TCP connect and, for ``rediss://``, the TLS handshake.
    """
    name = safe_name(url)  # validates the URL first, with a redacted message
    unsupported = sorted(set(parse_qs(urlsplit(url).query, keep_blank_values=True)) - QUERY_OPTIONS)
    if unsupported:
        # quoted only when it stands in the URL's redacted form: after a password it may be a piece of it
        shown = unsupported[0] if f"&{unsupported[0]}" in redact_url(url).replace("?", "&") else None
        raise ConfigError(
            f"invalid Redis URL for {name}: unsupported query option "
            f"{repr(shown) if shown else '(not quoted: it follows a password)'} "
            f"(supported: {', '.join(sorted(QUERY_OPTIONS))})"
        )
    if url.startswith("rediss://"):
        options.setdefault("connection_class", TlsConnection)
    options.setdefault("decode_responses", False)
    options.setdefault("health_check_interval", 0)
    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("socket_timeout", 30.0)
    try:
        client = redis.Redis.from_url(url, **options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid Redis URL for {name}: {redact(str(exc), [url])}") from None
    _check_connection_options(client.connection_pool, name, url)
    return client


_UNEXPECTED = re.compile(r"unexpected keyword argument '([^']*)'")


def _check_connection_options(pool: redis.ConnectionPool, name: str, url: str) -> None:
    """Build (not connect) one connection of ``pool``, so that options it cannot take fail now, as a
    :class:`ConfigError`, and not as a TypeError or AttributeError at the first command."""
    try:
        conn = pool.connection_class(**pool.connection_kwargs)
    except (TypeError, ValueError, AttributeError, redis.RedisError) as exc:
        unknown = _UNEXPECTED.search(str(exc))
        reason = f"unknown option {unknown.group(1)!r}" if unknown else str(exc) or type(exc).__name__
        raise ConfigError(f"invalid Redis URL or connection option for {name}: {redact(reason, [url])}") from None
    tls_min = getattr(conn, "ssl_min_version", None)
    if tls_min is not None and tls_min not in {v.value for v in ssl.TLSVersion}:
        raise ConfigError(
            f"invalid Redis URL or connection option for {name}: ssl_min_version {tls_min!r} is not one of "
            f"Python's ssl.TLSVersion values ({', '.join(f'{v.value} = {v.name}' for v in ssl.TLSVersion)})"
        )
    for option in ("socket_timeout", "socket_connect_timeout"):
        value = getattr(conn, option, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
            raise ConfigError(
                f"invalid Redis URL or connection option for {name}: {option} must be a positive number "
                f"of seconds, got {redact(repr(value), [url])}"
            )
