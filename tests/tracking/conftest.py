"""The gateway most journal tests run against (tests/gateways.py): quick tasks."""

from __future__ import annotations

from typing import Any

import pytest

from ..journals import KEY


@pytest.fixture
def gateway_options() -> dict[str, Any]:
    return {"api_keys": [KEY], "duration_min": 0.05, "duration_max": 0.2}
