"""``read`` and ``open``: a result in memory (or a temporary file), verified and link-refreshed
exactly as ``download`` is, over a real loopback socket: the reference gateway's signed,
expiring links, and a hostile server's cut, oversized and mislabelled bodies."""

from __future__ import annotations

import hashlib
import json
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import (
    AsyncClient,
    Client,
    DownloadError,
    PollPolicy,
    RequestValidationError,
    ResultExpiredError,
    RetryPolicy,
    Task,
    TaskStatus,
)
from imggw_client._download import HELD_IN_MEMORY
from imggw_client.mock import MockGateway

from ..conftest import PNG
from ..loopback import raw_server

KEY = "test-key"
FAST = PollPolicy(initial_interval=0.02, max_interval=0.05)
QUICK_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05)
RESULTS = "GET /results/{token}"
QUERY = "GET /beta/v1/tasks/{id}"


pytestmark = [
    pytest.mark.anyio,
    pytest.mark.gateway(
        api_keys=[KEY], duration_min=0, duration_max=0, manual_clock=True, link_ttl=60
    ),
]


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def call(kind: str, url: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """``method(*args, **kwargs)`` on a fresh client of ``kind``: ``read``, or ``open`` whose
    stream is read whole inside the block (then ``(bytes, stream)``)."""
    options = {"api_key": KEY, "base_url": url, "poll": FAST, "retry": QUICK_RETRY}
    if kind == "sync":
        with Client(**options) as client:
            if method == "open":

                def opened() -> tuple[bytes, Any]:
                    with client.open(*args, **kwargs) as stream:
                        return stream.read(), stream

                return await anyio.to_thread.run_sync(opened)
            return await anyio.to_thread.run_sync(lambda: client.read(*args, **kwargs))
    async with AsyncClient(**options) as aclient:
        if method == "open":
            async with aclient.open(*args, **kwargs) as stream:
                return stream.read(), stream
        return await aclient.read(*args, **kwargs)


def done(url: str, *more: str, task_id: str = "1") -> Task:
    return Task(id=task_id, surface="beta", status=TaskStatus.SUCCEEDED, image_urls=[url, *more])


def head(status: int = 200, **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def served(answers: Callable[[int, bytes], bytes]) -> Callable[[socket.socket, int, bytes], None]:
    def handle(conn: socket.socket, n: int, request: bytes) -> None:
        conn.sendall(answers(n, request))

    return handle


# ---------------------------------------------------------------------------- the gateway


def finished_task(gateway: MockGateway, url: str) -> Task:
    with Client(api_key=KEY, base_url=url, poll=FAST) as client:
        return client.generate("a fox")


@pytest.mark.parametrize("method", ["read", "open"])
async def test_the_result_is_the_downloads_very_bytes_and_nothing_is_written(
    kind: str,
    method: str,
    gateway: MockGateway,
    shared_gateway_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task = finished_task(gateway, shared_gateway_url)
    with Client(api_key=KEY, base_url=shared_gateway_url) as client:
        saved = client.download(task, tmp_path / "saved")[0]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    got = await call(kind, shared_gateway_url, method, task)
    data = got[0] if method == "open" else got
    assert hashlib.sha256(data).hexdigest() == saved.sha256
    assert data.startswith(b"\x89PNG")
    assert list((tmp_path / "tmp").iterdir()) == []  # held in memory, nothing left behind
    if method == "open":
        assert not got[1]._rolled  # never out of memory
        assert got[1].closed  # the block's end closed it


@pytest.mark.parametrize("method", ["read", "open"])
async def test_a_dead_link_is_asked_for_again_and_the_fresh_one_read(
    kind: str, method: str, gateway: MockGateway, shared_gateway_url: str
) -> None:
    task = finished_task(gateway, shared_gateway_url)
    gateway.advance(120)  # its link has expired (403), the result is still kept
    before = gateway.stats()["requests"]
    got = await call(kind, shared_gateway_url, method, task)
    data = got[0] if method == "open" else got
    assert data.startswith(b"\x89PNG")
    after = gateway.stats()["requests"]
    assert after[QUERY] - before[QUERY] == 1  # one more query for a fresh link
    assert after[RESULTS] - before.get(RESULTS, 0) == 2  # the dead link, then the fresh one


async def test_a_result_gone_from_the_gateway_is_expired(
    kind: str, gateway: MockGateway, shared_gateway_url: str
) -> None:
    task = finished_task(gateway, shared_gateway_url)
    gateway.advance(gateway.config.retention + 1)
    with pytest.raises(ResultExpiredError):
        await call(kind, shared_gateway_url, "read", task)


# On real time, its links as long-lived as its results: the module's clock and link_ttl undone.
@pytest.mark.gateway(manual_clock=False, link_ttl=None, result_size=HELD_IN_MEMORY + 1)
async def test_a_large_result_is_held_in_a_temporary_file_deleted_with_the_block(
    kind: str,
    gateway: MockGateway,
    shared_gateway_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task = finished_task(gateway, shared_gateway_url)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data, stream = await call(kind, shared_gateway_url, "open", task)
    assert len(data) >= HELD_IN_MEMORY + 1
    assert stream._rolled  # out of memory while it was open
    assert stream.closed
    assert list(tmp_path.iterdir()) == []  # an anonymous file: nothing to clean up


# ---------------------------------------------------------------------------- hostile links


async def test_a_body_cut_short_of_its_length_is_fetched_again_then_read_whole(kind: str) -> None:
    def answer(n: int, request: bytes) -> bytes:
        body = PNG if n == 2 else PNG[:100]
        return (
            head(content_type="image/png", content_length=str(len(PNG)), connection="close") + body
        )

    with raw_server(served(answer)) as url:
        assert await call(kind, url, "read", done(f"{url}/r.png")) == PNG


async def test_an_image_cut_without_a_declared_length_is_never_handed_out(kind: str) -> None:
    def answer(n: int, request: bytes) -> bytes:  # close-delimited: only the PNG's end tells
        return head(content_type="image/png", connection="close") + PNG[: len(PNG) // 2]

    with raw_server(served(answer)) as url, pytest.raises(DownloadError):
        await call(kind, url, "open", done(f"{url}/r.png"))


async def test_a_result_past_max_bytes_is_refused(kind: str) -> None:
    def answer(n: int, request: bytes) -> bytes:
        return head(content_type="image/png", content_length=str(len(PNG))) + PNG

    with raw_server(served(answer)) as url, pytest.raises(DownloadError) as info:
        await call(kind, url, "read", done(f"{url}/r.png"), max_bytes=1000)
    assert info.value.code == "result_too_large"


async def test_an_error_page_served_as_the_result_is_not_an_image(kind: str) -> None:
    page = b"<html>sign in</html>"

    def answer(n: int, request: bytes) -> bytes:
        return head(content_type="text/html", content_length=str(len(page))) + page

    with raw_server(served(answer)) as url, pytest.raises(DownloadError) as info:
        await call(kind, url, "read", done(f"{url}/r.png"))
    assert info.value.code == "not_an_image"


async def test_the_index_picks_the_result_and_the_key_never_goes_to_a_link(kind: str) -> None:
    heads: list[bytes] = []
    other = PNG[:8] + b"another image" * 40 + PNG[-12:]

    def answer(n: int, request: bytes) -> bytes:
        heads.append(request)
        body = other if b"/second" in request.split(b"\r\n")[0] else PNG
        return head(content_type="image/png", content_length=str(len(body))) + body

    with raw_server(served(answer)) as url:
        task = done(f"{url}/first", f"{url}/second")
        assert await call(kind, url, "read", task, 1) == other
        assert await call(kind, url, "read", task) == PNG
    assert [h.split(b" ")[1] for h in heads] == [b"/second", b"/first"]
    assert all(b"authorization" not in h.lower() for h in heads)
    assert all(KEY.encode() not in h for h in heads)


@pytest.mark.parametrize("index", [2, -1, "0", True])
async def test_an_index_that_names_no_result_is_refused_before_anything_is_sent(
    kind: str, index: Any
) -> None:
    with raw_server(served(lambda n, request: b"")) as url:
        with pytest.raises(RequestValidationError) as info:
            await call(kind, url, "read", done(f"{url}/a", f"{url}/b"), index)
        assert info.value.field == "index"


async def test_only_a_succeeded_task_can_be_read(kind: str) -> None:
    running = Task(id="1", surface="beta", status=TaskStatus.RUNNING)
    with pytest.raises(DownloadError):
        await call(kind, "http://127.0.0.1:9", "read", running)
    with pytest.raises(RequestValidationError):
        await call(kind, "http://127.0.0.1:9", "open", json.dumps({"id": "1"}))
