"""The gateway most journal tests run against: quick tasks, on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from imggw_client.mock import MockGateway

from ..journals import KEY


@pytest.fixture
def gateway() -> Iterator[tuple[MockGateway, str]]:
    gw = MockGateway(api_keys=[KEY], duration_min=0.05, duration_max=0.2)
    with gw.serve() as url:
        yield gw, url
