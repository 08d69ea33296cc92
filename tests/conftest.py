"""Shared fixtures: both clients behind one awaitable face, a fake clock, canned bodies."""

from __future__ import annotations

import inspect
import json
import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from imggw_client import AsyncClient, Client, PollPolicy, RetryPolicy

CANARY_KEY = "sk-canary-5e1f0c2b9a8d7e6f4a3b"
BASE_URL = "http://gateway.test"
CDN = "http://cdn.test"
# Signature, some bytes, and the IEND chunk a whole PNG ends with (downloads check for it).
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8 + b"\x00\x00\x00\x00IEND\xaeB`\x82"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeTime:
    """A monotonic clock that only moves when the client sleeps; records every sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.slept.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


class Driven:
    """Either client, every method awaitable; on fake time when given a FakeTime."""

    def __init__(self, inner: Client | AsyncClient, fake: FakeTime | None = None) -> None:
        self.inner = inner
        inner._flows.rng = random.Random(1234)
        if fake is not None:
            self.fake = fake
            inner._sleep = fake.sleep if isinstance(inner, Client) else fake.asleep  # type: ignore[assignment]
            inner._flows.clock = fake.clock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        return call


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


FAST_POLL = PollPolicy(initial_interval=1.0, max_interval=10.0, multiplier=1.5)


def make_client(kind: str, fake: FakeTime, **kwargs: Any) -> Driven:
    kwargs.setdefault("api_key", CANARY_KEY)
    kwargs.setdefault("base_url", BASE_URL)
    kwargs.setdefault("retry", RetryPolicy(max_attempts=4, initial_backoff=0.5, max_backoff=4.0))
    cls = Client if kind == "sync" else AsyncClient
    return Driven(cls(**kwargs), fake)


@pytest.fixture
async def client(kind: str, fake_time: FakeTime) -> AsyncIterator[Driven]:
    driven = make_client(kind, fake_time)
    yield driven
    await driven.close()


@pytest.fixture
def gw() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        yield router


# ---------------------------------------------------------------------------- bodies


def beta_submitted(task_id: str = "42") -> httpx.Response:
    return httpx.Response(
        200, json={"code": 200, "data": [{"status": "submitted", "task_id": task_id}]}
    )


def alpha_submitted(task_id: str = "42") -> httpx.Response:
    return httpx.Response(200, json={"code": 200, "msg": "success", "data": {"taskId": task_id}})


def beta_task(task_id: str = "42", status: str = "processing", **data: Any) -> httpx.Response:
    return httpx.Response(
        200, json={"code": 200, "data": {"id": task_id, "status": status, **data}}
    )


def beta_done(task_id: str = "42", urls: list[str] | None = None) -> httpx.Response:
    urls = urls if urls is not None else [f"{CDN}/r/{task_id}.png"]
    return beta_task(
        task_id,
        "completed",
        progress=100,
        result={"images": [{"url": urls}]},
        cost=0.04,
        credits_cost=4,
    )


def alpha_task(task_id: str = "42", state: str = "generating", **data: Any) -> httpx.Response:
    return httpx.Response(
        200,
        json={"code": 200, "msg": "success", "data": {"taskId": task_id, "state": state, **data}},
    )


def alpha_done(task_id: str = "42", urls: list[str] | None = None) -> httpx.Response:
    urls = urls if urls is not None else [f"{CDN}/r/{task_id}.png"]
    return alpha_task(
        task_id,
        "success",
        progress=100,
        resultJson=json.dumps({"resultUrls": urls}),
        creditsConsumed="4",
    )


def beta_error(status: int, code: str, message: str = "refused", **headers: str) -> httpx.Response:
    return httpx.Response(
        status,
        json={"code": status, "error": {"code": code, "message": message}},
        headers={name.replace("_", "-"): value for name, value in headers.items()},
    )


def alpha_error(code: int, msg: str = "refused", http_status: int = 200) -> httpx.Response:
    return httpx.Response(http_status, json={"code": code, "msg": msg, "data": None})


def body_of(request: httpx.Request) -> Any:
    return json.loads(request.content)


@pytest.fixture(autouse=True)
def private_state(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line keeps a journal in the XDG state folder by default: each test (and each
    process it starts) gets a state folder of its own, never the user's, and no IMGGW_JOURNAL
    from the environment it runs in."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.delenv("IMGGW_JOURNAL", raising=False)
