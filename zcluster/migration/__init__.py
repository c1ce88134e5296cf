"""Online migration of a standalone store to another layout: more or fewer standalone shards, or a Redis
Cluster, while applications keep reading and writing it (see :mod:`zcluster.migration.mover` for the
protocol, the cut-over and what resuming does).

    from zcluster.migration import migrate
    report = migrate(["redis://a:6379", "redis://b:6379"],
                     ["redis://a:6379", "redis://b:6379", "redis://c:6379"])
    print(report.copied, report.pause)

The command line: ``zcluster migrate --from URL... --to URL...``.
"""

from typing import Any

from zcluster.config import Where
from zcluster.migration.mover import Migration
from zcluster.migration.report import MigrationReport, Progress


def migrate(source: Where, target: Where, **options: Any) -> MigrationReport:
    """Run (or resume) a :class:`Migration` from ``source`` to ``target`` to its end; ``options`` as for it."""
    with Migration(source, target, **options) as migration:
        return migration.run()


__all__ = ["Migration", "MigrationReport", "Progress", "migrate"]
