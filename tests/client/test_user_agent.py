"""The User-Agent: ours, after the caller's own when their httpx client names their app."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import imggw_client
from imggw_client import Client, PollPolicy

from ..gateways import QUICK

OURS = f"imggw-python/{imggw_client.__version__}"
FAST = PollPolicy(initial_interval=0.02, max_interval=0.05)


@pytest.mark.gateway(**QUICK)
def test_a_user_agent_the_caller_set_is_kept_and_ours_appended(
    gateway_url: str, tmp_path: Path
) -> None:
    seen: list[str] = []
    http = httpx.Client(
        headers={"User-Agent": "my-app/2.1"},
        event_hooks={"request": [lambda r: seen.append(r.headers["user-agent"])]},
    )
    with Client(api_key="test-key", base_url=gateway_url, http_client=http, poll=FAST) as client:
        task = client.generate("a lighthouse", wait_timeout=30)
        client.download(task, tmp_path)
    http.close()
    assert len(seen) >= 3  # submit, at least one query, the download
    assert set(seen) == {f"my-app/2.1 {OURS}"}


def test_without_a_caller_user_agent_ours_replaces_httpx_default(gateway_url: str) -> None:
    seen: list[str] = []
    http = httpx.Client(event_hooks={"request": [lambda r: seen.append(r.headers["user-agent"])]})
    with Client(api_key="test-key", base_url=gateway_url, http_client=http) as client:
        client.submit("a lighthouse")
    http.close()
    assert seen == [OURS]
