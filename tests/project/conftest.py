"""The gateway the documentation's code runs against (tests/gateways.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imggw_client.mock import MockGateway

# Settings of the environment the tests run in that a reader's shell would not have.
UNSET = ("IMGGW_JOURNAL", "IMGGW_SURFACE", "IMGGW_LOG", "IMGGW_LOG_FORMAT", "IMGGW_RATE_STORE")


@pytest.fixture
def env_gateway(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> MockGateway:
    """The gateway on 127.0.0.1, named by the environment as a user's would be (its first key,
    its URL); the code runs in an empty folder."""
    gateway, url = served_gateway
    monkeypatch.setenv("IMGGW_API_KEY", gateway.config.api_keys[0])
    monkeypatch.setenv("IMGGW_BASE_URL", url)
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return gateway
