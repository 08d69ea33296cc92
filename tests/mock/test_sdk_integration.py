"""The SDK against the reference gateway: in-process and over a real loopback socket."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from imggw_client import (
    AsyncClient,
    AuthenticationError,
    Client,
    IdempotencyConflictError,
    InvalidRequestError,
    NotFoundError,
    PollPolicy,
    ResultExpiredError,
    RetryPolicy,
    TaskFailedError,
    TaskStatus,
)
from imggw_client.mock import IN_PROCESS_URL, MockGateway

from ..conftest import Driven
from .helpers import png_size

FAST = {
    "poll": PollPolicy(initial_interval=0.01, max_interval=0.05),
    "retry": RetryPolicy(max_attempts=6, initial_backoff=0.01, max_backoff=0.05),
}
QUICK = {"duration_min": 0.02, "duration_max": 0.1}


pytestmark = [
    pytest.mark.anyio,
    pytest.mark.gateway(api_keys=["test-key", "someone-else"], seed=5, **QUICK),
]


@pytest.fixture(params=["in-process", "loopback"])
def where(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def base(
    where: str, gateway: MockGateway, shared_serve: Callable[[MockGateway], str]
) -> tuple[str, Any]:
    """(base URL, http client factory) for the chosen adapter."""
    if where == "in-process":
        return IN_PROCESS_URL, gateway.transport()
    return shared_serve(gateway), None


Make = Callable[..., Driven]


@pytest.fixture
def make(kind: str, base: tuple[str, Any]) -> Make:
    """Builds a client of the current kind on the current adapter, in real time."""
    url, transport = base

    def build(**kw: Any) -> Driven:
        kw = {"api_key": "test-key", "base_url": url, **FAST, **kw}
        if kind == "sync":
            return Driven(
                Client(http_client=httpx.Client(transport=transport) if transport else None, **kw)
            )
        return Driven(
            AsyncClient(
                http_client=httpx.AsyncClient(transport=transport) if transport else None, **kw
            )
        )

    return build


@pytest.fixture
async def client(make: Make) -> AsyncIterator[Driven]:
    driven = make()
    yield driven
    await driven.close()


@pytest.mark.parametrize("surface", ["alpha", "beta"])
async def test_generate_and_download(
    client: Driven, surface: str, tmp_path: Path, gateway: MockGateway
) -> None:
    updates: list[TaskStatus] = []
    task = await client.generate(
        "a red fox",
        aspect_ratio="3:2",
        resolution="2k",
        surface=surface,
        on_update=lambda t: updates.append(t.status),
    )
    assert task.status is TaskStatus.SUCCEEDED
    assert task.surface == surface
    assert updates[-1] is TaskStatus.SUCCEEDED
    assert task.credits == 8.0
    files = await client.download(task, tmp_path)
    assert len(files) == 1
    content = files[0].path.read_bytes()
    assert files[0].sha256 == hashlib.sha256(content).hexdigest()
    assert png_size(content) == (64, 43)
    assert gateway.stats()["tasks_created"] == 1


async def test_errors_map_to_the_sdk_tree(client: Driven, make: Make, gateway: MockGateway) -> None:
    with pytest.raises(TaskFailedError) as failed:
        await client.generate("a cat #fail:nsfw_detected")
    assert failed.value.task.error.code == "nsfw_detected"
    sub = await client.submit("a cat", idempotency_key="same")
    with pytest.raises(IdempotencyConflictError):
        await client.submit("a dog", idempotency_key="same")
    again = await client.submit("a cat", idempotency_key="same")
    assert (again.task_id, again.replayed) == (sub.task_id, True)
    with pytest.raises(NotFoundError):
        await client.get("999999")
    with pytest.raises(InvalidRequestError) as invalid:
        await client.submit("a cat", aspect_ratio="7:5", validate=False)
    assert invalid.value.code == "invalid_aspect_ratio"
    stranger, impostor = make(api_key="someone-else"), make(api_key="wrong-key")
    with pytest.raises(NotFoundError):
        await stranger.get(sub.task_id)
    with pytest.raises(AuthenticationError):
        await impostor.submit("a cat")
    await stranger.close()
    await impostor.close()


@pytest.mark.parametrize(
    "quirks",
    [
        ["alpha_http200"],
        ["beta_no_code"],
        ["extra_states"],
        ["no_progress"],
        ["alpha_http200", "beta_no_code", "extra_states", "no_progress"],
    ],
)
@pytest.mark.parametrize("surface", ["alpha", "beta"])
async def test_the_sdk_copes_with_every_quirk(
    client: Driven, gateway: MockGateway, quirks: list[str], surface: str
) -> None:
    gateway.configure(quirks=quirks)
    task = await client.generate("a cat", surface=surface)
    assert task.status is TaskStatus.SUCCEEDED
    assert task.image_urls
    with pytest.raises(InvalidRequestError) as info:
        await client.submit(
            "a cat", aspect_ratio="auto", resolution="4k", surface=surface, validate=False
        )
    assert info.value.status_code == 422
    assert gateway.stats()["tasks_created"] == 1


async def test_expired_results_raise_result_expired(kind: str, tmp_path: Path) -> None:
    gateway = MockGateway(manual_clock=True, duration_min=1, duration_max=1, retention=60)
    inner = gateway.client(**FAST) if kind == "sync" else gateway.async_client(**FAST)
    client = Driven(inner)
    sub = await client.submit("a cat")
    gateway.advance(1)
    task = await client.get(sub.task_id)
    gateway.advance(61)
    with pytest.raises(ResultExpiredError):
        await client.download(task, tmp_path)
    await client.close()
    assert list(tmp_path.iterdir()) == []


async def test_the_prompt_never_reaches_an_error_message(client: Driven) -> None:
    secret = "my very private prompt words"
    with pytest.raises(InvalidRequestError) as info:
        await client.submit(secret, aspect_ratio="auto", resolution="4k", validate=False)
    assert "private" not in str(info.value)
