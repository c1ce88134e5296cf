"""The mover's checks of its input and of its neighbours, all before anything moves (the markers' own checks are
:mod:`zcluster.migration._marking`'s, which calls these):

* the parameters of a :class:`zcluster.migration.Migration` (at construction, before any connection);
* the other stores on the source servers: the state and dedup namespaces carry no store's name, so two stores
  on the same servers share them, and moving them with one store would take the other's checkpoints away
  from where it reads them (its consumers would deliver again); a namespace that is, or nests in, another
  store's prefix would move that store's keys without its marker (and the clean-up would delete them);
* whether a client following the store can work on every target server: followers reconnect with their own
  credentials, query options and TLS (:func:`zcluster._moves.with_credentials`), not with the mover's target
  URLs, so a target server that refuses them would fail every long-lived client after the cut-over.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import redis
from redis.crc import key_slot
from redis.exceptions import AuthenticationError, AuthorizationError

from zcluster._encode import positive
from zcluster._keys import ADD, FLOOR, REMOVE
from zcluster._markers import MARKER
from zcluster._moves import with_credentials
from zcluster._topology import ClusterTopology, Shard, Topology
from zcluster._urls import client_from_url, redact, redact_url, with_host
from zcluster.errors import ConfigError, LayoutMismatchError


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def checked_namespaces(namespaces: object) -> list[str] | None:
    """``namespaces`` as a list (None stays None: the defaults); :class:`ConfigError` naming the parameter and
    the value unless it is a sequence of non-empty str. A str is refused, not taken as its characters (each a
    one-character namespace, whose clean-up would delete other applications' keys)."""
    if namespaces is None:
        return None
    if isinstance(namespaces, str | bytes | bytearray) or not isinstance(namespaces, Sequence):
        raise ConfigError(
            f"namespaces must be a list of key prefixes (non-empty str), e.g. ['zcstate:'], not {_shown(namespaces)}"
        )
    for ns in namespaces:
        if not isinstance(ns, str) or not ns:
            raise ConfigError(
                f"namespaces must hold key prefixes (non-empty str): {_shown(ns)} in {_shown(namespaces)} is not one"
            )
    return list(namespaces)


def check_parameters(*, rate: object, batch: object, cutover_keys: object, retry_for: object, lease: object) -> None:
    """:class:`ConfigError` naming the parameter and its value for a bad one (see :class:`Migration`)."""
    positive(batch, "batch")  # the library's one rule for sizes
    if not _number(cutover_keys) or not isinstance(cutover_keys, int) or cutover_keys < 0:
        raise ConfigError(f"cutover_keys must be an int, 0 or more, got {_shown(cutover_keys)}")
    if rate is not None and (not _number(rate) or not math.isfinite(rate) or rate <= 0):
        raise ConfigError(
            f"rate must be a positive number of keys scanned a second (None: no limit), got {_shown(rate)}"
        )
    if not _number(retry_for) or not math.isfinite(retry_for) or retry_for < 0:
        raise ConfigError(f"retry_for must be a finite number of seconds, 0 or more, got {_shown(retry_for)}")
    if not _number(lease) or not math.isfinite(lease) or lease <= 0:
        raise ConfigError(f"lease must be a positive, finite number of seconds, got {_shown(lease)}")


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


# -- other stores on the source servers --------------------------------------------------------------------


def other_stores(shards: Sequence[Shard], call: Callable[..., Any], key: bytes, batch: int) -> dict[str, list[str]]:
    """The prefixes of the other stores whose layout marker (``{<prefix>}layout``, holding a marker) a source
    server holds, each with those servers' names. A SCAN that matches on the server: only markers come back."""
    found: dict[str, list[str]] = {}
    for shard in shards:
        cursor = 0
        while True:
            cursor, keys = call(shard, "SCAN", cursor, "MATCH", b"{*" + MARKER, "COUNT", batch)
            cursor = int(cursor)
            for k in map(bytes, keys):
                prefix = k[1 : -len(MARKER)]
                if k != key and b"{" not in prefix and b"}" not in prefix and _is_marker(call(shard, "GET", k)):
                    found.setdefault(prefix.decode("utf-8", "replace"), []).append(shard.name)
            if cursor == 0:
                break
    return found


def _is_marker(raw: Any) -> bool:
    try:
        fields = json.loads(raw) if raw is not None else None
    except ValueError:
        return False
    return isinstance(fields, dict) and isinstance(fields.get("id"), str)


def theirs(key: bytes, stores: dict[str, list[str]]) -> bool:
    """Whether ``key`` lies in the namespace of one of the other ``stores``."""
    return any(key.startswith(b"{" + p.encode()) for p in stores)


def check_overlaps(stores: dict[str, list[str]], prefix: str, namespaces: Sequence[str]) -> None:
    """Refuse a namespace to move that is another store's prefix, or nests in it, or holds it: its keys are that
    store's too (moved without its marker, then deleted by the clean-up where that store reads them)."""
    for ns in namespaces:
        for other, servers in sorted(stores.items()):
            if not (other.startswith(ns) or ns.startswith(other)):
                continue
            what = "the store's own prefix" if ns == prefix else "a namespace to move"
            raise LayoutMismatchError(
                f"{what} {ns!r} {'is' if ns == other else 'overlaps'} the prefix of another store, {other!r} (its "
                f"layout marker is on {', '.join(servers)}): moving it would move that store's keys without their "
                "marker, and the clean-up would delete them where it reads them; nothing was moved. "
                + (
                    "Two stores whose prefixes nest share keys: neither can be migrated online"
                    if ns == prefix
                    else f"Leave {ns!r} out of the namespaces (name this store's part of it more precisely); if no "
                    f"store uses the prefix {other!r}, its marker is a leftover to inspect and delete"
                )
            )


def check_shared_state(
    stores: dict[str, list[str]], strays: Sequence[bytes], prefix: str, namespaces: Sequence[str], own: bool
) -> None:
    """Refuse to move namespaces besides the store's prefix (its checkpoints, dedup entries) from servers that
    also hold another store (``stores``: marked ones; ``strays``: keys of no namespace the operator keeps in
    place, a store among them if laid out as a store's), unless the operator says they are this store's only
    (``own``). The state namespaces do not say which store a key is of."""
    shared = [ns for ns in namespaces if ns != prefix]
    laid_out = [k for k in strays if k.endswith((ADD, REMOVE, FLOOR))]
    if own or not shared or not (stores or laid_out):
        return
    who = [f"store {p!r} (its layout marker on {', '.join(servers)})" for p, servers in sorted(stores.items())]
    if laid_out:
        who.append(f"{len(laid_out)} key(s) laid out as a zcluster store's, of no marked store (e.g. {laid_out[0]!r})")
    raise LayoutMismatchError(
        f"the source servers also hold {'; '.join(who)}. Another store's checkpoints and dedup entries may be in the "
        f"namespaces {shared} this migration would move besides the store's prefix (a state key does not say "
        "which store it is of): moved, they would be gone from where that store reads them, and its consumers "
        "would deliver again. Nothing was moved. If those namespaces hold this store's keys only, say so: "
        "own_namespaces=True (--own-namespaces). If they are shared, name this store's part of them (its "
        "applications' checkpoints: --namespace zcstate:<app>/, repeatable, with --keep-others and "
        f"--own-namespaces); or move the prefix alone (--namespace {prefix} --keep-others), if this store keeps "
        "no state there: state left behind is not found after the cut-over, and its consumers deliver again "
        "(see the README's 'Growing the store')"
    )


# -- followers on the target -------------------------------------------------------------------------------


def follower_targets(dst: Topology, urls: Sequence[str], source_url: str, key: bytes) -> list[tuple[Shard, str, bool]]:
    """For each target server (``dst``'s masters; ``urls``: the target's public URLs, as the markers name them):
    its shard, the URL a client following the store connects to it with (the user-info and query of its own
    first URL, ``source_url``, on the public URL: :func:`zcluster._moves.with_credentials`; a Redis Cluster's
    nodes with the seed's), and whether the marker's ``key`` is served there."""
    if isinstance(dst, ClusterTopology):
        seed = with_credentials(urls[0], source_url)
        holder = dst.shards[dst.shard_of(key, key_slot(key))]
        out = []
        for shard in dst.masters():
            host, _, port = shard.name.rpartition(":")
            out.append((shard, with_host(seed, host, int(port)), shard is holder))
        return out
    return [(s, with_credentials(u, source_url), True) for s, u in zip(dst.masters(), urls, strict=True)]


_PROBE = "return 1"  # a script naming the marker key: checks EVAL and the key's ACL, changes nothing


def check_followers(
    targets: Sequence[tuple[Shard, str, bool]],
    source_url: str,
    key: bytes,
    connection: dict[str, Any],
    reachable: Callable[[Shard], Any],
) -> None:
    """Refuse (:class:`ConfigError` naming the target server, never a password) a target server that a client
    following the store could not work on. ``targets``: each target server's shard (the mover's client), the
    URL a follower connects to it with (the target's public URL with the user-info and query of the source's
    first URL, ``source_url``, as :func:`zcluster._moves.with_credentials` builds it) and whether the marker's
    key is served there. The follower's connection must authenticate, reach the database the mover writes to,
    and run a script on the marker's key. ``reachable(shard)`` waits while the server cannot be reached (the
    mover's own client): a follower's connection that fails while the mover's works is refused."""
    for shard, url, keyed in targets:
        follower = client_from_url(url, **connection)
        try:
            mover_db = shard.client.connection_pool.connection_kwargs.get("db", 0) or 0
            follower_db = follower.connection_pool.connection_kwargs.get("db", 0) or 0
            if int(mover_db) != int(follower_db):
                raise ConfigError(
                    f"target {shard.name}: the mover writes database {mover_db} there, but a client following "
                    f"the store would use database {follower_db} (the target URL's path, or the query of the "
                    f"source URL {redact_url(source_url)}, which followers keep): give the target's database as "
                    "the URL's path (redis://host:port/N), as the source's; nothing was moved"
                )
            try:
                _probe(follower, key, keyed, shard, reachable)
            except redis.RedisError as exc:
                raise ConfigError(
                    f"target {shard.name} refuses a client following the store there ({type(exc).__name__}: "
                    f"{redact(str(exc), [url, source_url])}): after the cut-over every long-lived client would fail "
                    f"on it. Followers connect with the user, password, query options and TLS settings of the "
                    f"source URL {redact_url(source_url)}, not the target URL's: give the target server the "
                    "source's credentials and permissions (and TLS, as the target URL's scheme says), then run "
                    "again; nothing was moved"
                ) from None
        finally:
            follower.close()


def _probe(client: redis.Redis, key: bytes, keyed: bool, shard: Shard, reachable: Callable[[Shard], Any]) -> None:
    for attempt in (1, 2):
        try:
            client.execute_command("PING")
            if keyed:
                client.execute_command("EVAL", _PROBE, 1, key)
            return
        except (AuthenticationError, AuthorizationError):
            raise
        except (redis.ConnectionError, redis.TimeoutError):
            if attempt == 2:
                raise
            reachable(shard)  # the server is up (waited for): a second failure is the follower's own
