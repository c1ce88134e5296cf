"""Fixtures shared by the chain tests (``test_chains.py``, ``test_chain_operators.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_chains import Env, chain_journals

from zcluster.testing import LocalShards


@pytest.fixture(params=["file", "stream"])
def env(request: pytest.FixtureRequest, tmp_path: Path, shards: LocalShards) -> Iterator[Env]:
    """A two-stage chain's environment, on file journals and on Redis Streams journals."""
    url, store = chain_journals(request.param, tmp_path, shards)
    e = Env(url, store, shards)
    yield e
    e.cluster.close()
    store.close()
