"""Three standalone redis-server processes shared by the farm tests that kill nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zcluster.testing import LocalShards


@pytest.fixture(scope="session")
def trio() -> Iterator[LocalShards]:
    """Three servers, one replica each; tests isolate themselves by ``prefix`` and must not kill them."""
    with LocalShards(3) as s:
        yield s
