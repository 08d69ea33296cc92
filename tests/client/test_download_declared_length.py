"""Images are judged by their declared length (DESIGN 18): a body that meets its
``Content-Length`` is whole, even with bytes after the PNG IEND or JPEG EOI marker; the
end-marker check is for bodies without one (chunked, close-delimited); a body short of its
``Content-Length`` is never saved. Over a real loopback socket: a stdlib gateway answers the
task query with a result link and serves the image itself."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import AsyncClient, Client, DownloadError, RetryPolicy, Task

from ..conftest import PNG
from ..loopback import raw_server

pytestmark = pytest.mark.anyio

KEY = "test-key-0123456789"
QUICK_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05)
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(256)) * 4 + b"\xff\xd9"
TRAILERS = [b"\n", b"\r\n", b"\0" * 64, b"padding after the end marker" * 40]

Serve = Callable[[socket.socket], None]


def with_length(body: bytes, declared: int | None = None) -> Serve:
    def serve(conn: socket.socket) -> None:
        size = len(body) if declared is None else declared
        conn.sendall(
            f"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {size}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )

    return serve


def chunked(body: bytes) -> Serve:
    def serve(conn: socket.socket) -> None:
        out = b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nTransfer-Encoding: chunked\r\n"
        out += b"Connection: close\r\n\r\n"
        for i in range(0, len(body), 700):
            part = body[i : i + 700]
            out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
        conn.sendall(out + b"0\r\n\r\n")

    return serve


# Not the shared family (tests/gateways.py): it answers with crafted bytes (lengths that lie).
def gateway(result: Serve, served: list[str]) -> Any:
    """Answers ``GET /beta/v1/tasks/8`` with a succeeded task whose one result link is
    ``/r/8``, and serves that link with ``result``."""

    def handle(conn: socket.socket, n: int, head: bytes) -> None:
        line = head.split(b"\r\n")[0].decode()
        served.append(line)
        host = next(h for h in head.decode().split("\r\n") if h.lower().startswith("host:"))
        if line.startswith("GET /r/8 "):
            result(conn)
            return
        url = f"http://{host.split(':', 1)[1].strip()}/r/8"
        data = {"id": "8", "status": "completed", "result": {"images": [{"url": [url]}]}}
        body = json.dumps({"code": 200, "data": data}).encode()
        conn.sendall(
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
            "\r\nConnection: close\r\n\r\n".encode()
            + body
        )

    return raw_server(handle)


async def get_and_download(kind: str, base_url: str, folder: Path) -> Any:
    options: dict[str, Any] = {"api_key": KEY, "base_url": base_url, "retry": QUICK_RETRY}
    if kind == "sync":

        def run() -> Any:
            with Client(**options) as client:
                return client.download(client.get("8"), folder)

        return await anyio.to_thread.run_sync(run)
    async with AsyncClient(**options) as aclient:
        task: Task = await aclient.get("8")
        return await aclient.download(task, folder)


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("image", [PNG, JPEG], ids=["png", "jpeg"])
@pytest.mark.parametrize("trailer", TRAILERS, ids=["newline", "crlf", "zeros", "text"])
async def test_an_image_that_meets_its_content_length_is_saved_whatever_follows_its_end(
    kind: str, tmp_path: Path, image: bytes, trailer: bytes
) -> None:
    body = image + trailer
    served: list[str] = []
    with gateway(with_length(body), served) as url:
        (saved,) = await get_and_download(kind, url, tmp_path)
    assert saved.path.read_bytes() == body
    assert saved.sha256 == hashlib.sha256(body).hexdigest()
    assert hashlib.sha256(saved.path.read_bytes()).hexdigest() == saved.sha256
    assert saved.size == len(body)
    assert saved.path.suffix == (".png" if image is PNG else ".jpg")
    assert served.count("GET /r/8 HTTP/1.1") == 1  # whole at once: never fetched again
    assert sorted(p.name for p in tmp_path.iterdir()) == [saved.path.name]


@pytest.mark.parametrize("image", [PNG, JPEG], ids=["png", "jpeg"])
async def test_a_chunked_image_without_its_end_marker_is_still_refused(
    kind: str, tmp_path: Path, image: bytes
) -> None:
    served: list[str] = []
    with gateway(chunked(image[:-40]), served) as url, pytest.raises(DownloadError, match="cut"):
        await get_and_download(kind, url, tmp_path)
    assert served.count("GET /r/8 HTTP/1.1") == QUICK_RETRY.max_attempts
    assert list(tmp_path.iterdir()) == []  # nothing saved, no temp file left


async def test_a_chunked_whole_image_is_saved(kind: str, tmp_path: Path) -> None:
    served: list[str] = []
    with gateway(chunked(PNG), served) as url:
        (saved,) = await get_and_download(kind, url, tmp_path)
    assert saved.path.read_bytes() == PNG


@pytest.mark.parametrize("trailer", [b"", b"\n"], ids=["bare", "trailing"])
async def test_a_body_short_of_its_content_length_is_never_saved(
    kind: str, tmp_path: Path, trailer: bytes
) -> None:
    """Even when the bytes that came end with the image's own end marker: the length says
    more was due."""
    body = PNG + trailer
    served: list[str] = []
    short = with_length(body, declared=len(body) + 100)
    with gateway(short, served) as url, pytest.raises(DownloadError):
        await get_and_download(kind, url, tmp_path)
    assert served.count("GET /r/8 HTTP/1.1") == QUICK_RETRY.max_attempts
    assert list(tmp_path.iterdir()) == []
