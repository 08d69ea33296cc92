"""The API key never leaks; configuration from arguments and environment; client lifecycle."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import httpx
import pytest
import respx

from imggw_client import (
    AsyncClient,
    Client,
    ConfigurationError,
    ImggwError,
    PollPolicy,
    RetryPolicy,
    Task,
    TaskStatus,
)

from ..conftest import BASE_URL, CANARY_KEY, CDN, Driven, beta_error, beta_task

pytestmark = pytest.mark.anyio


async def test_the_key_never_appears_in_errors_reprs_or_debug_logs(
    client: Driven,
    respx_gateway: respx.MockRouter,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, httpx and httpcore included
    echo = f"key {CANARY_KEY} was refused"  # a gateway that (wrongly) echoes the key
    faults: list[object] = [
        beta_error(401, "unauthorized", echo),
        beta_error(400, "bad", echo),
        beta_error(429, "slow_down", echo, retry_after="99999"),
        httpx.ReadTimeout("timed out"),
        httpx.ConnectError("refused"),
        httpx.Response(200, content=b"garbage"),
        beta_task("42", "failed", error={"code": "x", "message": echo}),
    ]
    texts: list[str] = [
        repr(client.inner),
        str(client.inner._settings),
        repr(client.inner._settings),
    ]
    for fault in faults:

        def answer(request: httpx.Request, fault: object = fault) -> httpx.Response:
            if isinstance(fault, Exception):
                raise fault
            assert isinstance(fault, httpx.Response)
            return httpx.Response(fault.status_code, headers=fault.headers, content=fault.content)

        respx_gateway.post("/beta/v1/images/generations").mock(side_effect=answer)
        respx_gateway.get("/beta/v1/tasks/42").mock(side_effect=answer)
        for call in (lambda: client.submit("p"), lambda: client.wait("42", wait_timeout=0)):
            try:
                await call()
            except ImggwError as err:
                texts += [str(err), repr(err), "".join(traceback.format_exception(err))]
                task = getattr(err, "task", None)
                if task is not None:  # raw is verbatim by design, and kept out of the repr
                    texts += [repr(task), str(task), repr(task.error)]
            else:  # pragma: no cover - every fault must fail
                pytest.fail(f"{fault!r} did not fail")
    with respx.mock() as cdn:
        cdn.get(f"{CDN}/x.png").mock(return_value=httpx.Response(500))
        try:
            await client.download(
                Task(
                    id="1", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=[f"{CDN}/x.png"]
                ),
                tmp_path,
            )
        except ImggwError as err:
            texts += [str(err), repr(err)]
    texts += [record.getMessage() for record in caplog.records]
    assert any("42" in t for t in texts)  # the texts are real
    assert [t for t in texts if CANARY_KEY in t] == []


def test_configuration_comes_from_arguments_then_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("IMGGW_API_KEY", "env-key-123")
    monkeypatch.setenv("IMGGW_BASE_URL", "https://env.example/")
    with Client() as client:
        assert client.base_url == "https://env.example"
        assert client._settings.api_key == "env-key-123"
        assert client.surface == "beta"
    with Client(api_key="arg-key-123", base_url="http://arg.example", surface="alpha") as client:
        assert (client._settings.api_key, client.base_url, client.surface) == (
            "arg-key-123",
            "http://arg.example",
            "alpha",
        )


@pytest.mark.parametrize(
    ("kwargs", "env", "fragment"),
    [
        ({}, {"IMGGW_BASE_URL": BASE_URL}, "IMGGW_API_KEY"),
        ({"api_key": ""}, {"IMGGW_BASE_URL": BASE_URL}, "IMGGW_API_KEY"),
        ({"api_key": "k"}, {}, "IMGGW_BASE_URL"),
        ({"api_key": "k", "base_url": "gateway.test"}, {}, "http"),
        ({"api_key": "bad key", "base_url": BASE_URL}, {}, "whitespace"),
        ({"api_key": "bad\nkey", "base_url": BASE_URL}, {}, "whitespace"),
        ({"api_key": "k", "base_url": BASE_URL, "surface": "gamma"}, {}, "surface"),
        ({"api_key": "k", "base_url": BASE_URL, "timeout": 0}, {}, "timeout"),
        ({"api_key": "k", "base_url": BASE_URL, "max_retries": -1}, {}, "max_retries"),
        (
            {"api_key": "k", "base_url": BASE_URL, "retry": RetryPolicy(), "max_retries": 2},
            {},
            "not both",
        ),
        (
            {"api_key": "k", "base_url": BASE_URL, "http_client": httpx.AsyncClient()},
            {},
            "httpx.Client",
        ),
        (
            {"api_key": "k", "base_url": BASE_URL, "transport": httpx.AsyncHTTPTransport()},
            {},
            r"transport must be an httpx\.BaseTransport",
        ),
        (
            {
                "api_key": "k",
                "base_url": BASE_URL,
                "http_client": httpx.Client(),
                "transport": httpx.HTTPTransport(),
            },
            {},
            "either http_client= or transport=",
        ),
    ],
)
def test_configuration_errors(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, object], env: dict[str, str], fragment: str
) -> None:
    monkeypatch.delenv("IMGGW_API_KEY", raising=False)
    monkeypatch.delenv("IMGGW_BASE_URL", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=fragment) as info:
        Client(**kwargs)  # type: ignore[arg-type]
    assert "bad key" not in str(info.value)


def test_async_client_wants_an_async_http_client() -> None:
    with pytest.raises(ConfigurationError, match=r"httpx\.AsyncClient"):
        AsyncClient(api_key="k", base_url=BASE_URL, http_client=httpx.Client())  # type: ignore[arg-type]


def test_async_client_wants_an_async_transport() -> None:
    with pytest.raises(ConfigurationError, match=r"httpx\.AsyncBaseTransport"):
        AsyncClient(api_key="k", base_url=BASE_URL, transport=httpx.HTTPTransport())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="not both"):
        AsyncClient(
            api_key="k",
            base_url=BASE_URL,
            http_client=httpx.AsyncClient(),
            transport=httpx.AsyncHTTPTransport(),
        )


def test_max_retries_is_the_retry_policy_shortcut() -> None:
    with Client(api_key="k", base_url=BASE_URL, max_retries=2) as client:
        assert client.retry.max_attempts == 3
    policy = RetryPolicy(max_attempts=9)
    with Client(
        api_key="k", base_url=BASE_URL, retry=policy, poll=PollPolicy(max_interval=5)
    ) as client:
        assert client.retry is policy
        assert client.poll.max_interval == 5


async def test_redact_blanks_the_key_in_any_text(client: Driven) -> None:
    text = f"refused: Bearer {CANARY_KEY} (key {CANARY_KEY})"
    assert client.inner.redact(text) == "refused: Bearer [redacted] (key [redacted])"
    assert client.inner.redact("nothing secret") == "nothing secret"
    assert client.inner.with_options(timeout=3).redact(CANARY_KEY) == "[redacted]"


def test_a_callers_http_client_is_used_and_left_open() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"code": 200, "data": {"id": "5", "status": "pending"}})

    http = httpx.Client(transport=httpx.MockTransport(handler), headers={"X-Team": "art"})
    with Client(api_key=CANARY_KEY, base_url=BASE_URL, http_client=http) as client:
        assert client.get("5").status is TaskStatus.PENDING
    assert not http.is_closed
    assert seen[0].headers["x-team"] == "art"  # the caller's settings apply
    assert seen[0].headers["authorization"] == f"Bearer {CANARY_KEY}"
    assert "authorization" not in http.headers  # the key was not stored on their client
    http.close()


async def test_a_callers_async_http_client_is_used_and_left_open() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"code": 200, "data": {"id": "5", "status": "pending"}})

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    async with AsyncClient(api_key=CANARY_KEY, base_url=BASE_URL, http_client=http) as client:
        assert (await client.get("5")).status is TaskStatus.PENDING
    assert not http.is_closed
    await http.aclose()


async def test_owned_http_clients_are_closed() -> None:
    sync = Client(api_key="k", base_url=BASE_URL)
    with sync:
        pass
    assert sync._http.is_closed
    client = AsyncClient(api_key="k", base_url=BASE_URL)
    async with client:
        pass
    assert client._http.is_closed
