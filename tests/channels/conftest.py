from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from zcluster.journal import FileJournals, JournalStore, RedisJournals
from zcluster.testing import LocalShards


@pytest.fixture(params=["file", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[JournalStore]:
    """Either backend: file fragments in a temporary directory, or streams on the standalone server."""
    if request.param == "file":
        with FileJournals(tmp_path / "journals", fragment_bytes=512) as fj:
            yield fj
    else:
        shards: LocalShards = request.getfixturevalue("shards")
        with RedisJournals.from_url(shards.urls[0], prefix=prefix) as r:
            yield r
