"""Where a farm is: a picklable value Spark ships to executors, like :class:`zcluster.ClusterConfig`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zcluster.config import ClusterConfig, Where, shared
from zcluster.errors import ConfigError
from zcluster.farm._quorum import parse_quorum
from zcluster.farm._repair import RepairStrategy, repair_strategy
from zcluster.farm._replicas import DEFAULT_STRAGGLER_WAIT, check_same_layout, check_straggler_wait, layout_of
from zcluster.farm.farm import Farm
from zcluster.farm.reads import ReadStrategy, read_strategy

__all__ = ["FarmConfig"]


@dataclass(frozen=True)
class FarmConfig:
    """The replicas (one :class:`ClusterConfig` each) and the farm's options (see :class:`Farm`, also for
    ``straggler_wait`` and the replicas' socket timeouts); hashable and picklable."""

    replicas: tuple[ClusterConfig, ...]
    write_quorum: str | int = "51%"
    read: ReadStrategy | str = "all"
    repair: RepairStrategy | str = "all"
    names: tuple[str, ...] | None = None
    straggler_wait: float = DEFAULT_STRAGGLER_WAIT

    def __post_init__(self) -> None:
        if not self.replicas or not all(isinstance(r, ClusterConfig) for r in self.replicas):
            raise ConfigError("a FarmConfig needs one ClusterConfig per replica (FarmConfig.of takes URLs)")
        parse_quorum(self.write_quorum, len(self.replicas))
        read_strategy(self.read)
        repair_strategy(self.repair)
        check_straggler_wait(self.straggler_wait)
        check_same_layout([layout_of(r.prefix, r.max_size, dict(r.options).get("floors")) for r in self.replicas])

    @classmethod
    def of(cls, replicas: Sequence[Where], *, write_quorum: str | int = "51%", **options: Any) -> FarmConfig:
        """One replica per element of ``replicas`` (any form :func:`zcluster.connect` takes: a URL, a list
        of shard URLs, ``redis+cluster://seed``); ``read``, ``repair``, ``names``, ``straggler_wait`` are
        the farm's options, the rest (``prefix``, ``max_size``, ...) go to every replica. Socket timeouts go
        in the URLs: ``redis://host:6379?socket_timeout=5&socket_connect_timeout=2``."""
        farm_options = {k: options.pop(k) for k in ("read", "repair", "straggler_wait") if k in options}
        names = options.pop("names", None)
        configs = tuple(ClusterConfig.of(r, **options) for r in replicas)
        return cls(configs, write_quorum, names=tuple(names) if names else None, **farm_options)

    def open(self) -> Farm:
        """A new Farm (and its clusters) for this config; the caller closes it."""
        clusters = [r.open() for r in self.replicas]
        return Farm(
            clusters,
            write_quorum=self.write_quorum,
            read=self.read,
            repair=self.repair,
            names=self.names,
            straggler_wait=self.straggler_wait,
        )

    def shared(self) -> Farm:
        """This process's one Farm for this config, opened on first use and never closed (as
        :meth:`ClusterConfig.shared`)."""
        return shared(self, self.open)

    def with_layout(self, **layout: Any) -> FarmConfig:
        """This config with ``prefix`` and/or ``max_size`` replaced on every replica."""
        return dataclasses.replace(self, replicas=tuple(r.with_layout(**layout) for r in self.replicas))
