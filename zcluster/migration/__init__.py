"""Online migration of a standalone store to another layout: more or fewer standalone shards, or a Redis
Cluster, while applications keep reading and writing it (see :mod:`zcluster.migration.mover` for the
protocol, the cut-over and what resuming does).

    from zcluster.migration import migrate
    report = migrate(["redis://a:6379", "redis://b:6379"],
                     ["redis://a:6379", "redis://b:6379", "redis://c:6379"])
    print(report.copied, report.pause)

The command line: ``zcluster migrate --from URL... --to URL...``.
"""

from zcluster.migration.mover import Migration, migrate
from zcluster.migration.report import MigrationReport, Progress

__all__ = ["Migration", "MigrationReport", "Progress", "migrate"]
