"""A hostile gateway over a real loopback socket: slow drips, endless and cut bodies, hostile
JSON, useless Retry-After hints. Every failure must be one ImggwError, on time, with nothing
half-saved and nothing billed twice."""

from __future__ import annotations

import json
import logging
import pickle
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from imggw_client import (
    APITimeoutError,
    AsyncClient,
    Client,
    DownloadError,
    ImggwError,
    PollPolicy,
    RequestValidationError,
    RetryPolicy,
    ServerError,
    Task,
    TaskStatus,
    WaitTimeoutError,
)
from imggw_client._core import surfaces
from imggw_client._core.surfaces import MAX_REPLY_BYTES, MAX_RESULT_URLS

from ..conftest import PNG
from ..loopback import drip, http_json, raw_server

pytestmark = pytest.mark.anyio

KEY = "test-key-0123456789"
QUICK_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05)
ONCE = RetryPolicy(max_attempts=1)
RUNNING = json.dumps({"code": 200, "data": {"id": "1", "status": "processing"}}).encode()
# The same answer padded with JSON's own whitespace: dripped at 0.3 s a byte, it takes about
# 50 s, far past every deadline below, so a client that gave up before the drip ended kept its
# deadline, however loaded the machine (no wall-clock window: the order of two events).
SLOW_RUNNING = RUNNING + b" " * 100


