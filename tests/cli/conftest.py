"""Fixtures of the CLI tests: quick --mock tasks, and a reference gateway on a real socket."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from imggw_cli import _runtime
from imggw_client.mock import MockGateway

from .helpers import CANARY


@pytest.fixture(autouse=True)
def quick_mock(monkeypatch: pytest.MonkeyPatch) -> None:
    """--mock tasks of a few tens of ms, and no real sleeping between retries."""
    monkeypatch.setitem(_runtime.MOCK_SETTINGS, "duration_min", 0.02)
    monkeypatch.setitem(_runtime.MOCK_SETTINGS, "duration_max", 0.08)


@pytest.fixture
def gateway() -> Iterator[tuple[MockGateway, str]]:
    gw = MockGateway(api_keys=[CANARY], duration_min=0.02, duration_max=0.08)
    with gw.serve() as url:
        yield gw, url
