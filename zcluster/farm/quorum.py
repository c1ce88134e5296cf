"""Write quorums: how many replicas must confirm a write, from roshi's percentage strings."""

from __future__ import annotations

from fractions import Fraction

from zcluster.errors import ConfigError


def parse_quorum(quorum: str | int, replicas: int) -> int:
    """The number of replicas out of ``replicas`` that ``quorum`` asks for.

    A string is a percentage of the replicas, rounded up: ``"51%"`` of 3 is 2, ``"34%"`` of 3 is 2,
    ``"32%"`` of 3 is 1, ``"50%"`` of 5 is 3, ``"100%"`` is all of them. An int is a count. Anything
    that asks for no replica or more than there are (``"0%"``, ``"110%"``, ``0``, ``4`` of 3), or does not
    parse (``"abc"``, ``"-1%"``), is a :class:`ConfigError`.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas <= 0:
        raise ConfigError(f"a farm needs at least one replica, got {replicas!r}")
    if isinstance(quorum, int) and not isinstance(quorum, bool):
        count = quorum
    elif isinstance(quorum, str) and quorum.strip().endswith("%"):
        text = quorum.strip()[:-1].strip()
        try:
            percent = Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise ConfigError(f"write quorum {quorum!r} is not a percentage like '51%'") from None
        if not text or text[0] in "+-" or percent <= 0 or percent > 100:
            raise ConfigError(f"write quorum {quorum!r} must be a percentage in (0%, 100%]")
        product = percent * replicas / 100
        count = product.numerator // product.denominator + (product.denominator != 1)
    else:
        raise ConfigError(f"write quorum {quorum!r} must be a percentage like '51%' or a replica count")
    if not 1 <= count <= replicas:
        raise ConfigError(f"write quorum {quorum!r} asks for {count} of {replicas} replica(s)")
    return count
