"""A local SparkSession shared by the Spark tests of one module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from zcluster.spark import local_session

    session = local_session("local[2,4]")  # 4: task retries allowed, as on a real cluster
    yield session
    session.stop()
