from __future__ import annotations

import pytest
from message_helpers import Gen, make_generator


@pytest.fixture
def generate() -> Gen:
    return make_generator()
