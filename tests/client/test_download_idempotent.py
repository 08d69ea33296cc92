"""Downloading twice is idempotent (DESIGN 18): ``download(overwrite=False)`` onto a file
already there with the result's very bytes reports it saved (the same ``DownloadedFile``, the
file untouched); only other bytes are the ``FILE_EXISTS`` conflict. Over a real loopback
socket, through both clients."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import (
    FILE_EXISTS,
    AsyncClient,
    Client,
    DownloadedFile,
    DownloadError,
    RetryPolicy,
    Task,
    TaskStatus,
)

from ..conftest import PNG
from ..loopback import raw_server

pytestmark = pytest.mark.anyio

KEY = "test-key-0123456789"
QUICK_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05)


def image_server(body: bytes, fetched: list[int], together: threading.Barrier | None = None) -> Any:
    """Serves ``body`` with its Content-Length at any path; with ``together``, only once that
    many requests are in (so that every download has begun before any ends)."""

    def handle(conn: socket.socket, n: int, head: bytes) -> None:
        fetched.append(n)
        if together is not None:
            together.wait(timeout=10)
        conn.sendall(
            f"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )

    return raw_server(handle)


def result(url: str) -> Task:
    return Task(id="8", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=[f"{url}/r/8"])


async def download(kind: str, task: Task, folder: Path, **kwargs: Any) -> list[DownloadedFile]:
    options: dict[str, Any] = {
        "api_key": KEY,
        "base_url": "http://127.0.0.1:9",
        "retry": QUICK_RETRY,
    }
    if kind == "sync":

        def run() -> list[DownloadedFile]:
            with Client(**options) as client:
                return client.download(task, folder, **kwargs)

        return await anyio.to_thread.run_sync(run)
    async with AsyncClient(**options) as aclient:
        return await aclient.download(task, folder, **kwargs)


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def stamp(path: Path) -> tuple[int, int, int]:
    info = path.stat()
    return info.st_ino, info.st_mtime_ns, info.st_size


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_a_second_download_of_the_same_bytes_is_reported_saved(
    kind: str, tmp_path: Path
) -> None:
    fetched: list[int] = []
    with image_server(PNG, fetched) as url:
        (first,) = await download(kind, result(url), tmp_path)
        before = stamp(first.path)
        (again,) = await download(kind, result(url), tmp_path)
    assert again == first
    assert again.sha256 == hashlib.sha256(PNG).hexdigest()
    assert again.size == len(PNG)
    assert stamp(again.path) == before  # untouched: not even replaced by equal bytes
    assert names(tmp_path) == ["8-0.png"]  # no temp file left
    assert len(fetched) == 2  # read again to compare: the name alone proves nothing


@pytest.mark.parametrize(
    "there",
    [b"mine", PNG[:-1], PNG + b"\n", PNG[:100] + b"X" + PNG[101:]],
    ids=["other", "shorter", "longer", "one-byte"],
)
async def test_any_other_file_of_that_name_is_a_conflict_and_left_alone(
    kind: str, tmp_path: Path, there: bytes
) -> None:
    (tmp_path / "8-0.png").write_bytes(there)
    before = stamp(tmp_path / "8-0.png")
    fetched: list[int] = []
    with image_server(PNG, fetched) as url:
        with pytest.raises(DownloadError, match="overwrite=True") as info:
            await download(kind, result(url), tmp_path)
        assert info.value.code == FILE_EXISTS
        assert len(fetched) == 1  # a conflict is the disk's matter: never retried
        assert (tmp_path / "8-0.png").read_bytes() == there
        assert stamp(tmp_path / "8-0.png") == before
        assert names(tmp_path) == ["8-0.png"]
        (replaced,) = await download(kind, result(url), tmp_path, overwrite=True)
    assert replaced.path.read_bytes() == PNG


async def test_two_downloads_of_one_result_at_once_both_report_it_saved(
    kind: str, tmp_path: Path
) -> None:
    """Neither sees a file when it begins; the second to finish finds the first's, with the
    same bytes: saved, not a conflict."""
    fetched: list[int] = []
    together = threading.Barrier(2)
    got: list[list[DownloadedFile]] = []
    with image_server(PNG, fetched, together) as url:

        async def one() -> None:
            got.append(await download(kind, result(url), tmp_path))

        async with anyio.create_task_group() as group:
            group.start_soon(one)
            group.start_soon(one)
    assert len(fetched) == 2
    assert got[0] == got[1]
    assert got[0][0].path.read_bytes() == PNG
    assert names(tmp_path) == ["8-0.png"]


async def test_a_different_file_that_appears_during_the_download_is_a_conflict(
    kind: str, tmp_path: Path
) -> None:
    """Another writer's file, landed while the body came: never replaced, never reported as
    this result."""
    fetched: list[int] = []

    def handle(conn: socket.socket, n: int, head: bytes) -> None:
        fetched.append(n)
        (tmp_path / "8-0.png").write_bytes(b"theirs")  # after the sink began, before it ends
        conn.sendall(
            f"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {len(PNG)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + PNG
        )

    with raw_server(handle) as url, pytest.raises(DownloadError) as info:
        await download(kind, result(url), tmp_path)
    assert info.value.code == FILE_EXISTS
    assert (tmp_path / "8-0.png").read_bytes() == b"theirs"
    assert names(tmp_path) == ["8-0.png"]


async def test_a_second_download_over_one_that_was_replaced_by_the_same_bytes_elsewhere(
    kind: str, tmp_path: Path
) -> None:
    """The bytes decide, not the file's history: a copy made by hand is this result saved."""
    (tmp_path / "8-0.png").write_bytes(PNG)
    os.chmod(tmp_path / "8-0.png", 0o444)  # read-only: nothing needs to write it
    fetched: list[int] = []
    with image_server(PNG, fetched) as url:
        (saved,) = await download(kind, result(url), tmp_path)
    assert saved.path == tmp_path / "8-0.png"
    assert saved.sha256 == hashlib.sha256(PNG).hexdigest()
