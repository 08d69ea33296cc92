"""Pytest fixtures for testing your own code against the reference gateway.

Opt-in: installing ``imggw`` adds nothing to a test run. Load the plugin with
``pytest -p imggw_client.mock.pytest_plugin``, or in your root ``conftest.py``::

    pytest_plugins = ["imggw_client.mock.pytest_plugin"]

Override ``imggw_gateway_options`` to tune the gateway::

    @pytest.fixture
    def imggw_gateway_options():
        return {"fault_rate": 0.3, "duration_max": 0.2}

    def test_my_app(imggw_client):
        task = imggw_client.generate("a lighthouse")
        assert task.status == "succeeded"
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from .._async_client import AsyncClient
from .._client import Client
from .._core.config import PollPolicy, RetryPolicy
from ._gateway import MockGateway

# Fast enough for a test suite, slow enough to see tasks move through their states.
TEST_DEFAULTS: dict[str, Any] = {
    "duration_min": 0.05,
    "duration_max": 0.2,
    "latency": 0.05,
    "retry_after": 0,
}
FAST_POLL = PollPolicy(initial_interval=0.02, max_interval=0.1, multiplier=1.5)
FAST_RETRY = RetryPolicy(max_attempts=8, initial_backoff=0.01, max_backoff=0.1)


@pytest.fixture
def imggw_gateway_options() -> dict[str, Any]:
    """MockGateway keywords for the fixtures below; override it to change them."""
    return {}


@pytest.fixture
def imggw_gateway(imggw_gateway_options: dict[str, Any]) -> MockGateway:
    """A fresh in-process reference gateway (keys: ``test-key``), fast tasks, seed 0."""
    return MockGateway(**{**TEST_DEFAULTS, **imggw_gateway_options})


@pytest.fixture
def imggw_client(imggw_gateway: MockGateway) -> Iterator[Client]:
    """A :class:`Client` wired to ``imggw_gateway`` in-process, polling fast."""
    with imggw_gateway.client(poll=FAST_POLL, retry=FAST_RETRY) as client:
        yield client


@pytest.fixture
async def imggw_async_client(imggw_gateway: MockGateway) -> AsyncIterator[AsyncClient]:
    """An :class:`AsyncClient` wired to ``imggw_gateway`` in-process (needs an async test
    runner, such as anyio's pytest plugin)."""
    async with imggw_gateway.async_client(poll=FAST_POLL, retry=FAST_RETRY) as client:
        yield client


@pytest.fixture
def imggw_gateway_url(imggw_gateway: MockGateway) -> Iterator[str]:
    """``imggw_gateway`` served over a real socket on 127.0.0.1; the base URL."""
    with imggw_gateway.serve() as url:
        yield url
