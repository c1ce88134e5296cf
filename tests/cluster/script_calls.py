"""Calls of the 2P-set write script (``lua/write.lua``) made by hand, as the client makes them, and the content
of their keys read back: what the script's differential tests and the module's share."""

from __future__ import annotations

from typing import Any

import redis

SETS = ["a", "b", "c"]
MEMBERS = ["m1", "m2", "m3", "m4", "m5"]
SCORES = [0.0, 1.0, 2.0, 3.0, 2.5, -1.0, 1e17, 2.0**60]


def keys(ns: str, name: str) -> tuple[str, str, str]:
    """K+, K- and the floor of set ``name`` in namespace ``ns`` (one hash tag: one slot)."""
    return f"{{{ns}{name}}}+", f"{{{ns}{name}}}-", f"{{{ns}{name}}}f"


def arguments(
    ns: str,
    op: str,
    groups: list[Any],
    bound: int,
    floors: bool,
    inline: bool,
    singles: int | None = 1 << 30,
) -> tuple[list[str], list[str]]:
    """One script call's declared keys and ARGV as the client makes them (``zcluster._writes``): keys
    declared, or in ARGV; the first ``singles`` groups (at most those leading groups that hold one tuple;
    by default all of them, as the client sends) without their count (ARGV[4]). ``singles`` None: the
    oracle's format, with no ARGV[4] and every group's count."""
    stride = 3 if floors else 2
    declared: list[str] = []
    argv: list[str] = [op, str(bound), ("K" if floors else "k") if inline else ("1" if floors else "0")]
    if singles is not None:
        lead = next((i for i, (_, tuples) in enumerate(groups) if len(tuples) > 1), len(groups))
        singles = min(singles, lead)
        argv.append(str(singles))
    for i, (name, tuples) in enumerate(groups):
        ks = list(keys(ns, name))[:stride]
        if inline:
            argv += ks
        else:
            declared += ks
        if singles is None or i >= singles:
            argv.append(str(len(tuples)))
        for score, member in tuples:
            argv += [repr(score), member]
    return declared, argv


def call(r: redis.Redis, source: bytes, *args: Any) -> bytes:
    """One script call, ``args`` as :func:`arguments` takes them: ``source`` run by EVAL."""
    declared, argv = arguments(*args)
    reply = r.eval(source, len(declared), *declared, *argv)
    assert isinstance(reply, bytes)
    return reply


def verdicts(reply: bytes) -> bytes:
    """The verdicts and the kind of stop, without the error's text (it names the script and its line)."""
    cut = reply.find(b"|")
    return reply if cut < 0 else reply[: reply.find(b" ", cut)]


def held(r: redis.Redis, key: str) -> tuple[bytes, Any]:
    """A key's type and whole value (sorted sets with their scores), None for a key of no such type."""
    kind = r.type(key)
    if kind == b"zset":
        return kind, r.zrange(key, 0, -1, withscores=True)
    if kind == b"string":
        return kind, r.get(key)
    if kind == b"hash":
        return kind, r.hgetall(key)
    return kind, None


def content(r: redis.Redis, ns: str) -> dict[str, Any]:
    return {f"{name}{'+-f'[i]}": held(r, key) for name in SETS for i, key in enumerate(keys(ns, name))}
