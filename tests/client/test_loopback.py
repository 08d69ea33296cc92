"""The SDK over a real loopback socket: a small stateful gateway served by uvicorn, and a raw
TCP server that drops connections. The full reference gateway has its own integration tests."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from imggw_client import (
    APITimeoutError,
    AsyncClient,
    Client,
    PollPolicy,
    RetryPolicy,
    TaskStatus,
    UnknownOutcomeError,
)

from ..conftest import CANARY_KEY, PNG
from ..loopback import asgi_body, drip, dropping_server, http_json, raw_server, serve_asgi

pytestmark = pytest.mark.anyio

FAST = {
    "retry": RetryPolicy(max_attempts=5, initial_backoff=0.01, max_backoff=0.05),
    "poll": PollPolicy(initial_interval=0.01, max_interval=0.05),
}


class TinyGateway:
    """Just enough gateway: idempotent submits (the first answer for each key is lost after the
    task is created, by answering only once the client has left), tasks that finish on the
    third query, PNG results."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.by_key: dict[str, str] = {}
        self.auth: set[str] = set()
        self.result_auth: list[str | None] = []
        self.lost = 0  # submits whose answer the client never read

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = await asgi_body(receive)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        status, payload, content_type = await self.route(scope, headers, body, receive)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", content_type.encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def route(
        self, scope: dict[str, Any], headers: dict[str, str], body: bytes, receive: Any
    ) -> tuple[int, bytes, str]:
        path, query = scope["path"], scope["query_string"].decode()
        if path.startswith("/files/"):
            self.result_auth.append(headers.get("authorization"))
            return 200, PNG, "image/png"
        self.auth.add(headers.get("authorization", ""))
        if scope["method"] == "POST":
            key = headers["idempotency-key"]
            first = key not in self.by_key
            if first:
                self.by_key[key] = str(len(self.tasks) + 1)
                self.tasks[self.by_key[key]] = {"queries": 0, "body": json.loads(body)}
                # The answer is lost: it is sent only once the client has given up on it and
                # closed the connection (sent then, it goes nowhere).
                message = await asyncio.wait_for(receive(), timeout=10)
                assert message["type"] == "http.disconnect"
                self.lost += 1
            task_id = self.by_key[key]
            if path.startswith("/alpha"):
                return (
                    200,
                    json.dumps({"code": 200, "msg": "ok", "data": {"taskId": task_id}}).encode(),
                    "application/json",
                )
            return (
                200,
                json.dumps(
                    {"code": 200, "data": [{"status": "submitted", "task_id": task_id}]}
                ).encode(),
                "application/json",
            )
        task_id = query.split("=")[1] if path.startswith("/alpha") else path.rsplit("/", 1)[1]
        task = self.tasks[task_id]
        task["queries"] += 1
        done = task["queries"] >= 3
        url = f"http://{headers['host']}/files/{task_id}.png"
        if path.startswith("/alpha"):
            data = {
                "taskId": task_id,
                "state": "success" if done else "generating",
                "resultJson": json.dumps({"resultUrls": [url]}) if done else "",
            }
            return (
                200,
                json.dumps({"code": 200, "msg": "ok", "data": data}).encode(),
                "application/json",
            )
        data = {
            "id": task_id,
            "status": "completed" if done else "processing",
            "result": {"images": [{"url": [url]}]} if done else None,
        }
        return 200, json.dumps({"code": 200, "data": data}).encode(), "application/json"


@pytest.fixture
def tiny() -> Iterator[tuple[TinyGateway, str]]:
    app = TinyGateway()
    with serve_asgi(app) as url:
        yield app, url