def head(status: int = 200, **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def call(kind: str, base_url: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """One call on a fresh client of ``kind``; options for the client come as ``client_*``."""
    options = {k[7:]: kwargs.pop(k) for k in list(kwargs) if k.startswith("client_")}
    options.setdefault("retry", QUICK_RETRY)
    options.setdefault("api_key", KEY)
    if kind == "sync":
        with Client(base_url=base_url, **options) as client:
            return await anyio.to_thread.run_sync(lambda: getattr(client, method)(*args, **kwargs))
    async with AsyncClient(base_url=base_url, **options) as aclient:
        return await getattr(aclient, method)(*args, **kwargs)


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ---------------------------------------------------------------------------- deadlines


@pytest.mark.slow
async def test_a_client_goes_through_the_environments_proxy_and_keeps_its_deadline_there(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop, whole, lines = threading.Event(), threading.Event(), []

    def proxy(conn: socket.socket, n: int, request: bytes) -> None:
        lines.append(request.split(b"\r\n")[0])
        if drip(conn, head(content_type="application/json") + SLOW_RUNNING, 0.3, stop):
            whole.set()

    with raw_server(proxy) as url:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", url)
        with pytest.raises(APITimeoutError):
            await call(kind, "http://gateway.test", "get", "1", client_timeout=1, client_retry=ONCE)
        gave_up_first = not whole.is_set()
        stop.set()
    assert lines == [b"GET http://gateway.test/beta/v1/tasks/1 HTTP/1.1"]  # through the proxy
    assert gave_up_first  # its 1 s, not the drip's 50: each byte came within the read timeout


@pytest.mark.slow
async def test_a_callers_own_async_http_client_keeps_the_deadline_too() -> None:
    """An ``httpx.AsyncClient`` of the caller's has its own network layer: a cancel scope
    bounds its requests instead, headers trickling or not."""
    stop, whole = threading.Event(), threading.Event()

    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        if drip(conn, head(content_type="application/json") + SLOW_RUNNING, 0.3, stop):
            whole.set()

    with raw_server(answer) as url:
        async with httpx.AsyncClient() as http:
            client = AsyncClient(api_key=KEY, base_url=url, timeout=1, retry=ONCE, http_client=http)
            async with client:
                with pytest.raises(APITimeoutError):
                    await client.get("1")
        gave_up_first = not whole.is_set()
        stop.set()
    assert gave_up_first


@pytest.mark.parametrize("where", ["body", "headers"])
@pytest.mark.slow
async def test_a_slow_drip_cannot_hold_a_wait_past_its_deadline(kind: str, where: str) -> None:
    stop, whole = threading.Event(), threading.Event()

    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        if where == "body":
            length = str(len(SLOW_RUNNING))
            conn.sendall(head(content_type="application/json", content_length=length))
            dripped = drip(conn, SLOW_RUNNING, 0.3, stop)
        else:
            dripped = drip(conn, head(content_type="application/json") + SLOW_RUNNING, 0.3, stop)
        if dripped:
            whole.set()

    with raw_server(answer) as url:
        started = time.monotonic()
        with pytest.raises(WaitTimeoutError):
            await call(kind, url, "wait", "1", wait_timeout=1.5, client_timeout=1)
        took = time.monotonic() - started
        gave_up_first = not whole.is_set()
        stop.set()
    # The wait's 1.5 s, however slowly each byte comes: past its first request's 1 s (a lower
    # bound, which no load can break), and long before any drip ended.
    assert took >= 1.4
    assert gave_up_first


@pytest.mark.slow
async def test_a_slow_drip_download_is_bounded_by_its_timeout(kind: str, tmp_path: Path) -> None:
    stop = threading.Event()

    whole, attempts = threading.Event(), []

    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        attempts.append(n)
        conn.sendall(head(content_type="image/png", content_length=str(len(PNG))))
        if drip(conn, PNG, 0.2, stop):  # 2 KiB at 0.2 s a byte: minutes
            whole.set()

    with raw_server(answer) as url:
        task = Task(id="1", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=[f"{url}/r"])
        twice = RetryPolicy(max_attempts=2, initial_backoff=0.01)
        with pytest.raises(DownloadError):
            await call(kind, url, "download", task, tmp_path, client_timeout=1, client_retry=twice)
        gave_up_first = not whole.is_set()
        stop.set()
    # Each of the two attempts ended by its own 1 s, however slow the drip: both were made,
    # and the client gave up before any drip ended.
    assert attempts == [1, 2]
    assert gave_up_first
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- sizes


async def test_an_endless_reply_is_cut_at_the_limit(kind: str) -> None:
    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        conn.sendall(head(content_type="application/json", connection="close"))
        junk = b"[" * 65536
        for _ in range(MAX_REPLY_BYTES // len(junk) + 64):  # a little past the limit, then close
            conn.sendall(junk)

    with raw_server(answer) as url, pytest.raises(ServerError) as info:
        await call(kind, url, "get", "1")
    assert info.value.code == "response_too_large"


async def test_an_endless_result_is_refused_past_max_bytes(kind: str, tmp_path: Path) -> None:
    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        conn.sendall(head(content_type="image/png", connection="close") + PNG[:8])
        for _ in range(64):  # 4 MiB, more than max_bytes below
            conn.sendall(b"\0" * 65536)

    with raw_server(answer) as url:
        task = Task(id="7", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=[f"{url}/r"])
        with pytest.raises(DownloadError) as info:
            await call(kind, url, "download", task, tmp_path, max_bytes=1 << 20)
    assert info.value.code == "result_too_large"
    assert list(tmp_path.iterdir()) == []  # nothing half-saved


async def test_a_result_cut_by_a_dropped_connection_is_never_saved(
    kind: str, tmp_path: Path
) -> None:
    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        # Close-delimited (no Content-Length): only the image's own end can tell it is whole.
        cut = PNG if n == 3 else PNG[: len(PNG) // 2]
        conn.sendall(head(content_type="image/png", connection="close") + cut)

    with raw_server(answer) as url:
        task = Task(id="8", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=[f"{url}/r"])
        files = await call(kind, url, "download", task, tmp_path)
    assert files[0].path.read_bytes() == PNG  # two cut bodies refused, the third saved
    assert [p.name for p in tmp_path.iterdir()] == ["8-0.png"]


async def test_fifty_thousand_result_urls_are_read_fast_and_capped(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = []

    def usable(url: str) -> bool:
        checked.append(url)
        return real_usable(url)

    real_usable = surfaces._usable_url
    monkeypatch.setattr(surfaces, "_usable_url", usable)
    urls = [f"http://cdn.test/{i % 1000}.png" for i in range(50_000)]
    body = json.dumps(
        {
            "code": 200,
            "data": {"id": "1", "status": "completed", "result": {"images": [{"url": urls}]}},
        }
    ).encode()
    with raw_server(lambda conn, n, req: conn.sendall(http_json(200, body))) as url:
        task = await call(kind, url, "get", "1")
    # Fast by count: the reading stops one past the cap, never looks at the other 49,935.
    assert len(checked) == MAX_RESULT_URLS + 1
    assert len(task.image_urls) == MAX_RESULT_URLS
    assert task.image_urls[:2] == ["http://cdn.test/0.png", "http://cdn.test/1.png"]


# ---------------------------------------------------------------------------- hostile JSON


NESTED_RESULT = {"id": "1", "status": "completed", "resultJson": "[" * 100_000}


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b'{"code": 200, "data": {"id": "1", "status": "processing", "id": "2"}}'],
)
async def test_deeply_nested_or_repeated_json_is_a_clean_imggw_error(
    kind: str, body: bytes
) -> None:
    # Never a RecursionError that slips past every `except ImggwError`, nor a guess between
    # two values of one key: a malformed reply, retried, then a ServerError.
    with (
        raw_server(lambda conn, n, req: conn.sendall(http_json(200, body))) as url,
        pytest.raises(ImggwError) as info,
    ):
        await call(kind, url, "get", "1")
    assert isinstance(info.value, ServerError)
    assert info.value.code == "malformed_response"


async def test_nested_garbage_inside_a_record_gives_no_urls(kind: str) -> None:
    body = json.dumps({"code": 200, "data": NESTED_RESULT}).encode()
    with raw_server(lambda conn, n, req: conn.sendall(http_json(200, body))) as url:
        task = await call(kind, url, "get", "1")
    assert task.status is TaskStatus.SUCCEEDED
    assert task.image_urls == []


async def test_alpha_result_json_nested_too_deep_gives_no_urls(kind: str) -> None:
    record = {"taskId": "1", "state": "success", "resultJson": "[" * 100_000}
    body = json.dumps({"code": 200, "msg": "ok", "data": record}).encode()
    with raw_server(lambda conn, n, req: conn.sendall(http_json(200, body))) as url:
        task = await call(kind, url, "get", "1", client_surface="alpha")
    assert task.status is TaskStatus.SUCCEEDED
    assert task.image_urls == []


# ---------------------------------------------------------------------------- Retry-After


@pytest.mark.parametrize("hint", ["0", "-5", "Wed, 21 Oct 2015 07:28:00 GMT"])
@pytest.mark.slow
async def test_a_useless_retry_after_never_makes_a_wait_spin(kind: str, hint: str) -> None:
    body = json.dumps({"code": 503, "error": {"code": "busy", "message": "busy"}}).encode()
    busy = (
        head(503, content_type="application/json", content_length=str(len(body)), retry_after=hint)
        + body
    )
    queries: list[float] = []

    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        queries.append(time.monotonic())
        conn.sendall(busy)

    policy = RetryPolicy(max_attempts=3, initial_backoff=0.5, max_backoff=2.0)
    with raw_server(answer) as url, pytest.raises(WaitTimeoutError):
        await call(kind, url, "wait", "1", wait_timeout=3, client_retry=policy)
    # Backoff from 0.5 s doubling to 2 s: a handful of queries, never the 100+ of a spin.
    assert 2 <= len(queries) <= 12


# ---------------------------------------------------------------------------- files


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
async def test_downloads_honour_the_umask(kind: str, tmp_path: Path, umask: int, mode: int) -> None:
    import os

    with raw_server(
        lambda conn, n, req: conn.sendall(
            head(content_type="image/png", content_length=str(len(PNG))) + PNG
        )
    ) as url:
        task = Task(id="9", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=[f"{url}/r"])
        old = os.umask(umask)
        try:
            files = await call(kind, url, "download", task, tmp_path)
        finally:
            os.umask(old)
    assert stat.S_IMODE(files[0].path.stat().st_mode) == mode


async def test_a_lone_surrogate_is_refused_before_sending_even_unvalidated(kind: str) -> None:
    hits: list[int] = []
    with (
        raw_server(lambda conn, n, req: hits.append(n)) as url,
        pytest.raises(RequestValidationError) as info,
    ):
        await call(kind, url, "submit", "a \ud800 cat", validate=False)
    assert info.value.field == "prompt"
    assert hits == []


@pytest.mark.slow
async def test_a_poll_policy_is_respected_under_hostile_states(kind: str) -> None:
    # An unknown state full of escape codes is active, and is logged printable.
    body = json.dumps({"code": 200, "data": {"id": "1", "status": "\x1b]0;pwned\x07"}}).encode()
    poll = PollPolicy(initial_interval=0.05, max_interval=0.1)
    with (
        raw_server(lambda conn, n, req: conn.sendall(http_json(200, body))) as url,
        pytest.raises(WaitTimeoutError) as info,
    ):
        await call(kind, url, "wait", "1", wait_timeout=0.5, client_poll=poll)
    assert info.value.last_task is not None
    assert info.value.last_task.status is TaskStatus.RUNNING


@pytest.mark.parametrize("key", ["Zq7!x9k", "sk-echoed-abcdef0123456789"])
async def test_a_key_a_gateway_echoes_anywhere_is_never_shown_logged_or_pickled(
    kind: str, key: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short keys too (any of 4 characters or more), and outside error messages: in a status
    word, a redirect's target; and one of 8 or more in a header httpcore's DEBUG lines show."""
    caplog.set_level(logging.DEBUG)  # httpcore's lines, the response headers among them
    monkeypatch.setattr(surfaces, "_unknown_states_logged", set())  # each state said once
    refused = {"code": 401, "error": {"code": "unauthorized", "message": f"bad key {key}"}}
    state = {"code": 200, "data": {"id": "3", "status": f"Bearer {key}"}}
    answers = {
        "/beta/v1/tasks/1": http_json(401, json.dumps(refused).encode()),
        "/beta/v1/tasks/2": head(302, location=f"https://login.example/session/{key}/renew"),
        "/beta/v1/tasks/3": http_json(200, json.dumps(state).encode()).replace(
            b"\r\n\r\n", f"\r\nWWW-Authenticate: Bearer error_description={key}\r\n\r\n".encode(), 1
        ),
    }

    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        conn.sendall(answers[request.split(b" ")[1].decode()])

    errors: list[ImggwError] = []
    with raw_server(answer) as url:
        for task_id in ("1", "2"):
            with pytest.raises(ImggwError) as info:
                await call(kind, url, "get", task_id, client_api_key=key, client_retry=ONCE)
            errors.append(info.value)
        task = await call(kind, url, "get", "3", client_api_key=key, client_retry=ONCE)
    assert task.status is TaskStatus.RUNNING  # an unknown state: still active, as ever
    for err in errors:
        assert key not in str(err) + repr(err) + (err.code or "")
        assert key.encode() not in pickle.dumps(err)
    assert "[redacted]" in str(errors[0])
    assert "[redacted]" in str(errors[1])
    lines = [(record.name, record.getMessage()) for record in caplog.records]
    assert any("unknown task state" in line for _, line in lines)
    assert any("www-authenticate" in line.lower() for _, line in lines)  # the header was logged
    assert not [line for name, line in lines if name == "imggw_client" and key in line]
    if len(key) >= 8:  # other loggers' lines: a key that does not occur by chance is blanked
        assert not [line for _, line in lines if key in line]


async def test_a_gateway_that_echoes_the_key_never_gets_it_printed_and_keeps_the_result(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = "sk-echoed-0123456789abcdef"
    record = {
        "code": 200,
        "data": {
            "id": "1",
            "status": "failed",
            "error": {"code": f"bad_{key}", "message": f"the key {key} is wrong"},
            "result": {
                "images": [
                    {
                        "url": [
                            f"http://cdn.test/{key}/x.png",
                            "http://cdn.test/ok.png",
                            f"http://{key}.cdn.test/y.png",
                        ]
                    }
                ]
            },
        },
    }
    refused = {"code": 401, "error": {"code": f"no_{key}", "message": f"refused {key}"}}
    answers = [
        http_json(200, json.dumps(record).encode()),
        http_json(401, json.dumps(refused).encode()),
    ]

    def answer(conn: socket.socket, n: int, request: bytes) -> None:
        conn.sendall(answers[(n - 1) % 2])

    with raw_server(answer) as url:
        options = {"client_api_key": key}
        task = await call(kind, url, "get", "1", **options)
        with pytest.raises(ImggwError) as info:
            await call(kind, url, "get", "1", **options)
    # The link is the user's paid result: kept (reachable), said plainly, never shown.
    assert task.image_urls == [
        f"http://cdn.test/{key}/x.png",
        "http://cdn.test/ok.png",
        f"http://{key}.cdn.test/y.png",
    ]
    assert key not in repr(task) + str(task)  # its path and its host, both blanked
    assert "http://cdn.test/[redacted]/x.png" in repr(task)
    told = [r.getMessage() for r in caplog.records if "API key itself" in r.getMessage()]
    assert told == [] or all(key not in line for line in told)
    assert task.error is not None
    assert key not in task.error.code + task.error.message
    assert key not in str(info.value) + repr(info.value) + (info.value.code or "")
