"""Label selectors: which journals a mapping publishes to, e.g. ``topic=pageviews, source=mobile``.

Grammar (comma-separated terms, all of which must hold; whitespace around tokens is ignored):

* ``name=value`` / ``name!=value``: the label has / has not that value;
* ``name in (v1, v2)`` / ``name notin (v1, v2)``: the label has one of / none of the values;
* ``name`` / ``!name``: the label exists with any value / does not exist.

Names are ``[A-Za-z0-9][A-Za-z0-9._/-]*``; values are non-empty runs of characters other than
whitespace and ``,()!=``. The empty selector matches every journal. Terms on the same name combine
as Gazette's LabelSelector does: all include-terms of a name merge into one set of allowed values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from zcluster.message.errors import SelectorError

__all__ = ["LabelSelector", "SelectorError", "parse_selector"]


_NAME = r"[A-Za-z0-9][A-Za-z0-9._/-]*"
_VALUE = r"[^\s,()!=]+"
_TOKEN = re.compile(
    rf"""\s*(?:
        (?P<neg>!)\s*(?P<nname>{_NAME})
      | (?P<name>{_NAME})\s*(?:
            (?P<op>!=|=)\s*(?P<value>{_VALUE})
          | \s(?P<setop>in|notin)\s*\(\s*(?P<values>{_VALUE}(?:\s*,\s*{_VALUE})*)\s*\)
        )?
    )\s*(?P<end>,|$)""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class LabelSelector:
    """Include and exclude constraints over journal labels.

    `include` maps a name to its allowed values (an empty set: any value, the label must exist);
    `exclude` maps a name to its forbidden values (an empty set: the label must be absent).
    """

    include: Mapping[str, frozenset[str]] = field(default_factory=dict)
    exclude: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True if `labels` satisfies every include and exclude constraint."""
        for name, values in self.include.items():
            v = labels.get(name)
            if v is None or (values and v not in values):
                return False
        for name, values in self.exclude.items():
            v = labels.get(name)
            if v is not None and (not values or v in values):
                return False
        return True

    def __str__(self) -> str:
        terms: list[str] = []
        for name, values in sorted(self.include.items()):
            terms.append(name if not values else _set_term(name, "=", "in", values))
        for name, values in sorted(self.exclude.items()):
            terms.append("!" + name if not values else _set_term(name, "!=", "notin", values))
        return ", ".join(terms)


def _set_term(name: str, op: str, setop: str, values: frozenset[str]) -> str:
    if len(values) == 1:
        return f"{name}{op}{next(iter(values))}"
    return f"{name} {setop} ({', '.join(sorted(values))})"


def parse_selector(text: str) -> LabelSelector:
    """Parse the selector grammar above. Raises SelectorError naming the position of the first bad term."""
    include: dict[str, set[str]] = {}
    exclude: dict[str, set[str]] = {}
    exists: set[str] = set()
    absent: set[str] = set()
    pos = 0
    if text.strip():
        while True:
            m = _TOKEN.match(text, pos)
            if m is None:
                raise SelectorError(f"malformed label selector at position {pos}: {text[pos:]!r}")
            if m["nname"]:
                absent.add(m["nname"])
            elif m["op"] == "=":
                include.setdefault(m["name"], set()).add(m["value"])
            elif m["op"] == "!=":
                exclude.setdefault(m["name"], set()).add(m["value"])
            elif m["setop"]:
                vals = {v.strip() for v in m["values"].split(",")}
                (include if m["setop"] == "in" else exclude).setdefault(m["name"], set()).update(vals)
            else:
                exists.add(m["name"])
            pos = m.end()
            if m["end"] == "":
                break
            if pos == len(text) or not text[pos:].strip():
                raise SelectorError(f"malformed label selector: trailing comma at position {pos - 1}")
    for name in exists:
        include.setdefault(name, set())
    conflicting = absent & include.keys()
    if conflicting:
        raise SelectorError(f"label selector both requires and forbids {sorted(conflicting)}")
    for name in absent:
        if exclude.get(name):
            raise SelectorError(f"label selector forbids {name!r} and excludes some of its values")
        exclude[name] = set()
    return LabelSelector({k: frozenset(v) for k, v in include.items()}, {k: frozenset(v) for k, v in exclude.items()})