@pytest.mark.parametrize("surface", ["alpha", "beta"])
@pytest.mark.slow
async def test_generate_and_download_over_loopback_with_a_lost_response(
    kind: str, surface: str, tiny: tuple[TinyGateway, str], tmp_path: Path
) -> None:
    app, url = tiny
    kwargs: dict[str, Any] = {
        "api_key": CANARY_KEY,
        "base_url": url,
        "surface": surface,
        "timeout": 0.2,
        **FAST,
    }
    if kind == "sync":
        with Client(**kwargs) as client:
            task = client.generate("a cat", aspect_ratio="16:9")
            files = client.download(task, tmp_path)
    else:
        async with AsyncClient(**kwargs) as aclient:
            task = await aclient.generate("a cat", aspect_ratio="16:9")
            files = await aclient.download(task, tmp_path)
    assert task.status is TaskStatus.SUCCEEDED
    assert app.lost == 1
    assert len(app.tasks) == 1  # the lost response did not create a second task
    assert files[0].path.read_bytes() == PNG
    assert files[0].sha256 == hashlib.sha256(PNG).hexdigest()
    assert app.auth == {f"Bearer {CANARY_KEY}"}
    assert app.result_auth == [None]


def test_connection_dropped_after_the_request_is_retried_with_the_same_key() -> None:
    ok = json.dumps({"code": 200, "data": [{"status": "submitted", "task_id": "9"}]}).encode()
    with (
        dropping_server(lambda n: None if n < 3 else http_json(200, ok)) as url,
        Client(api_key=CANARY_KEY, base_url=url, **FAST) as client,
    ):
        assert client.submit("a cat").task_id == "9"


def test_a_gateway_that_always_drops_gives_unknown_outcome_with_the_key() -> None:
    with (
        dropping_server(lambda n: None) as url,
        Client(api_key=CANARY_KEY, base_url=url, **FAST) as client,
        pytest.raises(UnknownOutcomeError) as info,
    ):
        client.submit("a cat")
    assert len(info.value.idempotency_key) == 32


async def test_nothing_listening_is_a_connection_error() -> None:
    import socket

    from imggw_client import APIConnectionError

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with AsyncClient(
        api_key=CANARY_KEY, base_url=f"http://127.0.0.1:{port}", **FAST
    ) as client:
        with pytest.raises(APIConnectionError) as info:
            await client.submit("a cat")
    assert info.value.request_sent is False


@pytest.mark.slow
def test_an_http_client_made_like_the_clients_own_keeps_its_whole_request_deadline() -> None:
    # A caller who needs their own httpx.Client (a User-Agent, here) keeps what the SDK's own
    # has: a reply that drips its headers a byte at a time still ends within the timeout.
    stop, whole = threading.Event(), threading.Event()
    # Padded with JSON's whitespace: the drip takes about a minute, far past the 1 s deadline.
    running = json.dumps({"code": 200, "data": {"id": "1", "status": "processing"}}).encode()
    running += b" " * 100
    agents: list[bytes] = []

    def answer(conn: socket.socket, n: int, head: bytes) -> None:
        agents.append(
            next(line for line in head.split(b"\r\n") if line.lower().startswith(b"user-agent"))
        )
        if drip(conn, http_json(200, running), 0.3, stop):
            whole.set()

    with raw_server(answer) as url:
        http = Client.make_http_client(headers={"User-Agent": "my-app/2.1"})
        client = Client(
            api_key=CANARY_KEY,
            base_url=url,
            timeout=1,
            http_client=http,
            retry=RetryPolicy(max_attempts=1),
        )
        with client, pytest.raises(APITimeoutError):
            client.get("1")
        gave_up_first = not whole.is_set()
        stop.set()
    assert gave_up_first  # its 1 s, however slowly the headers come (each within the read timeout)
    assert not http.is_closed  # the caller's, to close
    http.close()
    assert agents[0].startswith(b"User-Agent: my-app/2.1 imggw-python/")


async def test_an_async_http_client_made_like_the_clients_own() -> None:
    http = AsyncClient.make_http_client(headers={"User-Agent": "my-app/2.1"})
    assert isinstance(http, httpx.AsyncClient)
    async with (
        http,
        AsyncClient(api_key=CANARY_KEY, base_url="http://127.0.0.1:9", http_client=http) as client,
    ):
        assert not client.is_closed
    assert http.is_closed
